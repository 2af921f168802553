"""The Celery layer's shortcuts on the hot paths (see bench/bench_celery.py) behave exactly like
the slow paths they replace, seen through public names: the settings read once per app, the
operator info a hold stores, the lease of a message's lock, the lock name of a call."""

from __future__ import annotations

import json
import os
import socket
from typing import Any, ClassVar

import pytest
from celery import Celery
from celery_fixtures import app_task, track

from celery_singleton_lock import LockedTask, reload_settings
from celery_singleton_lock.testing import RedisServer


class _ConfigObject:
    singleton_lock_prefix = "from-object"
    #: set and deleted by test_a_config_is_read_once_and_again_when_asked
    singleton_lock_queue_ttl: ClassVar[int]


def test_a_config_is_read_once_and_again_when_asked() -> None:
    app = Celery("changes", broker="redis://127.0.0.1:1/0")
    assert LockedTask.key_prefix(app) == "lock"
    app.conf.singleton_lock_prefix = "changed"
    assert LockedTask.key_prefix(app) == "lock"  # read once per app
    reload_settings(app)
    assert LockedTask.key_prefix(app) == "changed"
    _ConfigObject.singleton_lock_queue_ttl = 99  # a config object changed in place
    try:
        from_object = Celery("from_object")
        from_object.config_from_object(_ConfigObject)
        assert LockedTask.queue_lease(from_object) == 99
    finally:
        del _ConfigObject.singleton_lock_queue_ttl


def _app(redis_server: RedisServer) -> Celery:
    app = track(Celery("hot", broker=redis_server.url, set_as_current=False))
    app.conf.singleton_lock_redis_url = redis_server.url
    return app


@pytest.mark.parametrize(
    ("task", "task_id", "limit"),
    [("a.b", "0f-1", 1), ('é"x\n', "id\u2028", 3), ("t" * 300, "💥", 1)],
)
def test_info_is_the_json_it_says(
    redis_client: Any, redis_server: RedisServer, task: str, task_id: str, limit: int
) -> None:
    """The operator info a run's hold stores (compact JSON, read back by the run itself)."""
    app = _app(redis_server)
    seen: list[str] = []

    @app_task(
        app, base=LockedTask, bind=True, name=task, shared=False, lock_limit=limit, lock_ttl=5
    )
    def held(self: LockedTask) -> None:
        name = self.locking.lock_name(self.name, (), {})
        seen.extend(s.info for s in self.locking.states(self.app, name) if s.held)

    held.apply(task_id=task_id, throw=True)
    fields: dict[str, object] = {
        "task": task,
        "id": task_id,
        "host": socket.gethostname(),
        "pid": os.getpid(),
    }
    if limit != 1:
        fields["limit"] = limit
    assert seen == [json.dumps(fields, separators=(",", ":"))]
    assert json.loads(seen[0])["id"] == task_id


def test_a_forked_child_s_info_has_its_own_pid(
    redis_client: Any, redis_server: RedisServer
) -> None:
    """The info's host is read once per process, its pid at each hold: a forked child's hold
    names the child."""
    app = _app(redis_server)
    seen: list[str] = []

    @app_task(app, base=LockedTask, bind=True, name="hot.fork", shared=False, lock_ttl=5)
    def held(self: LockedTask) -> None:
        name = self.locking.lock_name(self.name, (), {})
        seen.extend(s.info for s in self.locking.states(self.app, name) if s.held)

    held.apply(task_id="parent", throw=True)  # the parent's, before the fork's child asks
    assert f'"pid":{os.getpid()}' in seen[0]
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its own pid in the info
        try:
            seen.clear()
            held.apply(task_id="child", throw=True)
            ok = len(seen) == 1 and f'"pid":{os.getpid()}' in seen[0]
        except BaseException:
            ok = False
        os.write(write, b"1" if ok else b"0")
        os._exit(0)
    os.close(write)
    assert os.read(read, 1) == b"1"
    os.close(read)
    os.waitpid(pid, 0)


@pytest.mark.parametrize("ttl", [3600, 3600.0, 0.5, 10 * 365 * 24 * 3600 + 5])
def test_the_queue_lease_of_a_plain_call_is_its_ttl(
    redis_client: Any, redis_server: RedisServer, ttl: float
) -> None:
    """A message's lock taken at publish, with no delay or with ``countdown=0``, lasts the
    class's ``queue_lease`` (at most the longest lease)."""
    app = _app(redis_server)

    class Leased(LockedTask):
        @classmethod
        def queue_lease(cls, app: Any) -> float:
            return ttl

    @app_task(app, base=Leased, name="hot.queued", shared=False, lock_at="publish", lock_ttl=5)
    def queued(n: int) -> None:
        pass

    expected = min(ttl, 10 * 365 * 24 * 3600)
    calls: list[dict[str, Any]] = [{}, {"countdown": 0}]
    for n, options in enumerate(calls):
        queued.apply_async((n,), **options)
        name = queued.locking.lock_name(queued.name, (n,), {})
        leases = [s.lease_left for s in queued.locking.states(app, name) if s.held]
        assert len(leases) == 1 and leases[0] is not None
        assert expected - 1 < leases[0] <= expected
