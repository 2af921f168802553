"""Every Celery signal receiver of the package, connected by :func:`connect` (from a bound
:class:`LockedTask` or :func:`install`; never at import, so an installed package changes no app
that does not use it). At a worker's or beat's start the settings are read again and checked,
the ``singleton_lock_tasks`` are locked, and the metrics served when configured.
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

log = logging.getLogger("celery_singleton_lock.startup")

#: ``hook(app, what)`` called at a worker's or beat's start once its settings are checked
#: (``install`` adds one here: it imports this module, so this one cannot import it)
START_HOOKS: list[Callable[[Any, str], None]] = []

_connected = threading.Event()
_connecting = threading.Lock()


def on_start(sender: Any = None, **_: Any) -> None:
    """``worker_init`` / ``beat_init``: the settings read again and checked, then the hooks."""
    app = getattr(sender, "app", None)
    if app is None:
        return
    what = "beat" if type(sender).__name__ == "Service" else "worker"
    reload_settings(app)
    config = LockConfig.of(app)
    try:
        config.check()
    except (TypeError, ValueError) as exc:
        # Said once, in the log (the exit carries no message, or Python prints it again).
        # Celery swallows a receiver's Exception; SystemExit ends the process.
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
    """``worker_process_shutdown`` / ``worker_shutdown``: write the app's recent counts (the
    counter's thread dies with the process)."""
    app = getattr(sender, "app", None) or app_or_default()
    counter = LockConfig.of(app).counter_if_made
    if counter is not None:
        counter.flush()


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
