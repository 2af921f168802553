"""Where ``lock_at="queue"``, retries, ``lock_cooldown`` and ``lock_rate`` meet, on real prefork
workers (``celery worker`` subprocesses) and a real Redis.

The rules, as these tests check them:

* A parked hold is the job's place: a queue-mode run that retries (``self.retry()``,
  ``autoretry_for``), pauses for a rate limit (``RateLimited``) or is delivered again after its
  pool process died (``acks_late`` + ``reject_on_worker_lost``) while another copy is the job's
  queued copy comes back and runs; the queued copy waits beside it and starts when it ends.
* A retry that takes its job's lock afresh (its parked hold gone) holds it as ``requeued``,
  never with an empty state: a revoke of that retry frees the job for the next call.
* With ``lock_cooldown``, the end of a run wakes the copy waiting for it to start as the
  cooldown ends, not at its fallback a lease later.
* With ``lock_rate``, every start of a queue-mode job takes a turn, including a waiting copy
  that finds the lock free as it parks: never more starts in a window than the rate allows.
* A rate comeback that the broker refuses frees its hold (and says so: ``FAILURE``) instead of
  keeping the job for a queue lease.
* A rate comeback and a waiting copy's fallback are recorded ``RETRY`` *before* the message
  that brings them back is sent, so the comeback's own result is always the last one stored.

The tasks are defined here (:func:`make_seam_app`, on top of the fault tests' app); the worker
subprocesses import this module (``-A test_celery_queue_seams:seam_app``) with the tests folder
on their path, as ``tests/test_celery_pools.py`` does.
"""

from __future__ import annotations

import json
import os
import signal
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, cast

import pytest
from celery import Celery
from celery.signals import after_task_publish
from celery_procs import WorkerProcess, close_app, new_job, records, redis_base
from faultapp import (
    DATA_DB,
    LOCK_DB,
    URL_ENV,
    _enter,
    _leave,
    _rate_start,
    _sleep,
    _until_go,
    data,
    make_app,
)
from lock_helpers import START_TIMEOUT, wait_until

from celery_singleton_lock import LockedTask, RateLimited
from celery_singleton_lock.testing import RedisServer

#: the message headers the package puts on a rate comeback (docs/limits.md) and on a waiting
#: copy's wake and fallback
RATE_HEADER, WAIT_HEADER = "singleton_lock_rate", "singleton_lock_wait"

#: every test runs `celery worker` subprocesses
pytestmark = [pytest.mark.slow, pytest.mark.timeout(START_TIMEOUT + 180)]

TESTS = Path(__file__).resolve().parent
#: "1" in a worker subprocess of this module: build :data:`seam_app`
SEAM_APP_ENV = "CSL_SEAM_APP"
#: a broker URL of its own (another redis-server), for the test whose broker refuses a publish
BROKER_ENV = "CSL_SEAM_BROKER"


def _task(app: Celery, **options: Any) -> Callable[[Callable[..., Any]], Any]:
    """``app.task(base=LockedTask, bind=True, shared=False, **options)``, typed (celery ships
    no type information)."""
    made = app.task(base=LockedTask, bind=True, shared=False, **options)
    return cast("Callable[[Callable[..., Any]], Any]", made)


def _ran(task: Any, job: str, seconds: float = 0.0) -> str:
    """A body recorded from its start to its end (``starts:<job>``, ``intervals:<job>``)."""
    start = _enter(task, job)
    try:
        _sleep(seconds)
        return str(task.request.id)
    finally:
        _leave(task, job, start)


def _first(task: Any, job: str) -> bool:
    """Whether this is the job's first run (the first to ask, across every process)."""
    return bool(data(task.app).set(f"first:{job}", task.request.id, nx=True))


