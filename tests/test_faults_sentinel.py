"""Sentinel failover with a held lock and a contender.

Before the fix the holder's open connections stayed on the old master, which takes writes for
several seconds after Sentinel promotes a replica: the holder renewed there, the new master's
copy of the lock ran out, a contender took it, and both passed ``ensure_held()`` for ~10 s.
Now the holder asks Sentinel before each renewal (and an acquire at most a second after the
last check) and follows the master, so it renews the replicated copy on the new master.
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import pytest
import redis
from lock_helpers import wait_until
from redis.sentinel import Sentinel
from test_lock_deployments import redis_sentinel

from celery_singleton_lock import LockBackendError, LockLostError, ReentrantLock
from celery_singleton_lock.testing import RedisServer

# slow: each test waits out a Sentinel failover (some 18 s)
pytestmark = [pytest.mark.sentinel, pytest.mark.faults, pytest.mark.slow, pytest.mark.timeout(120)]

LEASE = 5.0


def _master_client(port: int) -> Any:
    sentinel = Sentinel([("127.0.0.1", port)], socket_timeout=1)  # type: ignore[no-untyped-call]  # redis-py: unannotated
    return sentinel.master_for("mymaster", socket_timeout=1)  # type: ignore[no-untyped-call]  # redis-py: unannotated


def _watch(holder: ReentrantLock, contender: ReentrantLock, seconds: float) -> list[float]:
    """Sample for ``seconds``: the moments at which both believed they held the lock."""
    both: list[float] = []
    took = False
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not took:
            try:
                took = contender.acquire(blocking=False)
            except LockBackendError:  # a failover in progress: try again
                took = False
        try:
            holder.ensure_held()
            held = True
        except LockLostError:
            held = False
        if held and took:
            both.append(time.monotonic())
        time.sleep(0.05)  # the watch's sampling interval: the span watched is the scenario
    return both


@pytest.mark.parametrize("fault", ["SENTINEL FAILOVER", "master SIGKILLed"])
def test_after_a_failover_no_two_holders(make_redis_server: Any, fault: str) -> None:
    master: RedisServer = make_redis_server()
    replica: RedisServer = make_redis_server("--replicaof", "127.0.0.1", str(master.port))
    with redis_sentinel(master) as port:
        probe: Any = redis.Redis(port=port, socket_timeout=2)
        # Sentinel lists the replica (from the master's INFO) before it has a link to it of
        # its own and has seen the replica's link to the master up: until then it has no
        # replica to promote (a failover is refused with NOGOODSLAVE, as on Redis 6.2).
        assert wait_until(
            lambda: any(
                r.get("name")
                and not r.get("is_disconnected")
                and r.get("master-link-status") == "ok"
                for r in probe.sentinel_slaves("mymaster")
            ),
            30,
        ), "Sentinel did not find the replica"
        assert wait_until(
            lambda: replica.client().info("replication")["master_link_status"] == "up", 30
        )
        holder_client, contender_client = _master_client(port), _master_client(port)
        holder = ReentrantLock(holder_client, "failover", ttl=LEASE, owner="holder")
        contender = ReentrantLock(contender_client, "failover", ttl=LEASE, owner="contender")
        assert holder.acquire()
        # Replicated before the fault: what asynchronous replication may lose is not the
        # subject here (see the README's Sentinel paragraph). Not WAIT on a new connection:
        # WAIT counts the acknowledgements of that connection's own writes (none), so it
        # answers at once, and a kill soon after could promote a replica without the lock.
        written = master.client().info("replication")["master_repl_offset"]
        assert wait_until(
            lambda: replica.client().info("replication")["master_repl_offset"] >= written, 10
        ), "the replica did not catch up with the lock"
        assert replica.client().hexists(holder.key, "holder")
        if fault == "SENTINEL FAILOVER":
            probe.execute_command("SENTINEL", "FAILOVER", "mymaster")
        else:
            assert master.process is not None
            os.kill(master.process.pid, signal.SIGKILL)
            probe.execute_command("SENTINEL", "FAILOVER", "mymaster")  # not wait 5 s to notice
        assert wait_until(
            lambda: int(probe.sentinel_get_master_addr_by_name("mymaster")[1]) == replica.port,
            30,
        )
        both = _watch(holder, contender, 2.5 * LEASE)
        assert both == [], f"two holders for {len(both) * 0.05:.2f} s after {fault}"
        # The holder kept its lock, renewed on the new master all along.
        assert not holder.lost.is_set()
        assert replica.client().hexists(holder.key, "holder")
        assert replica.client().pttl(holder.key) > 0
        holder.release()
        assert contender.acquire(blocking=True, timeout=5)
        contender.release()
        for client in (holder_client, contender_client, probe):
            client.close()
