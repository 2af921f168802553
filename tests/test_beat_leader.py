"""Beat that cannot run twice (issue 9, SPEC §7): two real ``celery beat`` processes with
``-S celery_singleton_lock.beat:LeaderScheduler`` on one schedule (``fault.tick`` every second),
leader lease 3 s. One sends, the other stands by; when the leader is SIGKILLed, stopped
(SIGTERM) or paused past its lease (SIGSTOP), the other takes over within one lease, and no
tick is sent twice: no two sends closer than half the schedule's period, and a paused leader
sends nothing when it wakes.

Sends are seen as the broker's queue grows (no worker consumes it), polled every 20 ms.
"""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from celery_procs import ROOT, redis_base, wait_for
from faultapp import BEAT_ENV, BROKER_DB, LOCK_DB, TTL_ENV, URL_ENV

from celery_singleton_lock._lock import LockSpace
from celery_singleton_lock.testing import RedisServer

pytestmark = [pytest.mark.faults, pytest.mark.slow, pytest.mark.timeout(180)]

LEASE = 3.0
PERIOD = 1.0


class Beat:
    """One ``celery beat`` subprocess with the leader scheduler, its own schedule file."""

    def __init__(self, base: str, tmp: Path, n: int) -> None:
        env = {
            **os.environ,
            URL_ENV: base,
            BEAT_ENV: "1",
            TTL_ENV: str(LEASE),
            "PYTHONPATH": str(ROOT),
            "PYTHONUNBUFFERED": "1",
        }
        self.log_path = tmp / f"beat-{n}.log"
        self._log = open(self.log_path, "wb")  # noqa: SIM115 - closed in stop()
        command = [
            sys.executable, "-m", "celery", "-A", "tests.faultapp", "beat",
            "-S", "celery_singleton_lock.beat:LeaderScheduler",
            "-s", str(tmp / f"schedule-{n}"), "-l", "info",
        ]  # fmt: skip
        self.proc = subprocess.Popen(
            command,
            cwd=ROOT,
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGCONT)
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)
        self._log.close()


class Sends:
    """The times at which the broker's queue grew (one beat send each)."""

    def __init__(self, broker: Any) -> None:
        self.broker = broker
        self.times: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        seen = 0
        while not self._stop.is_set():
            length = int(self.broker.llen("fault"))
            now = time.monotonic()
            self.times.extend([now] * (length - seen))
            seen = max(seen, length)
            time.sleep(0.02)

    def since(self, t: float) -> int:
        return sum(1 for s in self.times if s > t)

    def stop(self) -> list[float]:
        self._stop.set()
        self._thread.join(5)
        return self.times


@pytest.fixture
def world(make_redis_server: Any, tmp_path: Path) -> Iterator[tuple[list[Beat], Sends, LockSpace]]:
    server: RedisServer = make_redis_server()
    base = redis_base(server.port)
    space = LockSpace(redis.Redis(port=server.port, db=LOCK_DB))
    sends = Sends(redis.Redis(port=server.port, db=BROKER_DB))
    beats = [Beat(base, tmp_path, 1), Beat(base, tmp_path, 2)]
    try:
        yield beats, sends, space
    finally:
        sends.stop()
        for beat in beats:
            beat.stop()


def _leader(beats: list[Beat], space: LockSpace) -> Beat | None:
    holder = space.inspect("beat:faultapp").holder
    for beat in beats:
        if holder and f":{beat.proc.pid}:" in holder:
            return beat
    return None


def _assert_no_double_send(times: list[float], report: str) -> None:
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert all(gap > PERIOD / 2 for gap in gaps), (gaps, report)


def _report(beats: list[Beat]) -> str:
    return "\n".join(f"--- beat {b.proc.pid} ---\n{b.log()[-3000:]}" for b in beats)


@pytest.mark.parametrize("fault", ["sigkill", "sigterm", "sigstop"])
def test_one_beat_sends_and_the_other_takes_over(
    world: tuple[list[Beat], Sends, LockSpace], fault: str
) -> None:
    beats, sends, space = world
    leader = wait_for(lambda: _leader(beats, space), 30, "a beat to lead")
    standby = next(b for b in beats if b is not leader)
    wait_for(lambda: len(sends.times) >= 3, 20, "three sends")

    started = time.monotonic()
    if fault == "sigkill":
        os.killpg(leader.proc.pid, signal.SIGKILL)
    elif fault == "sigterm":
        leader.proc.send_signal(signal.SIGTERM)
    else:
        os.killpg(leader.proc.pid, signal.SIGSTOP)
    wait_for(lambda: _leader(beats, space) is standby, LEASE + 5, "the standby to lead")
    took_over = time.monotonic() - started
    wait_for(lambda: sends.since(started + took_over) >= 3, 20, "three sends by the new leader")
    if fault == "sigstop":
        os.killpg(leader.proc.pid, signal.SIGCONT)  # wakes past its lease: must send nothing
        time.sleep(2 * PERIOD)
    times = sends.stop()
    report = _report(beats)
    limit = 2.0 if fault == "sigterm" else LEASE + 1.5  # a stopped leader hands over at once
    assert took_over < limit, (took_over, report)
    _assert_no_double_send(times, report)
    if fault == "sigstop":
        assert "is no longer the leader" in leader.log(), report
