"""Recent counts (setting ``singleton_lock_counts``): duplicates, refusals and lost locks
counted per minute in Redis by real ``celery worker`` subprocesses (prefork: the pool children
count and write), or by this process (an eager run refused), read back by
:func:`recent_counts`.

* a duplicate skipped for a limit, a cooldown or a rate is counted, with its refusal's reason,
  within the flush interval (each check waits for the exact counts with ``wait_until``); a
  run whose lock an operator force-released counts as lost;
* only the window's minutes are counted;
* with ``singleton_lock_counts=False`` nothing is written (checked after the worker's warm
  shutdown, which writes what is left: the same shutdown writes them with the setting on);
* a write that Redis fails keeps the counts, written once the server is back;
* a settings reload keeps the counter with the client, or writes its counts at once;
* ``close(app)`` writes what the app counted and ends its writer thread (a later count starts
  one again);
* the counts' keys are never a lock nor a limiter to ``locks list``.
"""

from __future__ import annotations

import contextlib
import logging
import re
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import faultapp
import pytest
import redis
from celery import Celery
from celery_procs import WorkerProcess, close_app, new_job, redis_base
from faultapp import DATA_DB, LOCK_DB
from lock_helpers import START_TIMEOUT, server_time, wait_until
from redis.backoff import NoBackoff
from redis.retry import Retry

from celery_singleton_lock import (
    LockBackendError,
    LockSpace,
    RecentCounts,
    close,
    recent_counts,
    reload_settings,
)
from celery_singleton_lock.lock import LockState
from celery_singleton_lock.testing import RedisServer, free_port

pytestmark = [pytest.mark.timeout(START_TIMEOUT + 120)]


@pytest.fixture(scope="module")
def server() -> Iterator[RedisServer]:
    with RedisServer() as server:
        yield server


@pytest.fixture(scope="module")
def app(server: RedisServer) -> Iterator[Celery]:
    app = faultapp.make_app(redis_base(server.port))
    try:
        yield app
    finally:
        close_app(app)


