"""Beat that cannot run twice: two real ``celery beat`` processes with
``-S celery_singleton_lock.beat:LeaderScheduler`` on one schedule (``fault.tick`` every second,
Celery's ``PersistentScheduler`` wrapped), leader lease 2 s, on a redis-server of the test's own.

One sends, the other stands by. When the leader is SIGKILLed, stopped (SIGTERM) or paused past
its lease (SIGSTOP, then SIGCONT), or when Redis restarts (every key gone, the leader lock and
the last-run records with it), a beat leads again within about one lease and no tick is sent
twice: no two sends closer than half the schedule's period, counted from both beats' logs; a
paused leader sends nothing when it wakes.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from beatproj.harness import (
    Beat,
    all_sends,
    close_pairs,
    leader,
    report,
    sends_since,
)
from faultapp import LOCK_DB
from lock_helpers import START_TIMEOUT, wait_until

from celery_singleton_lock.testing import RedisServer

pytestmark = [pytest.mark.faults, pytest.mark.slow, pytest.mark.timeout(START_TIMEOUT + 120)]

LEASE = 2.0
PERIOD = 1.0
ENTRY = "fault-tick"
LOCK = "beat:faultapp"


@pytest.fixture
def world(
    make_redis_server: Any, fault_beat: Callable[..., Beat]
) -> Iterator[tuple[list[Beat], Any, RedisServer]]:
    server: RedisServer = make_redis_server()
    client = redis.Redis(port=server.port, db=LOCK_DB, socket_timeout=5)
    beats = [fault_beat(server, LEASE) for _ in range(2)]
    yield beats, client, server
    client.close()


@pytest.mark.parametrize("fault", ["sigkill", "sigterm", "sigstop", "redis-restart"])
def test_one_beat_sends_and_a_beat_leads_again(
    world: tuple[list[Beat], Any, RedisServer], fault: str
) -> None:
    beats, client, server = world
    first = wait_until(lambda: leader(beats, client, LOCK), START_TIMEOUT, "a beat to lead")
    standby = next(b for b in beats if b is not first)
    wait_until(lambda: len(all_sends(beats, ENTRY)) >= 3, 20, "three sends")

    started = time.time()
    if fault == "sigkill":
        os.killpg(first.pid, signal.SIGKILL)
    elif fault == "sigterm":
        first.signal(signal.SIGTERM)
    elif fault == "sigstop":
        os.killpg(first.pid, signal.SIGSTOP)
    else:
        server.restart()  # every key gone: the lock, the records, the broker's queue
    if fault == "redis-restart":
        now = wait_until(lambda: leader(beats, client, LOCK), 2 * LEASE + 5, "a beat to lead")
    else:
        wait_until(lambda: leader(beats, client, LOCK) is standby, LEASE + 5, "the standby to lead")
        now = standby
    took_over = time.time() - started
    wait_until(
        lambda: len(sends_since(beats, ENTRY, started + took_over)) >= 3,
        LEASE + 10,
        "three sends by the leader",
    )
    if fault == "sigstop":
        os.killpg(first.pid, signal.SIGCONT)  # wakes past its lease: must send nothing
        wait_until(lambda: "is no longer the leader" in first.log(), 10, "the woken to step down")
        stepped_down = time.time()
        # three more ticks of the leader: any send of the woken one would be among them
        wait_until(
            lambda: len(sends_since([now], ENTRY, stepped_down)) >= 3,
            3 * PERIOD + 10,
            "three sends by the leader after the step-down",
        )
    times = all_sends(beats, ENTRY)
    text = report(beats)
    limit = 2.0 if fault == "sigterm" else LEASE + 1.5  # a stopped leader hands over at once
    assert took_over < limit, (took_over, text)
    assert not close_pairs(times, PERIOD / 2), (close_pairs(times, PERIOD / 2), text)
    assert now.alive(), text
    if fault == "sigstop":
        assert not [t for t in first.sends(ENTRY) if t > started], text
    # Nothing ended a beat that was not killed: no Redis error escaped the scheduler.
    assert "beat raised exception" not in text, text
    if fault in ("sigstop", "redis-restart"):
        assert first.alive(), text
