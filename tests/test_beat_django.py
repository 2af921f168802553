"""django-celery-beat's ``DatabaseScheduler`` wrapped by the leader scheduler, for real: a small
Django project on SQLite (``tests/beatproj``), a ``PeriodicTask`` due every 2 s, two real
``celery beat`` processes (lease 2 s) on a redis-server of the test's own.

django-celery-beat keeps each task's last run in the database and writes it lazily (its
``sync``, every few minutes), so a standby that takes over cannot learn from the database what
the leader sent a moment ago. The leader's last-run records in Redis are what it learns from:
they must be current while the leader sends (the last send, not the one before or the database's
value), and a takeover by SIGKILL or SIGTERM must never send a tick twice (no two sends closer
than half the period, from both beats' logs).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from beatproj.env import DB_ENV, ENTRY, LOCK_DB, PERIOD_ENV, REDIS_ENV, TTL_ENV
from beatproj.harness import (
    ROOT,
    Beat,
    all_sends,
    close_pairs,
    leader,
    records,
    report,
    sends_since,
)
from celery_procs import redis_base
from lock_helpers import START_TIMEOUT, wait_until

from celery_singleton_lock.testing import RedisServer

pytestmark = [pytest.mark.faults, pytest.mark.slow, pytest.mark.timeout(START_TIMEOUT + 150)]

LEASE = 2.0
PERIOD = 2.0
LOCK = "beat:beatproj"
APP = "tests.beatproj.app"


@pytest.fixture
def django_world(make_redis_server: Any, tmp_path: Path) -> Iterator[tuple[list[Beat], Any]]:
    pytest.importorskip("django_celery_beat")
    server: RedisServer = make_redis_server()
    env = {
        REDIS_ENV: redis_base(server.port),
        DB_ENV: str(tmp_path / "beatproj.sqlite3"),
        TTL_ENV: str(LEASE),
        PERIOD_ENV: str(int(PERIOD)),
    }
    subprocess.run(
        [sys.executable, "-m", "tests.beatproj.prepare"],
        cwd=ROOT,
        env={**os.environ, **env, "PYTHONPATH": str(ROOT)},
        check=True,
        timeout=START_TIMEOUT,
    )
    client = redis.Redis(port=server.port, db=LOCK_DB, socket_timeout=5)
    beats = [Beat(APP, tmp_path, n, env) for n in (1, 2)]
    try:
        yield beats, client
    finally:
        for beat in beats:
            beat.stop()
        client.close()


def _record_matches_last_send(beats: list[Beat], client: Any) -> tuple[float, float] | None:
    """(last send, its record) when no send came between reading the two, else ``None``."""
    before = all_sends(beats, ENTRY)
    recorded = records(client, LOCK).get(ENTRY)
    after = all_sends(beats, ENTRY)
    if not before or before != after or recorded is None:
        return None
    return before[-1], recorded.timestamp()


def _last_send_and_record(beats: list[Beat], client: Any) -> tuple[float, float]:
    return wait_until(
        lambda: _record_matches_last_send(beats, client), 10, "a quiet moment to read the records"
    )


def _current(last_and_record: tuple[float, float]) -> bool:
    last, recorded = last_and_record
    # Recorded just before the send was logged (the log's clock has milliseconds).
    return last - 0.25 <= recorded <= last + 0.01


@pytest.mark.parametrize("fault", ["sigkill", "sigterm"])
def test_database_scheduler_takeover_sends_no_tick_twice(
    django_world: tuple[list[Beat], Any], fault: str
) -> None:
    beats, client = django_world
    first = wait_until(lambda: leader(beats, client, LOCK), START_TIMEOUT, "a beat to lead")
    standby = next(b for b in beats if b is not first)
    wait_until(lambda: len(all_sends(beats, ENTRY)) >= 3, 30, "three sends")
    while_leading = _last_send_and_record(beats, client)
    # Sent several times since it started: the database's value is stale by now. The fault
    # comes 0.6 of a period after the last send (the scenario's phase, not a synchronisation).
    wait_until(
        lambda: time.time() >= while_leading[0] + PERIOD * 0.6, PERIOD, "0.6 of a period", 0.02
    )

    started = time.time()
    if fault == "sigkill":
        os.killpg(first.pid, signal.SIGKILL)
    else:
        first.signal(signal.SIGTERM)
    wait_until(lambda: leader(beats, client, LOCK) is standby, LEASE + 5, "the standby to lead")
    took_over = time.time() - started
    wait_until(
        lambda: len(sends_since(beats, ENTRY, started + took_over)) >= 3,
        4 * PERIOD + 10,
        "three sends by the new leader",
    )
    after_takeover = _last_send_and_record(beats, client)
    text = report(beats)
    times = all_sends(beats, ENTRY)
    assert not close_pairs(times, PERIOD / 2), (close_pairs(times, PERIOD / 2), text)
    assert _current(while_leading), (while_leading, text)
    assert _current(after_takeover), (after_takeover, text)
    assert took_over < (2.0 if fault == "sigterm" else LEASE + 1.5), (took_over, text)
    assert standby.alive(), text
    assert not [t for t in first.sends(ENTRY) if t > started + 1.0], text