def make_seam_app(base: str, broker: str | None = None) -> Celery:
    """The fault tests' app on ``base`` with this module's tasks (``broker``: another one)."""
    app = make_app(base)
    if broker is not None:
        app.conf.broker_url = broker

    @_task(app, name="seam.queue_retry", lock_at="queue", lock_ttl=30, max_retries=1,
           lock_unique_on=["job"])  # fmt: skip
    def queue_retry(self: Any, job: str) -> str:
        """Its first run waits for the test's go, then retries (``self.retry()``)."""
        first = _first(self, job)
        start = _enter(self, job)
        try:
            if first:
                _until_go(self, job, 60)
        finally:
            _leave(self, job, start)
        if first:
            raise self.retry(countdown=0.3)
        return str(self.request.id)

    @_task(app, name="seam.queue_autoretry", lock_at="queue", lock_ttl=30, max_retries=1,
           autoretry_for=(ValueError,), default_retry_delay=0.3,
           lock_unique_on=["job"])  # fmt: skip
    def queue_autoretry(self: Any, job: str) -> str:
        """Its first run waits for the test's go, then fails into ``autoretry_for``."""
        first = _first(self, job)
        start = _enter(self, job)
        try:
            if first:
                _until_go(self, job, 60)
                raise ValueError(f"{job}: the first run fails, and is retried")
            return str(self.request.id)
        finally:
            _leave(self, job, start)

    @_task(app, name="seam.queue_paused", lock_at="queue", lock_ttl=30, lock_rate="50/s",
           max_retries=0, lock_unique_on=["job"])  # fmt: skip
    def queue_paused(self: Any, job: str) -> str:
        """Its first run waits for the test's go, then is told "slow down" for 0.5 s."""
        first = _first(self, job)
        start = _enter(self, job)
        try:
            if first:
                _until_go(self, job, 60)
                raise RateLimited(retry_after=0.5)
            return str(self.request.id)
        finally:
            _leave(self, job, start)

    @_task(app, name="seam.queue_lost", lock_at="queue", lock_ttl=30, acks_late=True,
           reject_on_worker_lost=True, lock_unique_on=["job"])  # fmt: skip
    def queue_lost(self: Any, job: str) -> str:
        """Its first run lasts a minute (the test kills its process); its redelivery is quick.
        A lease longer than the main process takes to notice a dead pool process."""
        return _ran(self, job, 60.0 if _first(self, job) else 0.0)

    @_task(app, name="seam.queue_retry_away", lock_at="queue", lock_ttl=4, max_retries=1,
           lock_unique_on=["job"])  # fmt: skip
    def queue_retry_away(self: Any, job: str, away: str = "") -> str:
        """Its first run waits for the test's go, then retries on the queue ``away`` (a
        worker that does not know this task drops it there)."""
        result = _ran(self, job)
        if _first(self, job):
            _until_go(self, job, 60)
            raise self.retry(countdown=0.3, queue=away)
        return result

    @_task(app, name="seam.retry_lost", lock_at="publish", max_retries=1,
           lock_unique_on=["job"])  # fmt: skip
    def retry_lost(self: Any, job: str) -> str:
        """Its first run's hold is force-released (as an operator would) just before it
        retries in a minute: the retry's publish finds the lock free."""
        result = _ran(self, job)
        if self.request.retries == 0:
            self.release_lock(job)
            raise self.retry(countdown=60)
        return result

    @_task(app, name="seam.queue_cooled", lock_at="queue", lock_ttl=30, lock_cooldown=2.0,
           lock_unique_on=["job"])  # fmt: skip
    def queue_cooled(self: Any, job: str, seconds: float = 0.0) -> str:
        return _ran(self, job, seconds)

    @_task(app, name="seam.queue_rated", lock_at="queue", lock_ttl=30, lock_rate="5/s",
           max_retries=0, lock_unique_on=["job"])  # fmt: skip
    def queue_rated(self: Any, job: str, n: int = 0) -> str:
        """Five starts a second per job, one queued and one running; a 10 ms body."""
        result = _rate_start(self, job)
        _sleep(0.01)
        return result

    @_task(app, name="seam.paused_publish", lock_at="publish", lock_rate="50/s",
           max_retries=0, lock_unique_on=["job"])  # fmt: skip
    def paused_publish(self: Any, job: str) -> str:
        """Its first run waits for the test's go, then is told "slow down" for 1 s."""
        result = _ran(self, job)
        if _first(self, job):
            _until_go(self, job, 60)
            raise RateLimited(retry_after=1.0)
        return result

    @_task(app, name="seam.rated_minute", lock_at="publish", lock_rate="1/m",
           lock_rate_key=lambda job, n: f"seam-minute:{job}", max_retries=0)  # fmt: skip
    def rated_minute(self: Any, job: str, n: int) -> str:
        """One start a minute per job's limiter (each ``n`` a lock of its own); call 0 runs
        until the test's go."""
        start = _enter(self, job)
        try:
            if n == 0:
                _until_go(self, job, 60)
            return str(self.request.id)
        finally:
            _leave(self, job, start)

    @_task(app, name="seam.rated_once", lock_rate="50/s", max_retries=0,
           lock_unique_on=["job"])  # fmt: skip
    def rated_once(self: Any, job: str) -> str:
        """Its first run is told "slow down" for 0.2 s; it comes back and runs."""
        result = _ran(self, job)
        if _first(self, job):
            raise RateLimited(retry_after=0.2)
        return result

    @_task(app, name="seam.queue_waits", lock_at="queue", lock_ttl=30,
           lock_unique_on=["job"])  # fmt: skip
    def queue_waits(self: Any, job: str, hold: float = 0.0) -> str:
        """Runs until the test's go (``hold`` seconds at most)."""
        start = _enter(self, job)
        try:
            _until_go(self, job, hold)
            return str(self.request.id)
        finally:
            _leave(self, job, start)

    return app


