"""celery-singleton's ``generate_lock``: the lock name of a call."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from celery import current_app

from ... import LockedTask
from .._shared import lock_name

__all__ = ["generate_lock"]


def generate_lock(
    task_name: str,
    task_args: Sequence[Any] | None = None,
    task_kwargs: Mapping[str, Any] | None = None,
    key_prefix: str | None = None,
    *,
    app: Any = None,
) -> str:
    """The lock name that ``task_name``, a locked task of ``app`` (default: the current app),
    gives these arguments. A name, not a Redis key: ``key_prefix`` is not part of it (pass the
    name to ``get_existing_task_id`` or ``unlock``)."""
    task = (app or current_app).tasks[task_name]  # NotRegistered (a KeyError) when unknown
    if not isinstance(task, LockedTask):
        raise TypeError(f"task {task_name!r} is not a locked task: it has no lock name")
    return lock_name(task, task_args, task_kwargs)