@pytest.fixture(scope="module")
def worker(server: RedisServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    log_dir = tmp_path_factory.mktemp("counts")
    with WorkerProcess(redis_base(server.port), log_dir, concurrency=3) as worker:
        yield worker


def _refuse(app: Celery, calls: int = 1) -> None:
    """``calls`` calls of ``fault.limited`` (``lock_limit=3``) refused for the limit, in this
    process: eager runs of a job whose three slots others hold. Each counts a refusal
    (``limit``) and a duplicate skipped."""
    task = app.tasks["fault.limited"]
    job = new_job("refused")
    space = task.lock_space(app)
    name = space.keys_of(task.lock_key_for(job)).name
    for holder in range(3):
        assert space.named(name, 3).take(f"other-{holder}", 30).acquired
    for _ in range(calls):
        assert task.apply((job,)).state == "IGNORED"


def _held(client: Any) -> list[LockState]:
    """The held locks under the default prefix, as ``locks list`` reads them."""
    space = LockSpace(client)
    return [state for state in space.inspect_many(list(space.find())) if state.held]


def _flat(counts: RecentCounts) -> dict[str, int]:
    flat = {f"duplicates:{k}": v for k, v in counts.duplicates.items()}
    flat |= {f"refusals:{k}": v for k, v in counts.refusals.items()}
    return flat | {"lost": counts.lost}


def _reach(client: Any, before: dict[str, int], **more: int) -> dict[str, int]:
    """Wait until the counts are ``before`` plus ``more`` (``refusals_limit=1``), exactly."""
    wanted = dict(before)
    for name, n in more.items():
        key = name.replace("_", ":", 1)
        wanted[key] += n
    seen: dict[str, int] = {}

    def reached() -> bool:
        seen.update(_flat(recent_counts(client)))
        return seen == wanted

    try:
        wait_until(reached, 10, "the counts to be written")
    except AssertionError as exc:
        raise AssertionError(f"{exc}: wanted {wanted}, read {seen}") from exc
    return seen


@pytest.mark.slow  # `celery worker` subprocesses
def test_duplicates_and_refusals_are_counted(
    server: RedisServer, app: Celery, worker: WorkerProcess
) -> None:
    locks, data = server.client(db=LOCK_DB), server.client(db=DATA_DB)
    now = _flat(recent_counts(locks))

    # lock_limit=2: a third call while two run is skipped for the limit
    limited = app.tasks["fault.limited_long"]
    job = new_job("count-limit")
    running = [limited.delay(job, 3.0) for _ in range(2)]
    wait_until(lambda: data.llen(f"starts:{job}") == 2, 20, "two runs to start")
    third = limited.delay(job)
    wait_until(lambda: third.state == "SKIPPED", 20, "the third call's skip")
    assert third.info["reason"] == "limit"
    now = _reach(locks, now, duplicates_skipped=1, refusals_limit=1)

    # lock_cooldown: a call just after a run's end is skipped for the cooldown
    cooled = app.tasks["fault.cooled"]
    job = new_job("count-cool")
    assert cooled.delay(job).get(timeout=20)
    too_soon = cooled.delay(job)
    wait_until(lambda: too_soon.state == "SKIPPED", 20, "the cooldown's skip")
    assert too_soon.info["reason"] == "cooldown"
    now = _reach(locks, now, duplicates_skipped=1, refusals_cooldown=1)

    # lock_rate="1/m" and no waiting: a second start within the minute is skipped
    rated = app.tasks["fault.rated_impatient"]
    job = new_job("count-rate")
    assert rated.delay(job, 0).get(timeout=20)
    second = rated.delay(job, 1)
    wait_until(lambda: second.state == "SKIPPED", 20, "the rate's skip")
    assert second.info["reason"] == "rate"
    now = _reach(locks, now, duplicates_skipped=1, refusals_rate=1)

    # a run whose lock is force-released under it: lost
    short = app.tasks["fault.short_lease"]
    job = new_job("count-lost")
    run = short.delay(job, 1.0)
    wait_until(lambda: data.llen(f"starts:{job}") == 1, 20, "the run to start")
    (held,) = [state for state in _held(locks) if state.holder == run.id]
    assert LockSpace(locks).force_release(held.keys.lock)
    assert run.get(timeout=20)["lost"]
    _reach(locks, now, lost=1)
    for call in running:
        call.get(timeout=20)

    # the counts' keys are neither locks nor limiters
    assert locks.keys("lock:counts:*")
    assert all(":counts:" not in state.keys.lock for state in _held(locks))
    assert not any("counts" in keys.lock for keys in LockSpace(locks).find())
    assert not any("counts" in r.name for r in LockSpace(locks).rate_limiters())


def test_only_the_window_is_counted(server: RedisServer) -> None:
    client = server.client(db=LOCK_DB)
    minute = int(server_time(client) // 60)
    for ago, n in ((0, 1), (59, 2), (60, 4), (90, 8)):
        # the counts of a minute: the hash `<prefix>:counts:<epoch minute>` (docs/operating.md)
        client.hincrby(f"window:counts:{minute - ago}", "refusals:limit", n)
    assert recent_counts(client, "window").refusals["limit"] == 3
    assert recent_counts(client, "window", minutes=61).refusals["limit"] == 7
    assert recent_counts(client, "window", minutes=120).refusals["limit"] == 15
    assert recent_counts(client, "window", minutes=1).refusals["limit"] == 1
    assert recent_counts(client, "nothing-here").total_duplicates() == 0
    dead = redis.Redis(port=free_port(), socket_connect_timeout=0.5, retry=Retry(NoBackoff(), 0))
    with pytest.raises(LockBackendError, match="read the counts under prefix 'lock'"):
        recent_counts(dead)
    for bad in (0, 121, 1.5, "60"):
        with pytest.raises(ValueError, match="minutes must be an int from 1 to 120"):
            recent_counts(client, "window", minutes=bad)  # type: ignore[arg-type]


@pytest.mark.slow
@pytest.mark.parametrize("on", [True, False], ids=["on", "off"])
def test_the_setting_off_writes_nothing(tmp_path: Path, on: bool) -> None:
    """The cooldown's skip, then the worker's warm shutdown (which writes what is pending)."""
    with RedisServer() as own:
        app = faultapp.make_app(redis_base(own.port))
        env = {} if on else {faultapp.COUNTS_ENV: "0"}
        try:
            with WorkerProcess(redis_base(own.port), tmp_path, concurrency=1, env=env):
                cooled = app.tasks["fault.cooled"]
                job = new_job("count-setting")
                assert cooled.delay(job).get(timeout=20)
                too_soon = cooled.delay(job)
                wait_until(lambda: too_soon.state == "SKIPPED", 20, "the cooldown's skip")
            locks = own.client(db=LOCK_DB)
            found = recent_counts(locks)
            assert (found.refusals["cooldown"], found.duplicates["skipped"]) == (on, on)
            assert bool(locks.keys("*:counts:*")) is on
        finally:
            close_app(app)


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def test_a_failed_write_keeps_the_counts(tmp_path: Path) -> None:
    """The writer of this process, against a redis-server stopped (just after the counts,
    before the writer's next write, about a second later) and started again."""
    own = RedisServer().start()
    app = faultapp.make_app(redis_base(own.port))
    records = _Records()
    logging.getLogger("celery_singleton_lock.counts").addHandler(records)
    # this app's writer's (another test's app may log its own failures meanwhile)
    port = f":{own.port}."
    try:
        made = 0
        for _ in range(3):
            _refuse(app, 3)
            made += 3
            own.stop()
            with contextlib.suppress(AssertionError):
                wait_until(lambda: [m for m in records.messages if port in m], 5, "a failure")
            if any(port in m for m in records.messages):
                break
            own.start()  # a loaded machine let the writer write before the stop: again
        ours = [m for m in records.messages if port in m]
        assert ours, "the writer wrote each time before the server stopped"
        assert re.search(r"could not write \d+ lock counts to Redis", ours[0]), ours[0]
        own.start()
        locks = own.client(db=LOCK_DB)
        # the writer backs off while Redis fails: up to a few seconds before the next try
        wait_until(lambda: recent_counts(locks).refusals["limit"] == made, 30, "the counts")
        assert recent_counts(locks).duplicates["skipped"] == made
    finally:
        logging.getLogger("celery_singleton_lock.counts").removeHandler(records)
        close_app(app)
        own.stop()


def test_a_reload_keeps_the_counts_with_the_client_or_writes_them(server: RedisServer) -> None:
    """``reload_settings`` with the same client: counting goes on; with another client
    (another Redis URL): what was counted is written at the app's next use, at once, not at
    the thread's next write (about a second later)."""
    app = faultapp.make_app(redis_base(server.port))
    app.conf.singleton_lock_prefix = prefix = new_job("reload")  # counts of this test's own
    locks = server.client(db=LOCK_DB)
    try:
        _refuse(app)
        reload_settings(app)
        _refuse(app)
        app.conf.singleton_lock_redis_url = f"{redis_base(server.port)}/{DATA_DB}"
        reload_settings(app)
        app.tasks["fault.limited"].lock_key_for("next-use")  # reads the settings again
        assert recent_counts(locks, prefix).refusals["limit"] == 2
    finally:
        close_app(app)


def _writers() -> set[threading.Thread]:
    """The counts writer threads alive in this process (of every app)."""
    return {t for t in threading.enumerate() if t.name == "celery-singleton-lock-counts"}


def test_close_writes_the_counts_and_ends_the_writer(server: RedisServer) -> None:
    """``close(app)``: what the app counted is in Redis when it returns (not a writer's
    interval later), and the thread that writes it has ended; a later count starts another,
    which writes as before. An app that never counted closes with nothing to write."""
    app = faultapp.make_app(redis_base(server.port))
    app.conf.singleton_lock_prefix = prefix = new_job("close")  # counts of this test's own
    locks = server.client(db=LOCK_DB)
    try:
        close(app)  # nothing counted yet (no client made): nothing to do
        before = _writers()
        _refuse(app)
        (first,) = _writers() - before  # started by the first count
        assert close(app) is True  # Redis took them
        assert not first.is_alive()
        counted = recent_counts(locks, prefix)
        assert (counted.refusals["limit"], counted.duplicates["skipped"]) == (1, 1)

        _refuse(app)
        (second,) = _writers() - before
        wait_until(lambda: recent_counts(locks, prefix).refusals["limit"] == 2, 10, "the write")
        close(app)
        close(app)  # again: nothing left to do
        assert not second.is_alive()
        assert recent_counts(locks, prefix).refusals["limit"] == 2
    finally:
        close_app(app)


def test_close_says_when_redis_did_not_take_the_counts() -> None:
    """``close(app)`` against a stopped Redis: ``False``, the counts kept; once Redis is back,
    the next ``close`` writes them and says so."""
    own = RedisServer().start()
    app = faultapp.make_app(redis_base(own.port))
    try:
        _refuse(app)
        own.stop()  # before the writer's next write, about a second later
        assert close(app) is False
        own.start()
        assert close(app) is True
        assert recent_counts(own.client(db=LOCK_DB)).refusals["limit"] == 1
    finally:
        close_app(app)
        own.stop()