def _note_comeback(sender: Any = None, headers: Any = None, **_: Any) -> None:
    """In a worker of this module: the stored state of a task at the moment its rate comeback
    or its waiting copy's fallback was sent (``published:<task id>``)."""
    if seam_app is None or not str(sender).startswith("seam."):
        return
    headers = headers or {}
    kind = "rate" if RATE_HEADER in headers else "wait" if WAIT_HEADER in headers else ""
    task_id = headers.get("id")
    if kind and task_id:
        state = seam_app.backend.get_state(task_id)
        item = json.dumps({"kind": kind, "state": state})
        data(seam_app).rpush(f"published:{task_id}", item)


after_task_publish.connect(_note_comeback, weak=False, dispatch_uid="test_celery_queue_seams")

seam_app: Celery | None = None
if os.environ.get(SEAM_APP_ENV) == "1":
    seam_app = make_seam_app(os.environ[URL_ENV], os.environ.get(BROKER_ENV) or None)


# -- the test process ----------------------------------------------------------------------


class SeamWorker(WorkerProcess):
    """A worker subprocess of :func:`make_seam_app`'s app, consuming ``queue``."""

    def __init__(self, base: str, log_dir: Path, *, queue: str, **options: Any) -> None:
        env = {SEAM_APP_ENV: "1", **options.pop("env", {})}
        super().__init__(base, log_dir, env=env, **options)
        self.queue = queue

    def command(self) -> list[str]:
        cmd = super().command()
        cmd[cmd.index("tests.faultapp")] = "test_celery_queue_seams:seam_app"
        cmd[cmd.index("-Q") + 1] = self.queue
        return cmd

    def start(self, timeout: float = START_TIMEOUT) -> SeamWorker:
        # The tests folder first on the worker's path: it imports this module as the tests do.
        with pytest.MonkeyPatch.context() as patch:
            previous = os.environ.get("PYTHONPATH")
            patch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(TESTS), previous])))
            super().start(timeout)
        return self


class Seam:
    """A test's app on the module's server, its queue, and clients of its databases."""

    def __init__(self, server: RedisServer, log_dir: Path, broker: str | None = None) -> None:
        self.server = server
        self.base = redis_base(server.port)
        self.app = make_seam_app(self.base, broker)
        self.queue = f"seam-{uuid.uuid4().hex[:8]}"
        self.log_dir = log_dir
        self.data = server.client(db=DATA_DB)
        self.broker = broker

    def worker(self, concurrency: int = 2) -> SeamWorker:
        env = {BROKER_ENV: self.broker} if self.broker else {}
        return SeamWorker(
            self.base, self.log_dir, queue=self.queue, concurrency=concurrency, env=env
        )

    def send(self, name: str, *args: Any) -> Any:
        return self.app.tasks[name].apply_async(args, queue=self.queue)

    def starts(self, job: str) -> list[dict[str, Any]]:
        return records(self.data, "starts", job)

    def started(self, job: str, count: int = 1) -> None:
        wait_until(lambda: len(self.starts(job)) >= count, 20, f"{count} start(s) of {job}")

    def start_of(self, job: str, task_id: str, nth: int = 0) -> float:
        return float([s["t"] for s in self.starts(job) if s["id"] == task_id][nth])

    def end_of(self, job: str, task_id: str, nth: int = 0) -> float:
        ends = [i["end"] for i in records(self.data, "intervals", job) if i["id"] == task_id]
        return float(ends[nth])

    def waits(self, result: Any, name: str, job: str) -> None:
        """Wait until the queued copy ``result`` of the job ``job`` of task ``name`` was
        refused and waits beside the run: stored RETRY, its wait record written."""
        wait_until(lambda: result.state == "RETRY", 20, "the queued copy to wait")
        task = self.app.tasks[name]
        space = task.locking.space(self.app)
        lock = task.locking.lock_name(task.name, [job], {})
        key = space.keys(lock).records("wait")
        wait_until(lambda: space.client.hexists(key, result.id), 10, "its wait record")

    def go(self, job: str) -> None:
        self.data.set(f"go:{job}", 1)

    def free(self, task_name: str, job: str) -> bool:
        return not self.app.tasks[task_name].is_locked(job)


