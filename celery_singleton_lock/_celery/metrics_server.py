"""A worker serves the lock metrics when ``singleton_lock_metrics_port`` is set.

Every process that runs tasks counts its own: a solo or threads worker's main process serves
on the port; with the prefork pool the main process (its releases for dead pool children)
serves on the port and pool child *i* (billiard's 0-based index + 1) on port + *i*. A
replaced child has its predecessor's index, so the ports stay put.
"""

from __future__ import annotations

import logging
from typing import Any

from celery import signals
from celery.app import app_or_default

from .settings import setting

__all__ = ["connect_metrics_receivers"]

log = logging.getLogger("celery_singleton_lock.metrics")


def _serve(app: Any, offset: int) -> None:
    port = setting(app, "singleton_lock_metrics_port")
    if port is None:
        return
    address = setting(app, "singleton_lock_metrics_address")
    try:
        from .. import metrics

        metrics.serve(port + offset, address)
    except (ImportError, OSError) as exc:
        log.error(
            "cannot serve the lock metrics on %s:%d: %s (singleton_lock_metrics_port is set; "
            "pip install 'celery-singleton-lock[prometheus]', or pick a free port)",
            address,
            port + offset,
            exc,
        )


def _on_worker_init(sender: Any = None, **_: Any) -> None:
    _serve(getattr(sender, "app", None) or app_or_default(), 0)


def _on_worker_process_init(**_: Any) -> None:
    from billiard.process import current_process

    index = getattr(current_process(), "index", 0) or 0
    _serve(app_or_default(), index + 1)


def connect_metrics_receivers() -> None:
    signals.worker_init.connect(_on_worker_init, weak=False, dispatch_uid="csl-metrics-main")
    signals.worker_process_init.connect(
        _on_worker_process_init, weak=False, dispatch_uid="csl-metrics-child"
    )
