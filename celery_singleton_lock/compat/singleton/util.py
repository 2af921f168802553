"""celery-singleton's ``generate_lock``: the lock name of a call."""

from __future__ import annotations

import hashlib
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
    """The lock name (not a Redis key: ``key_prefix`` is ignored) of ``task_name`` called with
    these arguments: its own lock's when ``app`` (default: the current app) registers it as a
    locked task, else celery-singleton's (:func:`peer_name`)."""
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
    """celery-singleton's name of a call of a task no app here registers: the md5 of the task
    name and the arguments as given, as JSON (sorted keys, ``json_encoder_class``)."""
    args = json.dumps(list(task_args or ()), sort_keys=True, cls=json_encoder_class)
    kwargs = json.dumps(dict(task_kwargs or {}), sort_keys=True, cls=json_encoder_class)
    return hashlib.md5((task_name + args + kwargs).encode(), usedforsecurity=False).hexdigest()
