"""RedBeat (celery-redbeat, ``redbeat.RedBeatScheduler``) wrapped by the leader scheduler, for
real: three ``celery beat`` processes of ``tests/beatproj/redbeat_app.py`` (set up as
docs/operating.md says: RedBeat's Redis, RedBeat named as the wrapped scheduler, nothing about
RedBeat's own lock), an entry due every second, a real ``celery worker`` running what they
send, on a redis-server of the test's own.

What went out is read from Redis, not from the logs: each beat records every message it
publishes (its pid, the time, the task id) and the worker every run.

* The leader is paused (SIGSTOP) past its lease, asleep between ticks or at the exact point
  between recording a send and publishing it; a standby leads within lease + 2 s (RedBeat's
  own lock does not hold it up); the paused beat, continued, steps down and publishes nothing
  (the send it had recorded is dropped, with our line, not published late); then the new
  leader is SIGKILLed and another beat leads within lease + 2 s. No tick goes out twice, the
  worker runs every message once, and no beat logs RedBeat's "Message Error".
* A send refused for lack of lease is held back with our line, not logged as RedBeat's
  "Sending due task" followed by "Message Error", and goes out later.
* Not RedBeat, the same seam: a wrapped scheduler whose tick calls ``apply_async()`` itself
  (``SelfPublishingScheduler``); its leader, paused between the record and the publish past
  its lease, publishes nothing when it wakes.
"""

from __future__ import annotations

import json
import os
import re
import signal
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import redis
from beatproj.env import (
    DATA_DB,
    LOCK_DB,
    PAUSE_CUE_ENV,
    PUBLISHED,
    RAN,
    REDBEAT_DB,
    REDBEAT_ENTRY,
    REDBEAT_QUEUE,
    REDIS_ENV,
    TTL_ENV,
    WRAPPED_ENV,
)
from beatproj.harness import (
    LEADER_SCHEDULER,
    SEND_LINE,
    Beat,
    close_pairs,
    holder,
    leader,
    log_time,
)
from celery_procs import WorkerProcess, redis_base
from lock_helpers import START_TIMEOUT, wait_until

from celery_singleton_lock.testing import RedisServer

pytestmark = [pytest.mark.faults, pytest.mark.slow, pytest.mark.timeout(START_TIMEOUT + 180)]

APP = "tests.beatproj.redbeat_app"
LOCK = "beat:rbproj"
PERIOD = 1.0
LEASE = 3.0
#: the longest a takeover may take after the leader stopped answering
TAKEOVER = LEASE + 2.0
SCHEDULERS = "tests.beatproj.schedulers"

PAUSED = re.compile(
    r"^\[(?P<ts>[\d-]+ [\d:,]+): WARNING/[^\]]+\] test: recorded rb-tick; pausing before its send",
    re.MULTILINE,
)
LEADS = re.compile(r"^\[(?P<ts>[\d-]+ [\d:,]+): INFO/[^\]]+\] beat \S+ leads now", re.MULTILINE)
STEPPED_DOWN = re.compile(r"beat \S+ is no longer the leader \(")
NOT_SENT = re.compile(r"beat \S+ did not send rb-tick: ")
LOCK_OFF = re.compile(r"beat \S+ turned RedBeat's own lock \(redbeat::lock\) off")
CUT = re.compile(r"test: cut the leader lock's lease to (?P<left>\d+) ms before recording rb-tick")
HELD_BACK = re.compile(
    r"beat \S+ holds a send back: rb-tick: only (?P<left>-?\d+) ms left on the lease"
)
#: what RedBeat logs for an error of a send, and for its own lock
REDBEAT_LINES = ("Message Error", "beat: Acquired lock", "beat: Extending lock")


class AppWorker(WorkerProcess):
    """A ``celery worker`` of RedBeat's app (solo pool: runs the ticks one by one)."""

    def command(self) -> list[str]:
        return [
            sys.executable, "-m", "celery", "-A", APP, "worker", "-P", "solo",
            "-n", self.hostname, "--without-mingle", "--without-gossip",
            "--without-heartbeat", "-l", "info", "-Q", REDBEAT_QUEUE,
        ]  # fmt: skip


