"""Prometheus metrics of the lock and the Celery layer (the ``prometheus`` extra).

In a worker, set ``singleton_lock_metrics_port`` (pool child *i* serves on port + *i*);
elsewhere call :func:`enable` (and :func:`serve`, or expose your own registry). Every name
starts with ``celery_singleton_lock_`` (what each counts: the Operating page).
"""

from __future__ import annotations

import logging
import threading
from typing import Any

try:
    from prometheus_client import REGISTRY, CollectorRegistry, Counter, Histogram
    from prometheus_client import start_http_server as _start_http_server
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    from ._errors import install_hint

    raise ImportError(
        f"celery_singleton_lock.metrics needs prometheus_client: {install_hint('prometheus')}"
    ) from exc

from ._celery.hold import set_job_observer
from ._lock import set_observer

__all__ = ["PREFIX", "LockMetrics", "disable", "enable", "serve"]

log = logging.getLogger("celery_singleton_lock.metrics")

#: the prefix of every metric's name
PREFIX = "celery_singleton_lock_"

#: wait and hold times span a hand-off (ms) to a long job (hours)
_BUCKETS = (0.001, 0.005, 0.025, 0.1, 0.5, 1, 5, 30, 120, 600, 3600, float("inf"))


class LockMetrics:
    """The metrics in one registry, and the lock's and Celery layer's observer feeding them."""

    def __init__(self, registry: CollectorRegistry = REGISTRY) -> None:
        self.registry = r = registry
        self.acquires = Counter(
            PREFIX + "acquires", "Lock acquires by outcome", ["outcome"], registry=r
        )
        self.duplicates = Counter(
            PREFIX + "duplicates",
            "Celery duplicates by task and what was done with them",
            ["task", "action"],
            registry=r,
        )
        self.refusals = Counter(
            PREFIX + "refusals",
            "Celery calls refused by lock_limit, lock_cooldown or lock_rate, by task and reason",
            ["task", "reason"],
            registry=r,
        )
        self.wait = Histogram(
            PREFIX + "wait_seconds",
            "Wait of blocking acquires that found the lock held",
            buckets=_BUCKETS,
            registry=r,
        )
        self.hold = Histogram(
            PREFIX + "hold_seconds",
            "Time from taking a lock to its final release in this process",
            buckets=_BUCKETS,
            registry=r,
        )
        self.renewals = Counter(PREFIX + "renewals", "Leases renewed", registry=r)
        self.renewal_failures = Counter(
            PREFIX + "renewal_failures", "Renewal calls that failed", registry=r
        )
        self.lost_leases = Counter(PREFIX + "lost", "Leases lost while held", registry=r)
        self.backend_errors = Counter(
            PREFIX + "backend_errors", "Lock operations failed by Redis", registry=r
        )
        # the observers' calls, bound once: a label lookup per event would cost more than
        # counting it
        self._acquired = self.acquires.labels("acquired")
        self._reentered = self.acquires.labels("reentered")
        self.refused = self.acquires.labels("refused").inc
        self.waited = self.wait.observe
        self.released = self.hold.observe
        self.renewed = self.renewals.inc
        self.renewal_failed = self.renewal_failures.inc
        self.lost = self.lost_leases.inc
        self.backend_error = self.backend_errors.inc

    # the rest of LockObserver and JobObserver
    def acquired(self, reentered: bool) -> None:
        (self._reentered if reentered else self._acquired).inc()

    def duplicate(self, task: str, action: str) -> None:
        self.duplicates.labels(task, action).inc()

    def refused_by(self, task: str, reason: str) -> None:
        self.refusals.labels(task, reason).inc()


_enabled: LockMetrics | None = None
_enable_lock = threading.Lock()


def enable(registry: CollectorRegistry | None = None) -> LockMetrics:
    """Count into Prometheus from now on in this process; idempotent (the first registry
    stays: a metric cannot be registered twice)."""
    global _enabled
    with _enable_lock:
        if _enabled is None:
            _enabled = LockMetrics(REGISTRY if registry is None else registry)
        set_observer(_enabled)
        set_job_observer(_enabled)
        return _enabled


def disable() -> None:
    """Stop counting (the metrics keep their values)."""
    set_observer(None)
    set_job_observer(None)


def serve(port: int, addr: str = "0.0.0.0") -> Any:
    """:func:`enable`, and serve the registry on ``addr:port`` from a daemon thread."""
    metrics = enable()
    server = _start_http_server(port, addr, registry=metrics.registry)
    log.info("serving the lock metrics on http://%s:%d/metrics", addr, port)
    return server
