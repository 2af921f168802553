"""A beat leader sends only with Redis's word that it leads with a margin of lease left, and
publishes only while its lease still runs: one real ``celery beat`` with a leader scheduler
that puts a fault at the exact point of its first send (``tests/beatproj/schedulers.py``),
``fault.tick`` due every second, on a redis-server of the test's own.

* The lease left in Redis is below the margin (a quarter of the lease) when the send is to be
  recorded: the record script refuses it, the send is held back (and tried again once the
  lease is renewed), and nothing is sent before that.
* The leader stops (SIGSTOP) after the record and before the publish, and wakes once its lease
  has run out in Redis: the check of the lease on its own clock, right before the publish,
  stops the send (its successor would count that tick as sent).

The sends are read from the beat's log (``Scheduler: Sending due task``), after the line with
which the scheduler said it put the fault in.
"""

from __future__ import annotations

import os
import re
import signal
from collections.abc import Callable
from typing import Any

import pytest
import redis
from beatproj.harness import SEND_LINE, Beat, holder, report
from faultapp import LOCK_DB
from lock_helpers import START_TIMEOUT, wait_until

from celery_singleton_lock.testing import RedisServer

pytestmark = [pytest.mark.faults, pytest.mark.slow, pytest.mark.timeout(START_TIMEOUT + 90)]

ENTRY = "fault-tick"
LOCK = "beat:faultapp"
SCHEDULERS = "tests.beatproj.schedulers"

CUT = re.compile(
    r"test: cut the leader lock's lease to (?P<left>\d+) ms before recording fault-tick"
)
HELD_BACK = re.compile(
    r"beat \S+ holds a send back: fault-tick: only (?P<left>-?\d+) ms left on the lease"
)
PAUSED = re.compile(r"test: recorded fault-tick; pausing before its send")
NOT_SENT = re.compile(r"beat \S+ did not send fault-tick: ")


def _first_after(beat: Beat, start: int, *patterns: re.Pattern[str]) -> re.Match[str] | None:
    """The first match of any of ``patterns`` in the beat's log after offset ``start``."""
    text = beat.log()[start:]
    found = [m for p in patterns if (m := p.search(text))]
    return min(found, key=lambda m: m.start()) if found else None


def test_a_send_with_less_lease_left_than_the_margin_is_held_back(
    make_redis_server: Any, fault_beat: Callable[..., Beat]
) -> None:
    # A margin of 3 s; the lease is cut to 1.5 s at the first send, 1 s after the takeover,
    # and the first renewal is due 2 to 4 s after the takeover: out of the cut's way.
    lease = 12.0
    beat = fault_beat(make_redis_server(), lease, f"{SCHEDULERS}:ShortLeaseLeaderScheduler")
    cut = wait_until(lambda: CUT.search(beat.log()), START_TIMEOUT, "the leader to cut its lease")
    assert int(cut["left"]) < lease * 1000 / 4
    outcome = wait_until(
        lambda: _first_after(beat, cut.end(), HELD_BACK, SEND_LINE),
        15,
        "the leader to send or hold the send back",
    )
    text = report([beat])
    sent = outcome.re is SEND_LINE
    assert not sent, f"sent with less lease left than the margin:\n{text}"
    assert 0 <= int(outcome["left"]) <= int(cut["left"]), text
    # and it sends once the lease is long enough again (renewed, or taken anew)
    wait_until(lambda: SEND_LINE.search(beat.log()[cut.end() :]), lease + 10, "a send after it")
    assert beat.alive() and "beat raised exception" not in beat.log(), report([beat])


def test_a_leader_paused_between_the_record_and_the_send_sends_nothing(
    make_redis_server: Any, fault_beat: Callable[..., Beat]
) -> None:
    lease = 2.0
    server: RedisServer = make_redis_server()
    client = redis.Redis(port=server.port, db=LOCK_DB, socket_timeout=5)
    beat = fault_beat(server, lease, f"{SCHEDULERS}:PausingLeaderScheduler")
    try:
        paused = wait_until(lambda: PAUSED.search(beat.log()), START_TIMEOUT, "the leader to pause")
        # Stopped, it renews nothing: its lease runs out in Redis.
        wait_until(lambda: not holder(client, LOCK), lease + 5, "the paused leader's lease to end")
        os.killpg(beat.pid, signal.SIGCONT)
        outcome = wait_until(
            lambda: _first_after(beat, paused.end(), NOT_SENT, SEND_LINE),
            15,
            "the woken leader to send or not",
        )
        text = report([beat])
        sent = outcome.re is SEND_LINE
        assert not sent, f"the woken leader sent past its lease:\n{text}"
        assert beat.alive() and "beat raised exception" not in text, text
    finally:
        client.close()
