"""An app that never uses celery_singleton_lock, run by ``celery worker`` in an environment where
the package is installed (so the ``celery`` command loads its ``locks`` entry point). It sets
what the package would read if it were in use: ``singleton_lock_tasks``, and a misspelt
``singleton_lock_tll`` that would stop a worker of an app that uses the package. Its log lines
carry their logger's name, so a line of the package's would show. ``CSL_PLAIN_REDIS`` says where
Redis is (``redis://host:port``)."""

from __future__ import annotations

import os
import weakref
from typing import Any

from celery import Celery, signals
from celery.utils.dispatch import Signal

_redis = os.environ.get("CSL_PLAIN_REDIS", "redis://127.0.0.1:1")

#: the package's own name: this module never imports it, it only looks for it
PACKAGE = "celery_singleton_lock"

app = Celery("plainapp", set_as_current=False)
app.conf.update(
    broker_url=f"{_redis}/0",
    result_backend=f"{_redis}/1",
    broker_connection_retry_on_startup=True,
    singleton_lock_tasks={"plainapp.report": {"lock_at": "publish"}},
    singleton_lock_tll=30,  # misspelt: a worker of an app that uses the package refuses it
    worker_log_format="[%(levelname)s/%(processName)s %(name)s] %(message)s",
    worker_task_log_format="[%(levelname)s/%(processName)s %(name)s] %(message)s",
)


def package_receivers() -> list[str]:
    """Every receiver of a Celery signal (and of the app's own) that the package defines."""
    found = []
    named = {name: s for name, s in vars(signals).items() if isinstance(s, Signal)}
    named["app.on_after_finalize"] = app.on_after_finalize
    for name, signal in named.items():
        for _, receiver in signal.receivers or []:
            target = receiver() if isinstance(receiver, weakref.ReferenceType) else receiver
            module = getattr(target, "__module__", None) or ""
            if module.startswith(PACKAGE):
                found.append(f"{name}: {module}.{getattr(target, '__qualname__', target)}")
    return found


@app.task(name="plainapp.report", bind=True)  # type: ignore[untyped-decorator]  # celery: unannotated
def report(self: Any, day: int) -> dict[str, Any]:
    """What the worker running it has of the package: its task class's bases and the
    package's signal receivers (both empty for an app that never uses it)."""
    return {
        "day": day,
        "classes": [
            f"{c.__module__}.{c.__qualname__}"
            for c in type(self).__mro__
            if c.__module__.startswith(PACKAGE)
        ],
        "receivers": package_receivers(),
    }
