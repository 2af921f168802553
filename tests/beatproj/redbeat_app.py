"""The Celery app of the RedBeat beat tests: ``celery -A tests.beatproj.redbeat_app beat``
(and ``worker``): RedBeat's ``RedBeatScheduler`` run by the leader scheduler, set up as
docs/operating.md says, with one entry due every second (``$CSL_BEATPROJ_WRAPPED`` names
another scheduler for the leader to wrap).

Where Redis is and the leader lock's lease come from the environment (:mod:`beatproj.env`).
Each beat records every message it publishes (Celery's ``before_task_publish`` signal: its pid,
the time, the task id) and the worker every run of the task, both in ``DATA_DB``: what went
out, and from which beat, is read from there rather than from the logs.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import redis
from celery import Celery
from celery.signals import before_task_publish

from .env import (
    BROKER_DB,
    DATA_DB,
    LOCK_DB,
    PUBLISHED,
    RAN,
    REDBEAT_DB,
    REDBEAT_ENTRY,
    REDBEAT_QUEUE,
    REDBEAT_TASK,
    REDIS_ENV,
    TTL_ENV,
    WRAPPED_ENV,
)

_REDIS = os.environ.get(REDIS_ENV, "redis://127.0.0.1:6390").rstrip("/")

app = Celery("rbproj")
app.conf.update(
    broker_url=f"{_REDIS}/{BROKER_DB}",
    broker_connection_retry_on_startup=True,
    task_default_queue=REDBEAT_QUEUE,
    beat_schedule={REDBEAT_ENTRY: {"task": REDBEAT_TASK, "schedule": 1.0}},
    # what docs/operating.md asks of a RedBeat project: RedBeat's own Redis setting, and
    # RedBeat named as the scheduler the leader runs (beat started with -S LeaderScheduler)
    redbeat_redis_url=f"{_REDIS}/{REDBEAT_DB}",
    singleton_lock_beat_scheduler=os.environ.get(WRAPPED_ENV) or "redbeat.RedBeatScheduler",
    singleton_lock_redis_url=f"{_REDIS}/{LOCK_DB}",
    singleton_lock_ttl=float(os.environ.get(TTL_ENV, "3")),
)

_data: redis.Redis | None = None


def data() -> redis.Redis:
    global _data
    if _data is None:
        _data = redis.Redis.from_url(f"{_REDIS}/{DATA_DB}", socket_timeout=5)
    return _data


@before_task_publish.connect  # type: ignore[untyped-decorator]  # celery: unannotated
def _record_publish(headers: dict[str, Any] | None = None, **_: Any) -> None:
    # In the beat: right before the message goes to the broker.
    item = {"pid": os.getpid(), "t": time.time(), "id": (headers or {}).get("id")}
    data().rpush(PUBLISHED, json.dumps(item))


@app.task(name=REDBEAT_TASK, bind=True)  # type: ignore[untyped-decorator]  # celery: unannotated
def tick(self: Any) -> None:
    data().rpush(RAN, json.dumps({"id": self.request.id, "t": time.time()}))
