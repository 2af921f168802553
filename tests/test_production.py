"""What docs/production.md tells operators, checked against a real redis-server.

* The ACL rule it prints is applied as it is, and a user with only that rule runs every lock
  operation the package makes (acquire, renewal, a blocked acquire woken by the release, a
  semaphore, park, records, force release, the CLI's list and purge) without one refusal in
  ``ACL LOG``.
* The keys and bytes a held lock costs stay within what the page says.
"""

from __future__ import annotations

import re
import shlex
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from lock_helpers import wait_until, wake_subscribers

from celery_singleton_lock import LockSpace, ReentrantLock, Semaphore
from celery_singleton_lock._celery.hold import holder_info
from celery_singleton_lock._ops.locks import find_locks, purge
from celery_singleton_lock.testing import RedisServer

PAGE = Path(__file__).resolve().parent.parent / "docs" / "production.md"


def acl_rule() -> list[str]:
    """The ``ACL SETUSER ...`` line of the page, as arguments."""
    text = PAGE.read_text()
    found = re.search(r"<!-- acl-rule[^>]*-->\n```text\n(ACL SETUSER [^\n]+)\n```", text)
    assert found, "docs/production.md has no ACL rule block"
    return shlex.split(found.group(1))


@pytest.fixture
def server() -> Iterator[RedisServer]:
    with RedisServer() as server:
        yield server


@pytest.fixture
def locks_user(server: RedisServer) -> Iterator[Any]:
    admin = server.client()
    assert admin.execute_command(*acl_rule()) in (b"OK", "OK", True)
    admin.execute_command("ACL", "LOG", "RESET")
    client = redis.Redis(port=server.port, username="locks", password="CHANGE-ME", socket_timeout=5)
    yield client
    client.close()


def _refusals(server: RedisServer) -> list[Any]:
    return list(server.client().execute_command("ACL", "LOG"))


def test_the_documented_acl_user_runs_every_lock_operation(
    server: RedisServer, locks_user: Any
) -> None:
    with pytest.raises(redis.exceptions.NoPermissionError):
        locks_user.set("not-a-lock", "1")  # the rule is a real restriction
    server.client().execute_command("ACL", "LOG", "RESET")

    lock = ReentrantLock(locks_user, "acl-job", ttl=0.6, owner="holder")
    assert lock.acquire()
    first = lock.fence
    time.sleep(1.0)  # past its whole lease: still held only if the heartbeat renewed it
    lock.ensure_held()
    assert server.client().hexists(lock.key, "holder")

    waiter = ReentrantLock(locks_user, "acl-job", ttl=5, owner="waiter")
    got: list[bool] = []
    thread = threading.Thread(target=lambda: got.append(waiter.acquire(timeout=10)))
    thread.start()
    wait_until(lambda: wake_subscribers(server.client(), lock.key) == 1, 10, "the waiter")
    lock.release()
    thread.join(10)
    assert got == [True] and (waiter.fence or 0) > (first or 0)
    waiter.release()

    semaphore = Semaphore(locks_user, "acl-sem", 2, ttl=5, owner="a")
    other = Semaphore(locks_user, "acl-sem", 2, ttl=5, owner="b")
    assert semaphore.acquire(blocking=False) and other.acquire(blocking=False)
    assert not Semaphore(locks_user, "acl-sem", 2, ttl=5, owner="c").acquire(blocking=False)
    assert semaphore.holders() == {"a": 1, "b": 1}
    semaphore.release()
    other.release_all()

    space = LockSpace(locks_user)
    assert space.named("acl-queued").take("task-1", 30).acquired
    assert space.named("acl-queued").park("task-1", 30)
    reply = space.record_if_held(
        "acl-queued", "task-1", "last_run", "tick", "1", min_lease=0, keep=60
    )
    assert reply
    assert space.records("acl-queued", "last_run") == {"tick": "1"}
    assert [v.holder for v in find_locks(locks_user)] == ["task-1"]
    assert space.force_release("acl-queued")
    assert space.named("acl-purged").take("task-2", 30).acquired
    assert purge(locks_user) == 1
    assert _refusals(server) == []


def test_what_a_held_lock_costs(server: RedisServer) -> None:
    client = server.client()
    task_id = "3f1c2a9e-8d41-4c59-9a71-2b7e3d3f0c11"
    info = holder_info("proj.tasks.report", task_id)
    name = "proj.tasks.report:5d41402abc4b2a76b9719d911017c592"
    lock = ReentrantLock(client, name, ttl=30, owner=task_id, info=info)
    assert lock.acquire()
    meta = lock.key + ":meta"
    assert sorted(k.decode() for k in client.keys("*")) == [lock.key, meta]
    # the page: about 150 + 650 bytes
    assert client.memory_usage(lock.key) <= 250
    assert client.memory_usage(meta) <= 900
    lock.release()
    assert client.keys("*") == [meta.encode()]
    assert client.memory_usage(meta) <= 900  # the page: about 700, for one to two minutes
    # the lease it was taken with, plus one and a half retentions (see lua/acquire.lua's x)
    assert 0 < client.pttl(meta) <= 30_000 + 90_000