@pytest.fixture(scope="module")
def server() -> Iterator[RedisServer]:
    with RedisServer() as made:
        yield made


@pytest.fixture
def seam(server: RedisServer, tmp_path: Path) -> Iterator[Seam]:
    made = Seam(server, tmp_path)
    yield made
    close_app(made.app)


# -- a parked hold is the job's place --------------------------------------------------------


@pytest.mark.parametrize("name", ["seam.queue_retry", "seam.queue_autoretry", "seam.queue_paused"])
def test_a_queue_mode_run_that_retries_while_a_copy_waits_runs_again_then_the_copy(
    seam: Seam, name: str
) -> None:
    """The run retries (``self.retry()``, ``autoretry_for``) or pauses (``RateLimited``) while
    another copy is the job's queued copy and waits: its retry re-enters its parked hold and
    runs (it was skipped as "not the queued copy", and the parked hold kept the copy out for
    an hour); the copy starts as that retry ends."""
    job = new_job("seam-retry")
    with seam.worker():
        first = seam.send(name, job)
        seam.started(job)
        copy = seam.send(name, job)
        assert copy.id != first.id
        seam.waits(copy, name, job)
        seam.go(job)
        assert first.get(timeout=20) == first.id
        assert copy.get(timeout=20) == copy.id
    assert [s["id"] for s in seam.starts(job)] == [first.id, first.id, copy.id]
    assert 0 <= seam.start_of(job, copy.id) - seam.end_of(job, first.id, 1) < 1.0
    assert wait_until(lambda: seam.free(name, job), 5, "the job to be free")


def test_a_queue_mode_run_delivered_again_after_its_process_died_runs_then_the_copy(
    seam: Seam,
) -> None:
    """``acks_late`` + ``reject_on_worker_lost``: the run's pool process is killed while a copy
    waits; its redelivery re-enters the hold kept for it and runs, then the copy."""
    name = "seam.queue_lost"
    job = new_job("seam-redeliver")
    with seam.worker() as worker:
        first = seam.send(name, job)
        seam.started(job)
        copy = seam.send(name, job)
        seam.waits(copy, name, job)
        pid = seam.starts(job)[0]["pid"]
        assert worker.accepted(seam.app, first.id) == pid
        os.kill(pid, signal.SIGKILL)
        assert first.get(timeout=30) == first.id
        assert copy.get(timeout=20) == copy.id
    assert [s["id"] for s in seam.starts(job)] == [first.id, first.id, copy.id]
    assert 0 <= seam.start_of(job, copy.id) - seam.end_of(job, first.id) < 1.0
    assert wait_until(lambda: seam.free(name, job), 5, "the job to be free")


def test_a_queue_mode_retry_dropped_unrun_frees_the_hold_kept_for_it(seam: Seam) -> None:
    """The run retries while a copy waits, and its retry reaches a worker that does not know
    the task (it drops the message): the hold the run parked on the job's lock for that retry
    is freed with it, and the waiting copy starts (within its fallback's lease of 4 s) instead
    of an hour later."""
    name = "seam.queue_retry_away"
    job = new_job("seam-dropped")
    away = f"{seam.queue}-away"
    with (
        seam.worker() as worker,
        WorkerProcess(seam.base, seam.log_dir, concurrency=1, args=("-Q", away)) as other,
    ):
        first = seam.send(name, job, away)
        seam.started(job)
        copy = seam.send(name, job, away)
        seam.waits(copy, name, job)
        seam.go(job)
        other.wait_log(rf"Received unregistered task of type '{name}'", 15)
        assert copy.get(timeout=20) == copy.id, worker.log()[-3000:]
    assert [s["id"] for s in seam.starts(job)] == [first.id, copy.id]
    assert wait_until(lambda: seam.free(name, job), 5, "the job to be free")


