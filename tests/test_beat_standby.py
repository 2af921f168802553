"""What a standby beat says: two real ``celery beat`` processes with the leader scheduler
(lease 2 s). The standby logs at INFO, once, that it stands by and who leads (the leader lock's
holder, whose owner token names the leader's host and pid), then again now and then while it
keeps standing by (every 1.5 s with the test's subclass, every minute by default); when the
leader stops, the standby logs at INFO that it leads.
"""

from __future__ import annotations

import re
import signal
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from beatproj.harness import Beat, holder, leader, report
from faultapp import LOCK_DB
from lock_helpers import START_TIMEOUT, wait_until

from celery_singleton_lock.testing import RedisServer

pytestmark = [pytest.mark.faults, pytest.mark.slow, pytest.mark.timeout(START_TIMEOUT + 90)]

LEASE = 2.0
LOCK = "beat:faultapp"
STANDBY = re.compile(r"INFO/[^\]]+\] beat (?P<me>\S+) stands by: (?P<leader>\S+) leads")
STILL = re.compile(r"INFO/[^\]]+\] beat (?P<me>\S+) still stands by .*: (?P<leader>\S+) leads")
LEADS = re.compile(r"INFO/[^\]]+\] beat (?P<me>\S+) leads now")


@pytest.fixture
def two_beats(
    make_redis_server: Any, fault_beat: Callable[..., Beat]
) -> Iterator[tuple[list[Beat], Any]]:
    server: RedisServer = make_redis_server()
    scheduler = "tests.beatproj.schedulers:ChattyLeaderScheduler"
    beats = [fault_beat(server, LEASE, scheduler) for _ in range(2)]
    client = redis.Redis(port=server.port, db=LOCK_DB, socket_timeout=5)
    yield beats, client
    client.close()


def test_standby_names_the_leader_at_info_and_says_when_it_leads(
    two_beats: tuple[list[Beat], Any],
) -> None:
    beats, client = two_beats
    first = wait_until(lambda: leader(beats, client, LOCK), START_TIMEOUT, "a beat to lead")
    token = holder(client, LOCK)
    standby = next(b for b in beats if b is not first)

    said = wait_until(lambda: STANDBY.search(standby.log()), 10, "the standby to say so")
    assert said["leader"] == token, report(beats)
    assert f":{standby.pid}:" in said["me"], report(beats)
    # Said once, then now and then while it keeps standing by (not at every try).
    reminders = wait_until(
        lambda: len(STILL.findall(standby.log())) >= 2 and STILL.findall(standby.log()),
        10,
        "two reminders",
    )
    assert all(leader_token == token for _, leader_token in reminders), report(beats)
    assert len(STANDBY.findall(standby.log())) == 1, report(beats)
    assert LEADS.search(first.log()), report(beats)

    first.signal(signal.SIGTERM)
    wait_until(lambda: LEADS.search(standby.log()), LEASE + 5, "the standby to say it leads")
