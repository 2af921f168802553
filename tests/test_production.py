"""What docs/production.md tells operators, checked against a real redis-server.

* The ACL rule it prints for the server's version is applied as it is, and a user with only
  that rule runs every lock operation the package makes (acquire, renewal, a blocked acquire
  woken by the release, a semaphore, park, records, force release, the CLI's list and purge)
  without one refusal in ``ACL LOG``; on a Cluster, with the page's Cluster line on every
  node, so does a process's first lock (its probe for sharded pub/sub), a wake-up and a
  release redirected to a slot's new node.
* Its rules start at the oldest server the README names.
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
from cluster_helpers import Migration, redis_cluster
from lock_helpers import server_version, wait_until, wake_subscribers
from redis.cluster import RedisCluster

from celery_singleton_lock import LockSpace, ReentrantLock, Semaphore
from celery_singleton_lock._celery.hold import holder_info
from celery_singleton_lock._lock.runtime import publish_command
from celery_singleton_lock._ops.locks import find_locks, purge
from celery_singleton_lock.testing import RedisServer

PAGE = Path(__file__).resolve().parent.parent / "docs" / "production.md"


def acl_rules() -> dict[tuple[int, int], list[str]]:
    """The page's ``ACL SETUSER ...`` lines, as arguments, by the first server version (``X.Y``
    of ``redis_version``) each one is for."""
    found = re.findall(
        r"<!-- acl-rule from (\d+)\.(\d+)[^>]*-->\n```text\n(ACL SETUSER [^\n]+)\n```",
        PAGE.read_text(),
    )
    assert found, "docs/production.md has no ACL rule block"
    return {(int(major), int(minor)): shlex.split(line) for major, minor, line in found}


def acl_rule(redis_version: str) -> list[str]:
    """The page's rule for a server whose ``INFO server`` says ``redis_version``."""
    version = tuple(int(part) for part in redis_version.split(".")[:2])
    rules = acl_rules()
    fitting = [since for since in rules if since <= version]
    assert fitting, f"docs/production.md gives no ACL rule for Redis {redis_version}"
    return rules[max(fitting)]


def cluster_acl_rule() -> list[str]:
    """The page's line to run after the rule on every node of a Cluster."""
    found = re.search(
        r"<!-- acl-rule cluster[^>]*-->\n```text\n(ACL SETUSER [^\n]+)\n```", PAGE.read_text()
    )
    assert found, "docs/production.md has no ACL rule block for a Cluster"
    return shlex.split(found.group(1))


def apply_acl_rule(admin: Any, *, cluster: bool = False) -> None:
    """Create the page's ``locks`` user on the server of ``admin`` (the rule for its version,
    and on a Cluster node the Cluster's line), with an empty ``ACL LOG``."""
    rule = acl_rule(str(admin.info("server")["redis_version"]))
    assert admin.execute_command(*rule) in (b"OK", "OK", True)
    if cluster:
        assert admin.execute_command(*cluster_acl_rule()) in (b"OK", "OK", True)
    admin.execute_command("ACL", "LOG", "RESET")


@pytest.fixture
def server() -> Iterator[RedisServer]:
    with RedisServer() as server:
        yield server


@pytest.fixture
def locks_user(server: RedisServer) -> Iterator[Any]:
    apply_acl_rule(server.client())
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
    time.sleep(1.0)  # past its whole lease (the scenario): held only if the heartbeat renewed it
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
    # a debounce replace: the release and its note in one step, the note read back
    debounced = space.named("acl-debounced")
    assert debounced.take("call-a", 30, state="queued").acquired
    note = ("replaced", "call-b")
    assert debounced.force_release(holder="call-a", states=("queued",), note=note)
    assert debounced.note("replaced", "call-a") == "call-b"
    # lock_rate's limiter: a start, a turn, a pause, a cancel, its listing and a reset
    limiter = space.rate_limiter("acl-rate", "1/s")
    assert limiter.try_acquire("call-1").admitted
    assert not limiter.try_acquire("call-2").admitted
    assert limiter.pause(0.5) > 0 and limiter.cancel("call-2")
    assert [r.name for r in space.rate_limiters()] == ["acl-rate"]
    assert limiter.reset()
    assert _refusals(server) == []


@pytest.mark.cluster
@pytest.mark.timeout(120)
def test_the_documented_acl_user_runs_the_locks_on_a_cluster_without_a_refusal() -> None:
    """The page's rule for the server's version and its Cluster line on every node; then a
    process's first locks (the probe for sharded pub/sub that their first release makes), a
    waiter woken by the release's push, and a release that follows its slot to another node
    (ASK): no node has a refusal in ``ACL LOG``."""
    with redis_cluster(2) as nodes:
        for node in nodes:
            apply_acl_rule(node.client(), cluster=True)
        admin = RedisCluster(host="127.0.0.1", port=nodes[0].port, socket_timeout=5)
        client = RedisCluster(
            host="127.0.0.1",
            port=nodes[0].port,
            username="locks",
            password="CHANGE-ME",
            socket_timeout=5,
        )
        try:
            # The process's probe for sharded pub/sub (its first release or wait makes it):
            # allowed by the rule, it finds SPUBLISH where the servers have it (Redis 7+).
            sharded = server_version() >= (7, 0)
            assert publish_command(client, "lock") == ("spublish" if sharded else "publish")
            assert {node.port: _refusals(node) for node in nodes} == {n.port: [] for n in nodes}

            # a holder with a long lease: the waiter gets the lock within its 10 s only if
            # the release's push wakes it
            holder = ReentrantLock(client, "acl-cluster", ttl=30, owner="holder")
            assert holder.acquire()
            waiter = ReentrantLock(client, "acl-cluster", ttl=30, owner="waiter")
            got: list[bool] = []
            thread = threading.Thread(target=lambda: got.append(waiter.acquire(timeout=10)))
            thread.start()
            wait_until(lambda: wake_subscribers(admin, holder.key) == 1, 10, "the waiter")
            holder.release()
            thread.join(15)
            assert got == [True]
            waiter.release()

            # a lock whose slot moves to the other node while held: its release is redirected
            # there (ASK, and redis-py's ASKING)
            moved = next(
                lock
                for lock in (ReentrantLock(client, f"acl-moved-{i}", ttl=30) for i in range(99))
                if admin.keyslot(lock.key) <= 8191  # type: ignore[no-untyped-call]  # redis-py: unannotated
            )
            assert moved.acquire()
            slot = admin.keyslot(moved.key)  # type: ignore[no-untyped-call]  # redis-py: unannotated
            migration = Migration(nodes[0], nodes[1], slot)
            migration.begin()
            migration.move(moved.key, moved.key + ":meta")
            moved.release()
            migration.end()
            assert not moved.locked()

            assert {node.port: _refusals(node) for node in nodes} == {n.port: [] for n in nodes}
        finally:
            client.close()
            admin.close()


def test_the_page_has_an_acl_rule_from_the_oldest_server_the_readme_names() -> None:
    readme = (PAGE.parent.parent / "README.md").read_text()
    claimed = re.search(r"Requires Python.*?\bRedis (\d+)\.(\d+)\+", readme, re.DOTALL)
    assert claimed, "README.md names no oldest Redis in its requirements"
    assert min(acl_rules()) == (int(claimed.group(1)), int(claimed.group(2)))


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