def test_a_retry_that_takes_a_free_lock_holds_it_requeued_and_a_revoke_frees_it(
    seam: Seam,
) -> None:
    """The run's hold is gone before its retry is published (an operator released it): the
    retry takes the free lock as ``requeued`` (an empty state before, which the revoked-holder
    check skips); revoked, that retry no longer holds the job back from a new call."""
    name = "seam.retry_lost"
    job = new_job("seam-requeued")
    task = seam.app.tasks[name]
    with seam.worker() as worker:
        retried = seam.send(name, job)
        wait_until(lambda: retried.state == "RETRY", 20, "the retry to be sent")
        lock_name = task.locking.lock_name(task.name, [job], {})
        (hold,) = [s for s in task.locking.states(seam.app, lock_name) if s.held]
        assert (hold.holder, hold.state) == (retried.id, "requeued")
        seam.app.control.revoke(retried.id, destination=[worker.hostname], reply=True, timeout=5)
        wait_until(lambda: retried.state == "REVOKED", 10, "the REVOKED state")
        again = seam.send(name, job)
        assert again.id != retried.id
        wait_until(lambda: again.state == "RETRY", 20, "the new call to run")
    assert [s["id"] for s in seam.starts(job)] == [retried.id, again.id]


# -- cooldown and rate limits ------------------------------------------------------------------


def test_with_a_cooldown_the_waiting_copy_starts_as_the_cooldown_ends(seam: Seam) -> None:
    """``lock_cooldown=2``: the copy waiting for the run starts about 2 s after its end (it
    started at its fallback before, a lease later: 29 s with a 30 s lease)."""
    name = "seam.queue_cooled"
    job = new_job("seam-cooled")
    with seam.worker():
        first = seam.send(name, job, 1.0)
        seam.started(job)
        copy = seam.send(name, job, 0.0)
        seam.waits(copy, name, job)
        assert first.get(timeout=20) == first.id
        assert copy.get(timeout=15) == copy.id
    gap = seam.start_of(job, copy.id) - seam.end_of(job, first.id)
    assert 2.0 <= gap < 4.0, gap


def _most_in_any_window(times: list[float], period: float) -> int:
    times = sorted(times)
    most, first = 0, 0
    for last, t in enumerate(times):
        while t - times[first] >= period:
            first += 1
        most = max(most, last - first + 1)
    return most


def test_with_a_rate_every_start_of_a_queue_mode_job_takes_a_turn(seam: Seam) -> None:
    """``lock_rate="5/s"``, a 10 ms body called every 5 ms for 3 s: every start was admitted
    by the limiter (a copy that found the lock free as it parked to wait started without a
    turn before), and no 1 s window holds more than 5 starts."""
    name = "seam.queue_rated"
    job = new_job("seam-rated")
    task = seam.app.tasks[name]
    clock = seam.server.client()
    with seam.worker(concurrency=3):
        seconds, _ = clock.time()
        calls: dict[str, Any] = {}
        n = 0
        while clock.time()[0] - seconds < 3:
            result = task.apply_async((job, n), queue=seam.queue)
            calls[result.id] = result
            n += 1
            _sleep(0.005)  # the scenario: a call every 5 ms
        wait_until(
            lambda: all(c.state == "SUCCESS" for c in calls.values()), 60, "every call to run"
        )
    starts = [json.loads(item) for item in seam.data.lrange(f"rate:{job}", 0, -1)]
    assert sorted(s["id"] for s in starts) == sorted(calls)  # each call ran once
    assert [s["id"] for s in starts if s["at"] is None] == []  # every start took a turn
    assert _most_in_any_window([s["at"] for s in starts], 1.0) <= 5
    assert len(starts) >= 10


# -- rate comebacks --------------------------------------------------------------------------


@pytest.fixture
def broker() -> Iterator[RedisServer]:
    with RedisServer() as made:
        yield made


