"""The Redis of the locks hangs (the server is SIGSTOPped: connections are accepted and then
nothing answers, unlike a server that is down and refuses them), while the broker and the result
backend live on another server and work.

A hung Redis is the slow fault: every wait runs into a socket timeout instead of a refusal. With
the package's defaults a publish, a run's start and a run's release must each give up within the
socket timeout plus a second (one backend deadline for the whole call, retries included), then
settle what they left open (the cancel of an acquire whose reply was lost, the release of a
finished run) in the background, so that once the server answers again no lock is left held by
nobody. ``singleton_lock_on_backend_error`` decides, for the publish and for the run's start,
whether the task goes on without the lock or fails.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from celery_fixtures import CeleryEnv, Gates, app_task, celery_env, new_app
from lock_helpers import stopped, wait_until
from redis.backoff import NoBackoff

from celery_singleton_lock import LockBackendError, LockedTask, ReentrantLock, reload_settings
from celery_singleton_lock.lock import DeadlineRetry
from celery_singleton_lock.testing import RedisServer

# the adversarial fault suite (`pytest -m faults`): a real server stalled with SIGSTOP
pytestmark = pytest.mark.faults

#: the socket timeout of the clients the package builds (make_client's default)
SOCKET_TIMEOUT = 5.0
#: what a publish, a run's start or a release may take against a hung Redis
BOUND = SOCKET_TIMEOUT + 1.0
#: the lock database on the lock server
DB = 2

gates = Gates()
app = new_app("csl_hung")


@app_task(app, base=LockedTask, name="hung.pub", lock_at="publish")
def pub(key: str) -> str:
    gates.mark(key)
    return key


@app_task(app, base=LockedTask, name="hung.run")
def run(key: str) -> str:
    gates.mark(key)
    return key


@app_task(app, base=LockedTask, name="hung.held")
def held(key: str) -> str:
    gates.enter(key)
    return key


@pytest.fixture(scope="module")
def lock_server() -> Iterator[RedisServer]:
    """The server of the locks alone: stopping it leaves the broker and the results alone."""
    server = RedisServer().start()
    try:
        yield server
    finally:
        if server.process is not None:
            os.kill(server.process.pid, signal.SIGCONT)
        server.stop()
        shutil.rmtree(server.dir, ignore_errors=True)


@pytest.fixture(scope="module")
def env(lock_server: RedisServer) -> Iterator[CeleryEnv]:
    # The package's defaults for the lock client: no redis options, no backend timeout set.
    with celery_env(
        app,
        gates,
        concurrency=4,
        singleton_lock_redis_url=f"redis://127.0.0.1:{lock_server.port}/{DB}",
    ) as env:
        yield env


@pytest.fixture
def locks(lock_server: RedisServer) -> Iterator[Any]:
    client = lock_server.client(db=DB)
    yield client
    client.close()


def warm_up(env: CeleryEnv) -> None:
    """One locked publish and run end to end: the lock client's connections are open (a hung
    server accepts new ones too, but then the handshake waits as a command does)."""
    k = uuid.uuid4().hex
    assert pub.delay(k).get(timeout=10) == k


def report(
    figure: str,
    seconds: float,
    record_property: Callable[[str, object], None],
    bound: float = BOUND,
) -> None:
    """Print (``pytest -s``) and record (``--junitxml``) a measured time and its bound."""
    print(f"\n{figure}: {seconds:.2f} s (bound {bound:.1f} s)")
    record_property(figure, round(seconds, 3))


def test_a_publish_raises_within_the_socket_timeout_and_leaves_no_lock(
    env: CeleryEnv,
    lock_server: RedisServer,
    locks: Any,
    policy: Callable[[str], None],
    record_property: Callable[[str, object], None],
) -> None:
    policy("raise")
    warm_up(env)
    k = uuid.uuid4().hex
    key = pub.lock_key_for(k)
    with stopped(lock_server):
        started = time.monotonic()
        with pytest.raises(LockBackendError):
            pub.delay(k)
        elapsed = time.monotonic() - started
    report(".delay() against a stopped Redis raised after", elapsed, record_property)
    assert elapsed <= BOUND
    # The stalled server ran the acquire (it was in its socket buffer) when it woke up: the
    # cancel that went on in the background undoes it, long before its queue lease would end.
    wait_until(lambda: not locks.exists(key), timeout=10)
    assert gates.runs[k] == 0  # nothing was sent
    assert pub.delay(k).get(timeout=10) == k  # the job is free: a new publish runs it


def test_proceed_publishes_and_runs_without_the_lock_within_the_bound(
    env: CeleryEnv,
    lock_server: RedisServer,
    locks: Any,
    policy: Callable[[str], None],
    caplog: pytest.LogCaptureFixture,
    record_property: Callable[[str, object], None],
) -> None:
    policy("proceed")
    warm_up(env)
    caplog.set_level(logging.ERROR, logger="celery_singleton_lock")
    k = uuid.uuid4().hex
    with stopped(lock_server):
        started = time.monotonic()
        result = pub.delay(k)
        published = time.monotonic() - started
        # the worker's run start meets the same hung Redis, and goes on as well
        assert result.get(timeout=2 * BOUND + 2) == k
        ran = time.monotonic() - started
    report("proceed: .delay() against a stopped Redis returned after", published, record_property)
    report("proceed: publish + run start against a stopped Redis", ran, record_property, 2 * BOUND)
    assert published <= BOUND
    assert ran <= 2 * BOUND
    assert gates.runs[k] == 1
    loggers = {
        rec.name
        for rec in caplog.records
        if rec.levelno >= logging.ERROR and "WITHOUT the lock" in rec.getMessage()
    }
    assert {"celery_singleton_lock.publish", "celery_singleton_lock.run"} <= loggers
    wait_until(lambda: not locks.exists(pub.lock_key_for(k)), timeout=10)


def test_a_run_start_fails_within_the_bound_and_leaves_no_lock(
    env: CeleryEnv,
    lock_server: RedisServer,
    locks: Any,
    policy: Callable[[str], None],
    record_property: Callable[[str, object], None],
) -> None:
    policy("raise")
    warm_up(env)
    k = uuid.uuid4().hex
    with stopped(lock_server):
        started = time.monotonic()
        result = run.delay(k)  # lock_at="run": the publish does not touch Redis
        env.wait_state(result.id, "FAILURE", timeout=BOUND + 5)
        failed = time.monotonic() - started
    report("run start against a stopped Redis failed after", failed, record_property)
    assert failed <= BOUND + 0.5  # the delivery and the stored failure take a little too
    assert isinstance(result.result, LockBackendError)
    assert gates.runs[k] == 0
    wait_until(lambda: not locks.exists(run.lock_key_for(k)), timeout=10)


def test_proceed_runs_without_the_lock_within_the_bound(
    env: CeleryEnv,
    lock_server: RedisServer,
    policy: Callable[[str], None],
    record_property: Callable[[str, object], None],
) -> None:
    policy("proceed")
    warm_up(env)
    k = uuid.uuid4().hex
    with stopped(lock_server):
        started = time.monotonic()
        assert run.delay(k).get(timeout=BOUND + 5) == k
        ran = time.monotonic() - started
    report("proceed: run start against a stopped Redis ran after", ran, record_property)
    assert ran <= BOUND + 0.5
    assert gates.runs[k] == 1


def test_a_release_at_the_end_of_a_run_is_bounded_then_done_in_the_background(
    env: CeleryEnv,
    lock_server: RedisServer,
    locks: Any,
    policy: Callable[[str], None],
    record_property: Callable[[str, object], None],
) -> None:
    policy("raise")
    warm_up(env)
    k = uuid.uuid4().hex
    key = held.lock_key_for(k)
    result = held.delay(k)
    gates.wait_started(k)
    assert locks.exists(key)
    with stopped(lock_server):
        started = time.monotonic()
        gates.open(k)  # the body returns: the run's release meets the hung Redis
        env.wait_state(result.id, "SUCCESS", timeout=BOUND + 5)
        finished = time.monotonic() - started
    report("release at a run's end against a stopped Redis took", finished, record_property)
    assert finished <= BOUND + 0.5
    # The lease (singleton_lock_ttl, 30 s) is far off: the release sent again in the
    # background frees the lock as soon as the server answers.
    woke = time.monotonic()
    wait_until(lambda: not locks.exists(key), timeout=10)
    assert time.monotonic() - woke < 10


def test_a_shorter_backend_timeout_cuts_the_wait_for_a_reply(
    env: CeleryEnv,
    lock_server: RedisServer,
    locks: Any,
    policy: Callable[[str], None],
    record_property: Callable[[str, object], None],
) -> None:
    # The client is made again with a 1 s socket timeout: the deadline ends the call before
    # the 5 s socket timeout would.
    policy("raise")
    warm_up(env)
    env.app.conf.singleton_lock_backend_timeout = 1.0
    reload_settings(env.app)
    try:
        k = uuid.uuid4().hex
        with stopped(lock_server):
            started = time.monotonic()
            with pytest.raises(LockBackendError):
                pub.delay(k)
            elapsed = time.monotonic() - started
        report(
            "singleton_lock_backend_timeout=1: .delay() raised after", elapsed, record_property, 1.5
        )
        assert 1.0 <= elapsed <= 1.5
        wait_until(lambda: not locks.exists(pub.lock_key_for(k)), timeout=10)
    finally:
        env.app.conf.singleton_lock_backend_timeout = None  # back to the default
        reload_settings(env.app)


def test_a_bad_backend_timeout_names_the_setting(env: CeleryEnv) -> None:
    env.app.conf.singleton_lock_backend_timeout = 0
    reload_settings(env.app)
    try:
        with pytest.raises(ValueError, match="singleton_lock_backend_timeout"):
            pub.delay(uuid.uuid4().hex)
    finally:
        env.app.conf.singleton_lock_backend_timeout = None
        reload_settings(env.app)


# -- the lock layer alone --------------------------------------------------------------------


def test_a_lock_with_a_backend_timeout_bounds_the_resends_of_its_client(
    make_redis_server: Callable[..., RedisServer],
) -> None:
    """A client of the user's own with a DeadlineRetry that would resend 20 times and a 0.4 s
    socket timeout (about 8 s in all): the lock's operation ends at its deadline, and the
    acquire the stalled server runs when it wakes is cancelled in the background. (One wait for
    a reply is bounded by the socket timeout only.)"""
    server = make_redis_server()
    client = redis.Redis(
        port=server.port,
        socket_timeout=0.4,
        socket_connect_timeout=0.4,
        retry=DeadlineRetry(NoBackoff(), 20),
    )
    lock = ReentrantLock(client, "hung-lock", ttl=30, backend_timeout=1.0)
    assert lock.acquire(blocking=False)
    lock.release()
    with stopped(server):
        started = time.monotonic()
        with pytest.raises(LockBackendError) as info:
            lock.acquire(blocking=False)
        elapsed = time.monotonic() - started
    # At least one socket timeout; at most the deadline and the wait for a reply in progress
    # (redis-py before 5.1 resends a timed-out read less often than later ones: 0.8 s there).
    assert 0.4 <= elapsed <= 1.5, elapsed
    assert isinstance(info.value.__cause__, redis.TimeoutError)
    assert lock.hold_count == 0
    wait_until(lambda: not client.exists(lock.key), timeout=10)
    assert lock.acquire(blocking=False)
    lock.release()