@dataclass
class World:
    """The test's Redis, its clients, and a starter of RedBeat beats."""

    server: RedisServer
    tmp: Path
    env: dict[str, str]
    data: Any
    locks: Any
    beats: list[Beat] = field(default_factory=list)

    def start_beat(self, scheduler: str = LEADER_SCHEDULER) -> Beat:
        beat = Beat(APP, self.tmp, len(self.beats) + 1, self.env, scheduler)
        self.beats.append(beat)
        return beat

    def items(self, name: str) -> list[dict[str, Any]]:
        return [json.loads(raw) for raw in self.data.lrange(name, 0, -1)]

    def published(self, beats: list[Beat] | None = None, since: float = 0.0) -> list[float]:
        """When ``beats`` (all by default) published the entry's task, after ``since``."""
        pids = {b.pid for b in (self.beats if beats is None else beats)}
        return sorted(i["t"] for i in self.items(PUBLISHED) if i["pid"] in pids and i["t"] > since)

    def report(self) -> str:
        return (
            "\n".join(f"--- beat {b.n} (pid {b.pid}) ---\n{b.log()[-5000:]}" for b in self.beats)
            + f"\n--- published ---\n{self.items(PUBLISHED)}\n--- ran ---\n{self.items(RAN)}"
        )


@pytest.fixture
def world(make_redis_server: Any, tmp_path: Path) -> Iterator[World]:
    server: RedisServer = make_redis_server()
    base = redis_base(server.port)
    env = {
        REDIS_ENV: base,
        TTL_ENV: str(LEASE),
        PAUSE_CUE_ENV: str(tmp_path / "pause-cue"),
    }
    data = redis.Redis(port=server.port, db=DATA_DB, socket_timeout=5)
    locks = redis.Redis(port=server.port, db=LOCK_DB, socket_timeout=5)
    w = World(server, tmp_path, env, data, locks)
    try:
        yield w
    finally:
        for beat in w.beats:
            beat.stop()
        data.close()
        locks.close()


@pytest.fixture
def worker(world: World) -> Iterator[WorkerProcess]:
    proc = AppWorker(redis_base(world.server.port), world.tmp, env=world.env, pool="solo")
    proc.start()
    try:
        yield proc
    finally:
        proc.stop()


def _lead(world: World, among: list[Beat], timeout: float, what: str) -> Beat:
    return wait_until(
        lambda: (b := leader(world.beats, world.locks, LOCK)) in among and b, timeout, what, 0.05
    )


def _wait_sends(world: World, beat: Beat, since: float, n: int, what: str) -> None:
    wait_until(lambda: len(world.published([beat], since)) >= n, n * PERIOD + 15, what, 0.1)


@pytest.mark.parametrize("pause", ["asleep", "mid-send"])
def test_redbeat_takeovers_send_no_tick_twice(
    world: World, worker: WorkerProcess, pause: str
) -> None:
    scheduler = f"{SCHEDULERS}:PauseOnCueLeaderScheduler" if pause == "mid-send" else ""
    first = world.start_beat(scheduler or LEADER_SCHEDULER)
    _lead(world, [first], 60, "the first beat to lead")
    others = [world.start_beat(scheduler or LEADER_SCHEDULER) for _ in range(2)]
    wait_until(
        lambda: all("stands by" in b.log() for b in others), 60, "the others to stand by", 0.1
    )
    _wait_sends(world, first, 0.0, 3, "three sends by the first leader")

    # 1. The leader pauses past its lease: asleep between ticks, or right after it recorded a
    # send (the cue: the next send it records), before it publishes it.
    if pause == "asleep":
        paused_at = time.time()
        os.killpg(first.pid, signal.SIGSTOP)
    else:
        Path(world.env[PAUSE_CUE_ENV]).touch()
        line = wait_until(lambda: PAUSED.search(first.log()), 15, "the leader to pause mid-send")
        paused_at = log_time(line["ts"])
    second = _lead(world, others, TAKEOVER + 10, "a standby to lead")
    first_takeover = time.time() - paused_at
    _wait_sends(world, second, paused_at, 3, "three sends by the second leader")

    # 2. The paused beat wakes: it must publish nothing (its lease ran out), and step down.
    woke_at = len(first.log())
    os.killpg(first.pid, signal.SIGCONT)
    wait_until(
        lambda: STEPPED_DOWN.search(first.log()[woke_at:]), 15, "the woken beat to step down"
    )
    _wait_sends(world, second, time.time(), 2, "two more sends by the second leader")

    # 3. The new leader dies: another beat (the woken one or the third) leads.
    killed_at = time.time()
    os.killpg(second.pid, signal.SIGKILL)
    third = _lead(
        world, [b for b in world.beats if b is not second], TAKEOVER + 10, "a beat to lead"
    )
    second_takeover = time.time() - killed_at
    _wait_sends(world, third, killed_at, 3, "three sends by the third leader")
    for beat in world.beats:
        beat.stop()

    # Every message published ran once on the worker, and only those.
    published = world.items(PUBLISHED)
    ids = [i["id"] for i in published]
    wait_until(lambda: {i["id"] for i in world.items(RAN)} >= set(ids), 20, "every message to run")
    ran = [i["id"] for i in world.items(RAN)]
    text = world.report()
    assert len(ids) == len(set(ids)) and sorted(ran) == sorted(ids), text

    times = world.published()
    assert not close_pairs(times, PERIOD / 2), (close_pairs(times, PERIOD / 2), text)
    assert first_takeover < TAKEOVER, (first_takeover, text)
    assert second_takeover < TAKEOVER, (second_takeover, text)
    # the paused beat published nothing from its pause until the second leader died
    late = [t for t in world.published([first], paused_at) if t < killed_at]
    assert not late, (late, text)
    woken = first.log()[woke_at:]
    if pause == "mid-send":
        # the send it had recorded is dropped, and it says so (before it steps down)
        refused = NOT_SENT.search(woken)
        stepped = STEPPED_DOWN.search(woken)
        assert refused is not None and stepped is not None, text
        assert refused.start() < stepped.start(), text
        assert not SEND_LINE.search(woken[: stepped.start()]), text
    # RedBeat's lock is off in every beat, and nothing failed as RedBeat's error
    assert all(LOCK_OFF.search(b.log()) for b in world.beats), text
    rb = redis.Redis(port=world.server.port, db=REDBEAT_DB, socket_timeout=5)
    try:
        assert not rb.keys("*lock*"), (rb.keys("*lock*"), text)
        assert rb.exists(f"redbeat:{REDBEAT_ENTRY}"), text  # RedBeat did run the schedule
    finally:
        rb.close()
    for unwanted in (*REDBEAT_LINES, "Traceback", "beat raised exception"):
        assert unwanted not in text, (unwanted, text)


