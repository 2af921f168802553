"""celery-singleton's ``generate_lock``: the lock name of a call."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from celery import current_app

from ..._celery.taskkey import task_lock_name

__all__ = ["generate_lock"]


def generate_lock(
    task_name: str,
    task_args: Sequence[Any] | None = None,
    task_kwargs: Mapping[str, Any] | None = None,
    key_prefix: str | None = None,
) -> str:
    """The lock name of ``task_name`` called with these arguments: the name the task's own
    ``generate_lock`` gives when the current app registers it (its signature and
    ``unique_on`` applied), else the name of the arguments as given.

    Unlike celery-singleton's, this is the lock's *name*, not a Redis key, and
    ``key_prefix`` is not part of it (the prefix is ``singleton_lock_prefix``, applied by
    every method that takes a name): pass it to ``get_existing_task_id`` or ``unlock``."""
    del key_prefix  # accepted for compatibility; the prefix is not part of a name
    task = current_app.tasks.get(task_name)
    locking = getattr(task, "locking", None)
    if locking is not None:
        name: str = locking.lock_name(task_name, task_args, task_kwargs)
        return name
    return task_lock_name(task_name, None, task_args, task_kwargs)
