"""The Celery app of the production ACL test (tests/test_production.py), run by a real
``celery worker`` and ``celery beat``: its locks go through the ``locks`` user that
docs/production.md's ACL rule makes, while the broker and the results use the server's default
user, as the page advises (Celery's own user needs more than the locks).

Where Redis is comes from the environment (:data:`URL_ENV`, ``redis://127.0.0.1:PORT``);
database 0 is the broker, 1 the results, 2 the locks, 3 what the tasks record and the ``go:``
keys a test sets to end a held body.
"""

from __future__ import annotations

import os
import time
from typing import Any

import redis
from celery import Celery

from celery_singleton_lock import LockedTask, RateLimited

URL_ENV = "CSL_ACL_REDIS"
#: the ACL user and password of docs/production.md's rule
USER, PASSWORD = "locks", "CHANGE-ME"
BROKER_DB, RESULT_DB, LOCK_DB, DATA_DB = 0, 1, 2, 3


def make_app(base: str) -> Celery:
    """The app on the Redis server at ``base`` (``redis://127.0.0.1:PORT``)."""
    base = base.rstrip("/")
    host = base.split("://", 1)[1]
    app = Celery("aclapp", set_as_current=False)
    app.conf.update(
        broker_url=f"{base}/{BROKER_DB}",
        result_backend=f"{base}/{RESULT_DB}",
        singleton_lock_redis_url=f"redis://{USER}:{PASSWORD}@{host}/{LOCK_DB}",
        acl_data_url=f"{base}/{DATA_DB}",
        broker_transport_options={"polling_interval": 0.1},
        broker_connection_retry_on_startup=True,
        worker_prefetch_multiplier=1,
        worker_redirect_stdouts=False,
        task_default_queue="acl",
        result_expires=None,
        beat_schedule={"acl-tick": {"task": "acl.tick", "schedule": 1.0}},
    )

    def data() -> Any:
        return redis.Redis.from_url(app.conf.acl_data_url, socket_timeout=5)

    def until_go(job: str) -> None:
        """Hold the body until the test sets ``go:<job>`` (at most a minute)."""
        client = data()
        deadline = time.monotonic() + 60
        while not client.exists(f"go:{job}") and time.monotonic() < deadline:
            time.sleep(0.02)

    # Every task of the scenario: the run-time lock, a duplicate that waits for the release's
    # wake-up, publish-time dedup, a queued copy, slots, a rate limit with a refusal and a
    # partner's "slow down", and beat's leader.

    @app.task(  # type: ignore[untyped-decorator]  # celery: unannotated
        base=LockedTask, name="acl.run", shared=False, lock_unique_on=["job"],
        lock_on_locked="wait", lock_wait_timeout=30,
    )  # fmt: skip
    def run(job: str, hold: bool = False) -> str:
        if hold:
            until_go(job)
        return f"ran {job}"

    @app.task(base=LockedTask, name="acl.published", shared=False, lock_at="publish")  # type: ignore[untyped-decorator]  # celery: unannotated
    def published(job: str) -> str:
        until_go(job)
        return f"published {job}"

    @app.task(  # type: ignore[untyped-decorator]  # celery: unannotated
        base=LockedTask, name="acl.queued", shared=False, lock_at="queue", lock_unique_on=["job"]
    )
    def queued(job: str, hold: bool = False) -> str:
        if hold:
            until_go(job)
        return f"queued {job}"

    @app.task(base=LockedTask, name="acl.slots", shared=False, lock_limit=2)  # type: ignore[untyped-decorator]  # celery: unannotated
    def slots(job: str, n: int = 0) -> str:
        return f"slot {job}"

    @app.task(  # type: ignore[untyped-decorator]  # celery: unannotated
        base=LockedTask, name="acl.rated", shared=False, lock_rate="1/m", lock_rate_max_delay=0,
        lock_unique_on=["job"],
    )  # fmt: skip
    def rated(job: str, n: int = 0) -> str:
        return f"rated {job}"

    @app.task(  # type: ignore[untyped-decorator]  # celery: unannotated
        base=LockedTask, bind=True, name="acl.told", shared=False, lock_rate="50/s", max_retries=0,
    )  # fmt: skip
    def told(self: Any, job: str) -> str:
        """Told "slow down" for one second by the partner once, then runs."""
        if data().set(f"told:{job}", 1, nx=True):
            raise RateLimited(retry_after=1)
        return f"told {job}"

    @app.task(name="acl.tick", shared=False)  # type: ignore[untyped-decorator]  # celery: unannotated
    def tick() -> None:
        data().incr("ticks")

    return app


app = make_app(os.environ.get(URL_ENV, "redis://127.0.0.1:1"))
