"""An app module that uses the package through a ``LockedTask`` only and never calls
``install()``: its other tasks are locked by the ``singleton_lock_tasks`` setting alone, at its
worker's start (the locked task bound to the app connects that start's receiver).
``CSL_SETTINGS_REDIS`` says where Redis is (``redis://host:port``); database 3 holds what the
tasks record. ``CSL_SETTINGS_EXTRA`` (a JSON object) adds settings, such as a misspelt one."""

from __future__ import annotations

import json
import os
import time

import redis
from celery import Celery

from celery_singleton_lock import LockedTask

_redis = os.environ.get("CSL_SETTINGS_REDIS", "redis://127.0.0.1:1")

app = Celery("settingsapp", set_as_current=False)
app.conf.update(
    broker_url=f"{_redis}/0",
    result_backend=f"{_redis}/1",
    singleton_lock_redis_url=f"{_redis}/2",
    broker_connection_retry_on_startup=True,
    singleton_lock_tasks={
        "settingsapp.slow": {},
        "settingsapp.report": {"lock_at": "publish"},
    },
    **json.loads(os.environ.get("CSL_SETTINGS_EXTRA", "{}")),
)


def _record(key: str) -> None:
    redis.Redis.from_url(f"{_redis}/3").rpush(f"runs:{key}", str(time.time()))


@app.task(name="settingsapp.slow")  # type: ignore[untyped-decorator]  # celery: unannotated
def slow(key: str, seconds: float) -> str:
    _record(key)
    time.sleep(seconds)  # the body's work (the scenario)
    return key


@app.task(name="settingsapp.report")  # type: ignore[untyped-decorator]  # celery: unannotated
def report(key: str) -> str:
    _record(key)
    return key


@app.task(base=LockedTask, name="settingsapp.own")  # type: ignore[untyped-decorator]  # celery: unannotated
def own(key: str) -> str:
    """The app's own locked task: what makes it an app that uses the package."""
    _record(key)
    return key
