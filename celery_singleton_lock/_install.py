"""``install(app, tasks=...)``: the same locking for tasks that do not use the base class,
and the publish paths that bypass ``apply_async`` (``send_task`` by name, beat).

A listed task's class is swapped, at app finalization, for a subclass that puts
:class:`LockedTask` in front of its own class, so it gets every option of the base class (the
run-time lock has to wrap the body: a signal receiver cannot stop a run). A
``before_task_publish`` receiver takes the publish-time lock for messages that did not come
through ``apply_async``; it cannot stop a duplicate from being sent (Celery swallows receiver
errors), so such a duplicate is skipped by the worker's run-time check instead.
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections.abc import Mapping
from typing import Any

from celery import signals

from . import _backend
from ._errors import LockBackendError
from ._keys import LockKeys
from ._options import validate_options
from ._owner import new_request_id
from ._settings import setting
from ._task import HEADER, LockedTask, _info, _seconds_until

__all__ = ["install"]

log = logging.getLogger("celery_singleton_lock.install")

_apps: weakref.WeakSet[Any] = weakref.WeakSet()
_configs: dict[int, dict[str, dict[str, Any]]] = {}
_lock = threading.Lock()


def install(app: Any, tasks: Mapping[str, Mapping[str, Any]] | None = None) -> None:
    """Connect the signal hooks for ``app`` (idempotent) and lock the tasks named in
    ``tasks`` (merged with the ``singleton_lock_tasks`` setting): ``{task name: options}``,
    the options being those of :class:`LockedTask`. Call it once where the app is defined."""
    configured = setting(app, "singleton_lock_tasks") or {}
    merged: dict[str, dict[str, Any]] = {}
    for source, where in ((configured, "singleton_lock_tasks"), (tasks or {}, "tasks")):
        if not isinstance(source, Mapping):
            raise TypeError(f"{where} must be a dict of {{task name: options}}, got {source!r}")
        for name, options in source.items():
            if not isinstance(name, str) or not isinstance(options, Mapping):
                raise TypeError(
                    f"{where}: each entry must be 'task name': {{options}}, got {name!r}: "
                    f"{options!r}"
                )
            validate_options(name, options)  # fail now, not at the first run
            merged[name] = dict(options)
    with _lock:
        config = _configs.setdefault(id(app), {})
        config.update(merged)
        first = app not in _apps
        _apps.add(app)
    if first:
        app.on_after_finalize.connect(lambda sender=None, **kw: _lock_tasks(app), weak=False)
        signals.worker_init.connect(lambda sender=None, **kw: _lock_tasks(app), weak=False)
    if app.finalized:
        _lock_tasks(app)


def _lock_tasks(app: Any) -> None:
    for name, options in _configs.get(id(app), {}).items():
        task = app.tasks.get(name)
        if task is None:
            continue  # registered elsewhere: the publish receiver still knows its options
        cls = type(task)
        if getattr(cls, "_singleton_lock_installed", None) == name:
            continue
        attrs: dict[str, Any] = dict(options)
        attrs["__module__"] = cls.__module__
        attrs["__qualname__"] = cls.__qualname__
        attrs["_singleton_lock_installed"] = name
        attrs["name"] = name
        bases = (cls,) if issubclass(cls, LockedTask) else (LockedTask, cls)
        task.__class__ = type(cls.__name__, bases, attrs)
        log.debug("locking task %s with %s", name, options)


def _publishing_apps(reply_to: Any) -> list[Any]:
    """The installed app that publishes in this thread. Celery sets a message's ``reply_to``
    to the publishing app's ``thread_oid``; the signal says nothing else about the app, and
    with several apps in a process (Celery registers shared tasks in every one) a message of
    one app must not be locked in another app's Redis. A publisher that is not installed (or
    that set its own ``reply_to``) is left to the worker's run-time check."""
    apps = list(_apps)
    if not reply_to:
        return apps
    return [app for app in apps if reply_to in (app.thread_oid, app.oid)]


def _task_for(name: str, reply_to: Any = None) -> tuple[Any, Any] | None:
    """(app, task) for a task name that the installed app publishing it locks."""
    for app in _publishing_apps(reply_to):
        task = app.tasks.get(name) if app.finalized else None
        if isinstance(task, LockedTask):
            return app, task
        options = _configs.get(id(app), {}).get(name)
        if options is not None:
            stand_in = _stand_ins.get((id(app), name))
            if stand_in is None:
                # The task is not registered in this process (a publisher that only knows its
                # name): a LockedTask with the configured options computes its key.
                cls = type(name.rsplit(".", 1)[-1], (LockedTask,), {**options, "name": name})
                stand_in = _stand_ins[(id(app), name)] = cls()
                stand_in.bind(app)
            return app, stand_in
    return None


_stand_ins: dict[tuple[int, str], Any] = {}


def _before_publish(
    sender: Any = None, body: Any = None, headers: Any = None, **kwargs: Any
) -> None:
    if not isinstance(headers, dict) or HEADER in headers or not _apps:
        return
    properties = kwargs.get("properties")
    reply_to = properties.get("reply_to") if isinstance(properties, dict) else None
    found = _task_for(headers.get("task") or sender, reply_to)
    if found is None:
        return
    task = found[1]
    if task._lock_options.lock_at != "publish" or headers.get("retries"):
        return
    try:
        args, kw = body[0], body[1]
    except (TypeError, IndexError, KeyError):
        return
    task_id = headers.get("id")
    if not isinstance(task_id, str):
        return
    try:
        keys: LockKeys = task._keys_for(args, kw)
        expires = _seconds_until(headers.get("expires"))
        lease = max(expires, 1.0) if expires is not None else task._queue_ttl()
        reply = _backend.acquire(
            task._client(),
            keys,
            task_id,
            round(lease * 1000),
            new_request_id(),
            _info(task.name, task_id, "queued"),
        )
    except (LockBackendError, TypeError) as exc:
        log.error("could not take the publish lock of %s[%s]: %s", task.name, task_id, exc)
        return
    if reply.acquired:
        headers[HEADER] = keys.name
    else:
        log.warning(
            "%s[%s] was published by name (send_task or beat) while task %s holds %s; it "
            "cannot be stopped at publish, the worker will skip it",
            task.name,
            task_id,
            reply.holder,
            keys.lock,
        )


signals.before_task_publish.connect(
    _before_publish, weak=False, dispatch_uid="celery_singleton_lock.publish"
)
