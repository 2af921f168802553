"""Every Celery signal receiver of the package, connected in one place, by the uses that need
them: a :class:`LockedTask` bound to an app and :func:`install` call :func:`connect`. Nothing
else connects any: importing the package does not, nor does the ``celery`` command's ``locks``
entry point (which Celery imports for every ``celery ...`` run, so a worker or beat of an app
that never uses the package is not changed by it being installed). Each receiver has a
``dispatch_uid``: connecting again changes nothing.

At the start of a worker or beat whose app uses the package, the settings are read again and
checked (a wrong value or a misspelt name stops it with the reason, before any job depends on
it), the ``singleton_lock_tasks`` setting's tasks are locked when nothing called
:func:`install`, and the metrics are served when ``singleton_lock_metrics_port`` is set.
"""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Callable
from typing import Any

from celery import signals
from celery.app import app_or_default

from .canvas import note_chord_member
from .config import LockConfig, reload_settings
from .worker import on_task_rejected, on_task_revoked, on_task_unknown

__all__ = ["START_HOOKS", "connect", "django_check", "on_start"]

log = logging.getLogger("celery_singleton_lock.startup")

#: ``hook(app, what)`` called at a worker's or beat's start once its settings are checked
#: (``install`` adds the one that locks ``singleton_lock_tasks``: it imports this module, so
#: this one cannot import it)
START_HOOKS: list[Callable[[Any, str], None]] = []

_connected = threading.Event()
_connecting = threading.Lock()


def on_start(sender: Any = None, **_: Any) -> None:
    """``worker_init`` / ``beat_init``: the settings this process runs with are those of its
    start, read again now and checked; then the ``singleton_lock_tasks`` setting's tasks are
    locked (when the app module did not call :func:`install`)."""
    app = getattr(sender, "app", None)
    if app is None:
        return
    what = "beat" if type(sender).__name__ == "Service" else "worker"
    reload_settings(app)
    config = LockConfig.of(app)
    try:
        config.check()
    except (TypeError, ValueError) as exc:
        # Said once: in the log (before a worker's logging is set up, Python's last-resort
        # handler writes it to stderr); the exit carries no message, which Python would print
        # a second time. Celery logs and swallows a receiver's Exception; SystemExit ends the
        # process, as Celery's own configuration errors do.
        log.critical("the %s cannot start: %s", what, exc)
        raise SystemExit(1) from exc
    for hook in list(START_HOOKS):
        hook(app, what)
    if what == "worker":
        _serve_metrics(app, 0)


def _on_worker_process_init(**_: Any) -> None:
    from billiard.process import current_process

    _serve_metrics(app_or_default(), (getattr(current_process(), "index", 0) or 0) + 1)


def _serve_metrics(app: Any, offset: int) -> None:
    """Serve the metrics from this worker process when ``singleton_lock_metrics_port`` is set:
    the main process on the port, pool process *i* (billiard's index + 1) on port + *i*."""
    config = LockConfig.of(app)
    if config.metrics_port is None:
        return
    port = config.metrics_port + offset
    try:
        from .. import metrics

        metrics.serve(port, config.metrics_address)
    except (ImportError, OSError) as exc:
        from .._errors import install_hint

        log.error(
            "cannot serve the lock metrics on %s:%d: %s (singleton_lock_metrics_port is set; "
            "%s; or pick a free port)",
            config.metrics_address,
            port,
            exc,
            install_hint("prometheus"),
        )


def _write_counts(sender: Any = None, **_: Any) -> None:
    """``worker_process_shutdown`` / ``worker_shutdown``: the app's recent counts written now
    (its counter's thread would be killed with the process)."""
    app = getattr(sender, "app", None) or app_or_default()
    counter = LockConfig.of(app).counter_if_made
    if counter is not None:
        counter.flush()  # nothing pending: no round trip


def connect() -> None:
    """Connect the receivers a locked task needs (idempotent)."""
    if _connected.is_set():
        return
    with _connecting:
        for signal, receiver in (
            (signals.task_revoked, on_task_revoked),
            (signals.task_unknown, on_task_unknown),
            (signals.task_rejected, on_task_rejected),
            (signals.after_task_publish, note_chord_member),
            (signals.worker_init, on_start),
            (signals.beat_init, on_start),
            (signals.worker_process_init, _on_worker_process_init),
            (signals.worker_process_shutdown, _write_counts),
            (signals.worker_shutdown, _write_counts),
        ):
            signal.connect(
                receiver, weak=False, dispatch_uid=f"celery_singleton_lock.{signal.name}"
            )
        if "django" in sys.modules:
            # A Django project: its system checks report the settings too.
            from django.core import checks

            checks.register(django_check, "celery_singleton_lock")
        _connected.set()


def django_check(app_configs: Any = None, **kwargs: Any) -> list[Any]:
    """Django's system check: the settings of the current Celery app, one Error each."""
    from django.core import checks

    return [
        checks.Error(str(problem), id="celery_singleton_lock.E001")
        for problem in LockConfig.of(app_or_default()).problems
    ]
