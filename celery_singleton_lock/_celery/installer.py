"""``install(app, tasks=...)``: the locking of :class:`LockedTask` for tasks of other classes
(each listed task's class is swapped at finalization for a subclass with ``LockedTask`` in front:
a signal receiver cannot stop a run), and the publish-time lock for messages that bypass
``apply_async`` (``send_task``, beat), taken by a ``before_task_publish`` receiver. That one
cannot stop a send (Celery swallows receiver errors): a duplicate is left to the worker's check.
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections.abc import Mapping
from typing import Any

from celery import signals

from . import wiring
from .config import LockConfig, peek
from .hold import HEADER
from .options import validate_options
from .task import LockedTask

log = logging.getLogger("celery_singleton_lock.install")

#: the installed apps, and each one's {task name: options}; an app that is gone is forgotten
_configs: weakref.WeakKeyDictionary[Any, dict[str, dict[str, Any]]] = weakref.WeakKeyDictionary()
#: app -> {task name: a LockedTask standing in for a task this process does not register}
_stand_ins: weakref.WeakKeyDictionary[Any, dict[str, Any]] = weakref.WeakKeyDictionary()
_lock = threading.Lock()


def install(app: Any, tasks: Mapping[str, Mapping[str, Any]] | None = None) -> None:
    """Connect the signal hooks for ``app`` (idempotent) and lock the tasks named in
    ``tasks`` (merged with the ``singleton_lock_tasks`` setting): ``{task name: options}``,
    the options being those of :class:`LockedTask`. Call it once where the app is defined.

    Raises ``TypeError`` or ``ValueError`` for a malformed entry or a wrong option."""
    configured = peek(app, "singleton_lock_tasks")
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
        first = app not in _configs
        _configs.setdefault(app, {}).update(merged)
    wiring.connect()
    signals.before_task_publish.connect(
        _before_publish, weak=False, dispatch_uid="celery_singleton_lock.before_task_publish"
    )
    signals.worker_init.connect(
        _on_worker_init, weak=False, dispatch_uid="celery_singleton_lock.install.worker_init"
    )
    if first:
        # sender is the app: no closure keeps it alive
        app.on_after_finalize.connect(_lock_tasks, weak=False)
    if app.finalized:
        _lock_tasks(app)


def _on_worker_init(sender: Any = None, **kwargs: Any) -> None:
    for app in list(_configs):
        _lock_tasks(app)


def _lock_tasks(sender: Any, **_: Any) -> None:  # the app's on_after_finalize receiver
    for name, options in _configs.get(sender, {}).items():
        task = sender.tasks.get(name)
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


def _task_for(name: str, reply_to: Any = None) -> Any:
    """The task (or a stand-in) for a task name that the installed app publishing it locks:
    found by the ``reply_to`` Celery sets to its ``thread_oid`` (the signal names no app, and
    with several apps, which all register shared tasks, one app's message must not be locked in
    another's Redis). A publisher not installed (or with its own ``reply_to``) is left to the
    worker's run-time check."""
    apps = [app for app in _configs if not reply_to or reply_to in (app.thread_oid, app.oid)]
    for app in apps:
        options = _configs.get(app, {}).get(name)
        if options is not None and not app.finalized and app.autofinalize:
            # A lazy app whose task proxy is first used (task.delay() at the end of a module) is
            # finalized as Celery does for app.tasks, which locks its tasks (on_after_finalize)
            # from this publish on, keyed by their own signature as the worker does. (An app
            # its owner finalizes gets a stand-in until then.)
            app.finalize(auto=True)
        task = app.tasks.get(name) if app.finalized else None  # or one with the base class
        if options is not None and task is not None and not isinstance(task, LockedTask):
            _lock_tasks(app)  # a task defined after finalization is locked at its first publish
        if isinstance(task, LockedTask):
            return task
        if options is None:
            continue
        stand_ins = _stand_ins.setdefault(app, {})
        if name not in stand_ins:
            # a LockedTask with the configured options for a task this process only knows by
            # name: Task.run's (*args, **kwargs) is not the task's, binding to it would name
            # every call's lock after "args" and "kwargs", so it binds no signature
            attrs = {**options, "name": name, "_singleton_lock_stand_in": True}
            cls: type[LockedTask] = type(name.rsplit(".", 1)[-1], (LockedTask,), attrs)
            cls.locking.signature = cls.locking.positional = None
            stand_ins[name] = cls()
            stand_ins[name].bind(app)
        return stand_ins[name]
    return None


#: the stand-ins that said once that they leave a call's lock to the worker
_told: weakref.WeakSet[Any] = weakref.WeakSet()


def _before_publish(
    sender: Any = None, body: Any = None, headers: Any = None, **kwargs: Any
) -> None:
    if not isinstance(headers, dict) or HEADER in headers or not _configs:
        return
    properties = kwargs.get("properties")
    reply_to = properties.get("reply_to") if isinstance(properties, dict) else None
    task = _task_for(headers.get("task") or sender, reply_to)
    if task is None or not task.locking.mode.at_publish or headers.get("retries"):
        return
    try:
        args, kw = body[0], body[1]
    except (TypeError, IndexError, KeyError):
        return
    task_id = headers.get("id")
    options = task.locking.options
    unique_on = options.lock_unique_on
    if (
        getattr(task, "_singleton_lock_stand_in", False)
        and options.lock_key is None
        and not (
            isinstance(kw, Mapping) and unique_on is not None and all(n in kw for n in unique_on)
        )
    ):
        # A stand-in names a call's lock as the worker does (which binds the arguments to the
        # task's unknown parameters) only with lock_key, or lock_unique_on all given by
        # keyword. A lock under another name than the worker's would refuse another job's
        # call and miss a duplicate: without a lock in its headers, the worker checks it.
        if task in _told:
            log.debug("%s[%s] sent by name: its lock is left to the worker", task.name, task_id)
            return
        _told.add(task)
        log.warning(
            "%s[%s] is sent by name from a process that does not import the task: its lock is "
            "named after the arguments bound to the task's parameters, which are not known here, "
            "so no lock is taken at publish and the worker checks the call as it starts (a "
            "duplicate of a job that is queued or running is skipped there). For the lock at "
            "publish, import the task's module in this process, pass lock_unique_on's arguments "
            "by keyword, or give the task a lock_key",
            task.name,
            task_id,
        )
        return
    if isinstance(task_id, str):
        task.locking.mode.take_for_message(task, task_id, args, kw, headers)


def _lock_configured_tasks(app: Any, what: str) -> None:
    """At the start of a worker or beat whose app uses the package (a :class:`LockedTask` bound
    to it connects this): lock the ``singleton_lock_tasks`` setting's tasks, even where the app
    module never calls :func:`install`."""
    tasks = LockConfig.of(app).tasks
    if not tasks or app in _configs:
        return
    install(app)
    publish_mode = sorted(n for n, o in tasks.items() if o.get("lock_at", "run") != "run")
    if publish_mode:
        log.warning(
            "singleton_lock_tasks: locking %s in this %s, but the app module does not call "
            "install(app): a process that publishes %s without it sends duplicates, which are "
            "skipped here only while the job they duplicate still runs (one that arrives after "
            "it ended runs again) instead of kept out at publish; call install(app) where the "
            "app is defined",
            ", ".join(sorted(tasks)),
            what,
            ", ".join(publish_mode),
        )


# run by every worker's or beat's start check, connected only by a use of the package
wiring.START_HOOKS.append(_lock_configured_tasks)