def test_redbeat_send_with_too_little_lease_is_held_back_with_our_line(world: World) -> None:
    # Lease 12 s: a margin of 3 s; the lease is cut to 1.5 s in Redis at the first send.
    lease = 12.0
    world.env[TTL_ENV] = str(lease)
    beat = world.start_beat(f"{SCHEDULERS}:ShortLeaseLeaderScheduler")
    cut = wait_until(lambda: CUT.search(beat.log()), START_TIMEOUT, "the leader to cut its lease")

    def after() -> str:
        return beat.log()[cut.end() :]

    outcome = wait_until(
        lambda: min(
            [m for p in (HELD_BACK, SEND_LINE) if (m := p.search(after()))],
            key=lambda m: m.start(),
            default=None,
        ),
        15,
        "the leader to send or hold the send back",
    )
    text = world.report()
    assert outcome.re is HELD_BACK, f"logged as sent with too little lease left:\n{text}"
    assert 0 <= int(outcome["left"]) <= int(cut["left"]), text
    # nothing went out until the lease was long enough again, and then the entry did
    wait_until(lambda: SEND_LINE.search(after()), lease + 10, "a send after it")
    first_send = log_time(SEND_LINE.search(after())["ts"])  # type: ignore[index]
    wait_until(world.published, 10, "the send to be published", 0.05)
    text = world.report()
    # (a publish is recorded after its line, whose time the log gives to the millisecond)
    assert not [t for t in world.published() if t < first_send - 0.002], text
    for unwanted in (*REDBEAT_LINES, "Traceback", "beat raised exception"):
        assert unwanted not in text, (unwanted, text)
    assert beat.alive(), text


def test_a_wrapped_scheduler_that_publishes_by_itself_sends_nothing_after_a_pause(
    world: World,
) -> None:
    # Not RedBeat: any wrapped scheduler whose tick calls apply_async() itself. The leader
    # pauses right after its first record, and wakes once its lease has run out in Redis.
    world.env[WRAPPED_ENV] = f"{SCHEDULERS}:SelfPublishingScheduler"
    Path(world.env[PAUSE_CUE_ENV]).touch()
    beat = world.start_beat(f"{SCHEDULERS}:PauseOnCueLeaderScheduler")
    wait_until(
        lambda: PAUSED.search(beat.log()), START_TIMEOUT, "the leader to pause mid-send", 0.05
    )
    wait_until(lambda: not holder(world.locks, LOCK), LEASE + 5, "its lease to end", 0.05)
    woke_at = len(beat.log())
    os.killpg(beat.pid, signal.SIGCONT)
    # it leads again (alone) and sends: whatever it published before that was the stale send
    releads = wait_until(
        lambda: LEADS.search(beat.log()[woke_at:]), 15, "the woken beat to lead again", 0.05
    )
    relead_at = log_time(releads["ts"])
    wait_until(lambda: world.published(since=relead_at), 10, "a send after it", 0.1)
    text = world.report()
    stale = [t for t in world.published() if t < relead_at]
    assert not stale, f"the woken leader published past its lease: {stale}\n{text}"
    assert NOT_SENT.search(beat.log()[woke_at:]), text
    assert beat.alive() and "beat raised exception" not in text, text