def test_a_rate_comeback_the_broker_refuses_frees_its_hold(
    server: RedisServer, broker: RedisServer, tmp_path: Path
) -> None:
    """``lock_at="publish"``: a body told "slow down" keeps its hold parked for its comeback;
    the broker refuses that comeback (the publish fails): the hold is freed at once (it was
    kept for the comeback's countdown plus the queue lease, an hour) and the call says why
    (FAILURE); the next call runs."""
    seam = Seam(server, tmp_path, broker=f"{redis_base(broker.port)}/0")
    name = "seam.paused_publish"
    job = new_job("seam-nobroker")
    admin = broker.client()
    try:
        with seam.worker():
            first = seam.send(name, job)
            seam.started(job)
            admin.execute_command("ACL", "SETUSER", "default", "-lpush")  # no publish
            seam.go(job)
            wait_until(lambda: first.state == "FAILURE", 15, "the call to fail")
            assert seam.free(name, job)
            admin.execute_command("ACL", "SETUSER", "default", "+lpush")
            again = seam.send(name, job)
            assert again.id != first.id
            assert again.get(timeout=15) == again.id
    finally:
        admin.execute_command("ACL", "SETUSER", "default", "+lpush")
        close_app(seam.app)


def test_a_call_over_the_rate_whose_comeback_the_broker_refuses_frees_its_hold_and_turn(
    server: RedisServer, broker: RedisServer, tmp_path: Path
) -> None:
    """``lock_at="publish"`` with ``lock_rate="1/m"``: a call refused a turn keeps its hold for
    its comeback; the broker refuses that comeback: the hold and the turn reserved for it are
    let go at once (they were kept for the turn's minute plus the queue lease)."""
    seam = Seam(server, tmp_path, broker=f"{redis_base(broker.port)}/0")
    name = "seam.rated_minute"
    job = new_job("seam-nobroker-turn")
    task = seam.app.tasks[name]
    admin = broker.client()
    try:
        with seam.worker(concurrency=1):
            first = seam.send(name, job, 0)
            seam.started(job)
            over = seam.send(name, job, 1)  # in the broker: the one pool process is busy
            admin.execute_command("ACL", "SETUSER", "default", "-lpush")  # no publish
            seam.go(job)
            assert first.get(timeout=15) == first.id
            wait_until(lambda: over.state == "FAILURE", 15, "the call over the rate to fail")
            assert not task.is_locked(job, 1)
            limiter = task.locking.space(seam.app).rate_limiter(f"seam-minute:{job}", "1/m")
            assert limiter.try_acquire("probe").wait > 50  # the one start of the minute
            log = server.client(db=LOCK_DB).zrange(limiter.keys.log, 0, -1)
            assert [e for e in log if e.startswith(b"r:") and e != b"r:probe"] == []
    finally:
        admin.execute_command("ACL", "SETUSER", "default", "+lpush")
        close_app(seam.app)


def _published(seam: Seam, task_id: str) -> list[dict[str, Any]]:
    return [json.loads(i) for i in seam.data.lrange(f"published:{task_id}", 0, -1)]


def test_a_rate_comeback_is_recorded_retry_before_it_is_sent(seam: Seam) -> None:
    """The comeback's own run (here or on another worker) may store SUCCESS within
    milliseconds of its publish: the call's RETRY must be stored before, never after it (the
    result backend's guard reads, then writes)."""
    name = "seam.rated_once"
    job = new_job("seam-order")
    with seam.worker():
        call = seam.send(name, job)
        assert call.get(timeout=20) == call.id
    assert _published(seam, call.id) == [{"kind": "rate", "state": "RETRY"}]
    assert call.state == "SUCCESS"
    assert [s["id"] for s in seam.starts(job)] == [call.id, call.id]


def test_a_waiting_copy_is_recorded_retry_before_its_fallback_is_sent(seam: Seam) -> None:
    """The same for a queued copy that waits for the run: a wake may run it elsewhere as soon
    as its wait is written, so its RETRY is stored before its fallback and its wait record."""
    name = "seam.queue_waits"
    job = new_job("seam-order-wait")
    with seam.worker():
        first = seam.send(name, job, 60.0)
        seam.started(job)
        copy = seam.send(name, job, 0.0)
        seam.waits(copy, name, job)
        seam.go(job)
        assert first.get(timeout=20) == first.id
        assert copy.get(timeout=20) == copy.id
    assert _published(seam, copy.id)[0] == {"kind": "wait", "state": "RETRY"}
    assert copy.state == "SUCCESS"
