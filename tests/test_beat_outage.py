"""One real ``celery beat`` with the leader scheduler (``fault.tick`` every second, lease 2 s)
rides out Redis going away: killed and started again after twice the lease (every key gone),
and stalled (SIGSTOP) for three leases, then continued. While Redis is away the beat cannot
know it leads, so it sends nothing; within about one lease of Redis answering again it leads
and sends again, and it never ends on a Redis error. Sends are read from the beat's log.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from typing import Any

import pytest
import redis
from beatproj.harness import Beat, close_pairs, leader, report
from faultapp import LOCK_DB
from lock_helpers import START_TIMEOUT, wait_until

from celery_singleton_lock.testing import RedisServer

pytestmark = [pytest.mark.faults, pytest.mark.slow, pytest.mark.timeout(START_TIMEOUT + 120)]

LEASE = 2.0
PERIOD = 1.0
ENTRY = "fault-tick"
LOCK = "beat:faultapp"


@pytest.fixture
def one_beat(make_redis_server: Any, fault_beat: Callable[..., Beat]) -> tuple[Beat, RedisServer]:
    server: RedisServer = make_redis_server()
    return fault_beat(server, LEASE), server


@pytest.mark.parametrize("outage", ["restart", "stall"])
def test_ticks_resume_within_a_lease_of_redis_answering_again(
    one_beat: tuple[Beat, RedisServer], outage: str
) -> None:
    beat, server = one_beat
    client = redis.Redis(port=server.port, db=LOCK_DB, socket_timeout=5)
    try:
        wait_until(lambda: leader([beat], client, LOCK), START_TIMEOUT, "the beat to lead")
        wait_until(lambda: len(beat.sends(ENTRY)) >= 3, 20, "three sends")
        assert server.process is not None
        if outage == "restart":
            server.kill()
            time.sleep(2 * LEASE)  # the outage's length: the scenario
            server.start()
        else:
            server.process.send_signal(signal.SIGSTOP)
            time.sleep(3 * LEASE)  # the stall's length: the scenario
            server.process.send_signal(signal.SIGCONT)
        back = time.time()
        wait_until(
            lambda: len([t for t in beat.sends(ENTRY) if t > back]) >= 3,
            LEASE + 15,
            "three sends after Redis answers again",
        )
        after = [t for t in beat.sends(ENTRY) if t > back]
        holds = leader([beat], client, LOCK) is beat
    finally:
        client.close()
    text = report([beat])
    resumed = after[0] - back
    print(f"{outage}: first send {resumed:.2f} s after Redis answered again")
    assert resumed < LEASE + 1.0, (resumed, text)
    assert holds, text
    assert beat.alive(), text
    assert "beat raised exception" not in text, text
    assert not close_pairs(beat.sends(ENTRY), PERIOD / 2), text
