"""celery-singleton's ``generate_lock``: the lock name of a call."""

from __future__ import annotations

import hashlib
import inspect
import json
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
    json_encoder_class: type[json.JSONEncoder] | None = None,
    *,
    app: Any = None,
) -> str:
    """The lock name of ``task_name`` called with these arguments: the name its own lock
    takes when ``app`` (default: the current app) registers it as a locked task, else the
    arguments as celery-singleton hashes them (:func:`peer_name`). A name, not a Redis key:
    ``key_prefix`` is not part of it (pass the name to ``get_existing_task_id`` or
    ``unlock``)."""
    task = (app or current_app).tasks.get(task_name)
    if isinstance(task, LockedTask):
        return lock_name(task, task_args, task_kwargs)
    return peer_name(task_name, task_args, task_kwargs, json_encoder_class)


def peer_name(
    task_name: str,
    task_args: Sequence[Any] | None,
    task_kwargs: Mapping[str, Any] | None,
    json_encoder_class: type[json.JSONEncoder] | None = None,
) -> str:
    """The name of a call of a task no app here registers, as celery-singleton makes it: the
    md5 of the task name and the arguments as JSON (sorted keys, ``json_encoder_class``), as
    given (no task signature to bind them to). Code written for celery-singleton names locks of
    any task name it likes, and reads them back the same way."""
    args = json.dumps(list(task_args or ()), sort_keys=True, cls=json_encoder_class)
    kwargs = json.dumps(dict(task_kwargs or {}), sort_keys=True, cls=json_encoder_class)
    return hashlib.md5((task_name + args + kwargs).encode(), usedforsecurity=False).hexdigest()


def unique_arguments(
    task: Any, args: Sequence[Any] | None, kwargs: Mapping[str, Any] | None
) -> tuple[Sequence[Any] | None, Mapping[str, Any] | None]:
    """What of a call celery-singleton's ``generate_lock`` hashes for ``task``: with
    ``unique_on``, only those arguments (bound to the task's parameters, defaults applied), by
    name; otherwise the arguments as given."""
    unique_on = task.locking.options.lock_unique_on
    if unique_on is None:
        return args, kwargs
    if not unique_on:
        return [], {}
    bound = inspect.signature(task.run).bind(*(args or ()), **(kwargs or {}))
    bound.apply_defaults()
    return [], {name: bound.arguments[name] for name in unique_on}
