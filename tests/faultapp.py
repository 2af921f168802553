"""The Celery app of the fault tests, run by real ``celery worker`` subprocesses.

The tests start their own redis-server and a worker with
``python -m celery -A tests.faultapp worker ...``; this module reads where Redis is from the
environment (:data:`URL_ENV`, ``redis://127.0.0.1:PORT`` without a database) and uses
database 0 as the broker, 1 for results, 2 for the locks and 3 for what the tasks record
(:func:`data`), so that a test can check the lock database without the records in the way.

The test process builds the same app with :func:`make_app` (every task has an explicit name,
so the module's import name does not matter) to publish, inspect and compute lock keys.

What the tasks record, per ``job`` (a unique string each test makes up):

* ``starts:<job>``: one JSON item per body start: task id, pid, time, thread names;
* ``intervals:<job>``: one JSON item per body end: task id, pid, start, end;
* ``cur:<job>`` / ``max:<job>``: runs of the job in the body now / at most at once.

A test ends a body that waits for it (``fault.debounced`` with ``hold``) by setting
``go:<job>`` in the same database.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar, cast

import redis
from celery import Celery
from celery.exceptions import SoftTimeLimitExceeded
from celery.worker.control import inspect_command

from celery_singleton_lock import LockedTask, LockLostError, RateLimited
from celery_singleton_lock.compat.once import QueueOnce
from celery_singleton_lock.compat.singleton import Singleton

URL_ENV = "CSL_FAULT_REDIS"
#: a short broker visibility timeout (seconds), for the redelivery test
VISIBILITY_ENV = "CSL_FAULT_VISIBILITY"
#: "1": a beat schedule with ``fault.tick`` due every second
BEAT_ENV = "CSL_FAULT_BEAT"

#: seconds: the app's singleton_lock_ttl (the beat leader's lease, in the beat tests)
TTL_ENV = "CSL_FAULT_TTL"
#: a port: the app's singleton_lock_metrics_port (tests/test_metrics.py)
METRICS_ENV = "CSL_FAULT_METRICS_PORT"
#: "0": the app's singleton_lock_counts is off (tests/test_ops_counts.py)
COUNTS_ENV = "CSL_FAULT_COUNTS"
#: "1": the worker accepts pickled messages too (fault.queue_pickled; a worker run as root
#: also needs C_FORCE_ROOT for that)
PICKLE_ENV = "CSL_FAULT_PICKLE"

BROKER_DB, RESULT_DB, LOCK_DB, DATA_DB = 0, 1, 2, 3
HEARTBEAT_THREAD = "celery-singleton-lock-heartbeat"

_ENTER = """
local n = redis.call('incr', KEYS[1])
local m = tonumber(redis.call('get', KEYS[2]) or '0')
if n > m then redis.call('set', KEYS[2], n) end
redis.call('rpush', KEYS[3], ARGV[1])
return n
"""

#: KEYS: counter, highest fence seen; ARGV: the reader's fence. Raises the fence, reads.
_FENCED_READ = """
local seen = tonumber(redis.call('get', KEYS[2]) or '0')
if tonumber(ARGV[1]) > seen then redis.call('set', KEYS[2], ARGV[1]) end
return tonumber(redis.call('get', KEYS[1]) or '0')
"""
#: KEYS: counter, highest fence, run records; ARGV: fence, new value, record (JSON object).
#: Writes only for the highest fence seen, and records whether it did, in one step.
_FENCED_WRITE = """
local written = tonumber(ARGV[1]) >= tonumber(redis.call('get', KEYS[2]) or '0')
if written then redis.call('set', KEYS[1], ARGV[2]) end
local record = cjson.decode(ARGV[3])
record['written'] = written
redis.call('rpush', KEYS[3], cjson.encode(record))
return written and 1 or 0
"""

_clients: dict[tuple[int, str], Any] = {}


def data(app: Celery) -> Any:
    """This process's client of the records database."""
    key = (os.getpid(), app.conf.fault_data_url)
    client = _clients.get(key)
    if client is None:
        client = _clients[key] = redis.Redis.from_url(
            app.conf.fault_data_url, socket_timeout=10, socket_connect_timeout=10
        )
    return client


def _thread_names() -> list[str]:
    return [t.name for t in threading.enumerate()]


def _enter(task: Any, job: str) -> float:
    start = time.time()
    item = {
        "id": task.request.id,
        "pid": os.getpid(),
        "t": start,
        "threads": _thread_names(),
        "held": task.lock is not None,
        "redelivered": bool((task.request.delivery_info or {}).get("redelivered")),
    }
    data(task.app).eval(_ENTER, 3, f"cur:{job}", f"max:{job}", f"starts:{job}", json.dumps(item))
    return start


def records_of(app: Celery, kind: str, job: str) -> list[dict[str, Any]]:
    """The JSON items the tasks recorded (``starts``, ``intervals``, ...) for ``job``."""
    return [json.loads(item) for item in data(app).lrange(f"{kind}:{job}", 0, -1)]


def _leave(task: Any, job: str, start: float, **extra: Any) -> None:
    item = {"id": task.request.id, "pid": os.getpid(), "start": start, "end": time.time()}
    item.update(extra)
    client = data(task.app)
    client.decr(f"cur:{job}")
    client.rpush(f"intervals:{job}", json.dumps(item))


#: Set by the tests' in-process worker (the conftest's ``fault_worker``) as it stops: a body
#: still running returns at once instead of holding up the worker's shutdown to the end of its
#: time. A worker subprocess never sets it.
ABORT = threading.Event()


def _sleep(seconds: float) -> None:
    """A body's work: ``seconds`` of doing nothing (the scenario, not a synchronisation)."""
    # Small steps, so a soft time limit (a signal) lands between them promptly.
    deadline = time.monotonic() + seconds
    while not ABORT.is_set():
        left = deadline - time.monotonic()
        if left <= 0:
            return
        time.sleep(min(left, 0.05))


def _until_go(task: Any, job: str, seconds: float) -> None:
    """Wait until the test sets ``go:<job>``, for ``seconds`` at most (a body that runs as
    long as the test needs it to, without a guess at how long that is)."""
    client = data(task.app)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and not ABORT.is_set() and not client.exists(f"go:{job}"):
        time.sleep(0.02)  # polls the test's word


def _held_until_go(task: Any, job: str, hold: float) -> str:
    """A run recorded from its start to its end, that lasts until the test says go (or
    ``hold`` seconds): its task id."""
    start = _enter(task, job)
    try:
        _until_go(task, job, hold)
        return str(task.request.id)
    finally:
        _leave(task, job, start)


FuncT = TypeVar("FuncT", bound=Callable[..., Any])
TaskT = TypeVar("TaskT", bound=LockedTask)


def _inspect_command(**options: Any) -> Callable[[FuncT], FuncT]:
    """``inspect_command(**options)``, typed (celery ships no type information): it registers
    the function as a remote control command and returns it unchanged."""
    return cast("Callable[[FuncT], FuncT]", inspect_command(**options))


def _job_key(job: str, *args: Any, **kwargs: Any) -> str:
    """A job's lock key part: the job itself (readable on the locks page), not a hash."""
    return job


def _app_task(
    app: Celery, *, base: type[TaskT], **options: Any
) -> Callable[[Callable[..., Any]], TaskT]:
    """``app.task(base=base, **options)``, typed (celery ships no type information): the task
    it makes of a function is an instance of ``base``."""
    return cast("Callable[[Callable[..., Any]], TaskT]", app.task(base=base, **options))


@_inspect_command()
def fault_threads(state: Any, **kwargs: Any) -> dict[str, Any]:
    """The worker MAIN process's pid and thread names (remote control, answered by the main
    process, never a pool child)."""
    return {"pid": os.getpid(), "threads": _thread_names()}


def make_app(base: str, *, visibility: float | None = None, beat: bool = False) -> Celery:
    """The fault-test app on the Redis server at ``base`` (``redis://127.0.0.1:PORT``)."""
    base = base.rstrip("/")
    app = Celery("faultapp", set_as_current=False)
    # An idle worker's BRPOP returns every 0.1 s (kombu's default: 1 s): it stops sooner.
    transport: dict[str, Any] = {"polling_interval": 0.1}
    if visibility is not None:
        # Restore unacked messages older than the visibility timeout every second.
        transport |= {
            "visibility_timeout": visibility,
            "unacked_restore_interval": 1,
            "unacked_restore_throttle": 1,
        }
    app.conf.update(
        broker_url=f"{base}/{BROKER_DB}",
        result_backend=f"{base}/{RESULT_DB}",
        singleton_lock_redis_url=f"{base}/{LOCK_DB}",
        fault_data_url=f"{base}/{DATA_DB}",
        broker_transport_options=transport,
        broker_connection_retry_on_startup=True,
        worker_prefetch_multiplier=1,
        worker_redirect_stdouts=False,
        task_default_queue="fault",
        result_expires=None,
        # a result backend whose server is gone (a finished test): give up at once
        result_backend_transport_options={
            "retry_policy": {"max_retries": 1, "interval_start": 0, "interval_step": 0.1},
        },
    )
    if beat:
        app.conf.beat_schedule = {
            "fault-tick": {"task": "fault.tick", "schedule": 1.0, "args": ("beat",)},
        }

    # The compat shims (tests/test_compat_*.py): a long run with a short running lease, for a
    # worker killed mid-task.
    @_app_task(
        app, base=Singleton, bind=True, name="fault.singleton_hang", lock_ttl=2, shared=False
    )
    def singleton_hang(self: Any, job: str, seconds: float) -> None:
        _enter(self, job)
        _sleep(seconds)

    @_app_task(app, base=QueueOnce, bind=True, name="fault.once_hang", lock_ttl=2, shared=False)
    def once_hang(self: Any, job: str, seconds: float) -> None:
        _enter(self, job)
        _sleep(seconds)

    @_app_task(app, base=LockedTask, bind=True, name="fault.work", lock_ttl=30, shared=False)
    def work(self: Any, job: str, seconds: float = 0.0, fail: bool = False) -> dict[str, Any]:
        start = _enter(self, job)
        try:
            _sleep(seconds)
            if fail:
                raise ValueError(f"{job} fails on purpose")
            return {"pid": os.getpid(), "held": self.lock is not None}
        finally:
            _leave(self, job, start)

    @_app_task(
        app,
        base=LockedTask,
        bind=True,
        name="fault.publish_work",
        lock_at="publish",
        lock_ttl=30,
        shared=False,
    )
    def publish_work(self: Any, job: str, seconds: float = 0.0) -> int:
        start = _enter(self, job)
        try:
            _sleep(seconds)
            return os.getpid()
        finally:
            _leave(self, job, start)

    # A publisher that does not import these (install()'s stand-in, tests/test_celery_by_name.py)
    # sends them by name: the lock it may take must be the one the worker names.
    @_app_task(
        app, base=LockedTask, bind=True, name="fault.digest", lock_at="publish",
        lock_unique_on=["job"], shared=False,
    )  # fmt: skip
    def digest(self: Any, job: str, day: str = "monday", hold: float = 30.0) -> str:
        return _held_until_go(self, job, hold)

    @_app_task(
        app, base=LockedTask, bind=True, name="fault.digest_all", lock_at="publish",
        shared=False,
    )  # fmt: skip
    def digest_all(self: Any, job: str, hold: float = 30.0) -> str:
        return _held_until_go(self, job, hold)

    # A duplicate refused by the job's lock takes no lock_rate turn (tests/test_celery_rate.py).
    @_app_task(
        app, base=LockedTask, bind=True, name="fault.rated_locked", lock_rate="2/10s",
        lock_limit=1, lock_on_locked="skip", lock_rate_key=lambda job, hold=30.0: f"turns:{job}",
        lock_unique_on=["job"], shared=False,
    )  # fmt: skip
    def rated_locked(self: Any, job: str, hold: float = 30.0) -> str:
        return _held_until_go(self, job, hold)

    @_app_task(
        app,
        base=LockedTask,
        bind=True,
        name="fault.soft",
        soft_time_limit=1,
        lock_ttl=30,
        shared=False,
    )
    def soft(self: Any, job: str, seconds: float = 10.0) -> None:
        start = _enter(self, job)
        try:
            _sleep(seconds)
        except SoftTimeLimitExceeded:
            data(self.app).rpush(
                f"soft:{job}", json.dumps({"t": time.time(), "held": self.lock is not None})
            )
            raise
        finally:
            _leave(self, job, start)

    @_app_task(
        app, base=LockedTask, bind=True, name="fault.hard", time_limit=2, lock_ttl=30, shared=False
    )
    def hard(self: Any, job: str, seconds: float = 10.0) -> None:
        start = _enter(self, job)
        _sleep(seconds)
        _leave(self, job, start)

    @_app_task(
        app,
        base=LockedTask,
        bind=True,
        name="fault.redeliver",
        acks_late=True,
        lock_ttl=30,
        shared=False,
    )
    def redeliver(self: Any, job: str, seconds: float = 6.0) -> int:
        start = _enter(self, job)
        try:
            _sleep(seconds)
            return os.getpid()
        finally:
            _leave(self, job, start)

    @_app_task(
        app,
        base=LockedTask,
        bind=True,
        name="fault.lost",
        acks_late=True,
        reject_on_worker_lost=True,
        lock_ttl=60,
        shared=False,
    )
    def lost(self: Any, job: str, first_seconds: float = 30.0) -> int:
        start = _enter(self, job)
        # The first run sleeps until the test kills its process; the redelivery is quick.
        first = data(self.app).llen(f"starts:{job}") == 1
        _sleep(first_seconds if first else 0.2)
        _leave(self, job, start)
        return os.getpid()

    @_app_task(app, base=LockedTask, bind=True, name="fault.lease3", lock_ttl=3, shared=False)
    def lease3(self: Any, job: str, seconds: float = 30.0) -> None:
        start = _enter(self, job)
        _sleep(seconds)
        _leave(self, job, start)

    @_app_task(
        app,
        base=LockedTask,
        bind=True,
        name="fault.short_lease",
        lock_ttl=1,
        lock_unique_on=["job"],
        shared=False,
    )
    def short_lease(self: Any, job: str, seconds: float = 6.0) -> dict[str, Any]:
        start = _enter(self, job)
        _sleep(seconds)
        lost = self.lock.lost.is_set()
        _leave(self, job, start)
        return {"lost": lost, "threads": _thread_names()}

    @_app_task(app, base=LockedTask, bind=True, name="fault.threads", lock_ttl=30, shared=False)
    def threads(self: Any, job: str, seconds: float = 0.0) -> dict[str, Any]:
        start = _enter(self, job)
        _sleep(seconds)
        threads = _thread_names()
        reply = {
            "pid": os.getpid(),
            "threads": threads,
            # this process renews through a lane of its own (a forked child's, not inherited)
            "heartbeat_pid": os.getpid() if "celery-singleton-lock-heartbeat" in threads else None,
        }
        _leave(self, job, start)
        return reply

    @_app_task(app, base=LockedTask, bind=True, name="fault.lose", lock_ttl=1, shared=False)
    def lose(self: Any, job: str, wait: float = 8.0) -> dict[str, Any]:
        start = _enter(self, job)
        lock = self.lock
        client = data(self.app)
        client.set(f"ready:{job}", time.time())
        lost_at = None
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            if lock.lost.wait(0.005):
                lost_at = time.time()
                break
        try:
            lock.ensure_held()
            ensure = "held"
        except LockLostError as exc:
            ensure = type(exc).__name__
        _leave(self, job, start)
        return {"lost_at": lost_at, "ensure_held": ensure}

    @_app_task(app, base=LockedTask, bind=True, name="fault.tick", lock_ttl=5, shared=False)
    def tick(self: Any, job: str, seconds: float = 3.0) -> None:
        start = _enter(self, job)
        _sleep(seconds)
        _leave(self, job, start)

    @_app_task(
        app,
        base=LockedTask,
        bind=True,
        name="fault.counted",
        lock_ttl=2,
        acks_late=True,
        reject_on_worker_lost=True,
        shared=False,
    )
    def counted(self: Any, job: str, key: str, seconds: float = 0.01) -> None:
        """A non-atomic read-modify-write of ``counter:<job>:<key>`` under the lock, through a
        fenced store (the read raises the store's fence, a write with an older fence is
        refused), recorded with the run's interval and whether its lease held to the end."""
        client, lock = data(self.app), self.lock
        assert lock is not None and lock.fence is not None
        names = (f"counter:{job}:{key}", f"fence:{job}:{key}", f"runs:{job}")
        start = time.time()
        value = int(client.eval(_FENCED_READ, 2, *names[:2], lock.fence))
        _sleep(seconds)
        try:
            lock.ensure_held()
            held = True
        except LockLostError:
            held = False
        record = {"id": self.request.id, "key": key, "start": start, "fence": lock.fence}
        record.update(held=held, end=time.time())
        if held:
            client.eval(_FENCED_WRITE, 3, *names, lock.fence, value + 1, json.dumps(record))
        else:
            client.rpush(names[2], json.dumps({**record, "written": False}))

    @_app_task(
        app, base=LockedTask, bind=True, name="fault.mixed", lock_ttl=5, max_retries=1, shared=False
    )
    def mixed(self: Any, key: str, mode: str = "ok") -> str:
        """A no-op that ends as ``mode`` says: "ok", "fail" (an exception) or "retry" (once,
        keeping its lock, then ok). A retried one that ran records its id in ``mixed:ran``
        (its SUCCESS may be overwritten by the RETRY its first run stores late)."""
        if mode == "fail":
            raise ValueError(f"{key} fails on purpose")
        if mode == "retry":
            if self.request.retries == 0:
                raise self.retry(countdown=0)
            data(self.app).sadd("mixed:ran", self.request.id)
        return key

    # Beyond one at a time (tests/test_celery_limits.py): each records its runs as work does.
    def _recorded(task: Any, job: str, seconds: float, fail: bool = False) -> str:
        start = _enter(task, job)
        try:
            _sleep(seconds)
            if fail:
                raise ValueError(f"{job} fails on purpose")
            return str(task.request.id)
        finally:
            _leave(task, job, start)

    @_app_task(
        app, base=LockedTask, bind=True, name="fault.limited", lock_limit=3, lock_ttl=3,
        lock_unique_on=["job"], shared=False,
    )  # fmt: skip
    def limited(self: Any, job: str, seconds: float = 0.0) -> str:
        return _recorded(self, job, seconds)

    # A lease far longer than any test waits: a slot that comes back sooner was released.
    @_app_task(
        app, base=LockedTask, bind=True, name="fault.limited_long", lock_limit=2, lock_ttl=60,
        lock_unique_on=["job"], shared=False,
    )  # fmt: skip
    def limited_long(self: Any, job: str, seconds: float = 0.0) -> str:
        return _recorded(self, job, seconds)

    @_app_task(
        app, base=LockedTask, bind=True, name="fault.cooled", lock_cooldown=3.0,
        lock_unique_on=["job"], shared=False,
    )  # fmt: skip
    def cooled(self: Any, job: str, seconds: float = 0.0, fail: bool = False) -> str:
        return _recorded(self, job, seconds, fail)

    @_app_task(
        app, base=LockedTask, bind=True, name="fault.cooled_on_success", lock_cooldown=2.0,
        lock_cooldown_on_failure=False, lock_unique_on=["job"], shared=False,
    )  # fmt: skip
    def cooled_on_success(self: Any, job: str, fail: bool = False) -> str:
        return _recorded(self, job, 0.0, fail)

    # A duplicate of a publish-mode job is refused at the publish, in the caller's process:
    # a test sees the refusal at the moment it asks, not when a worker gets to the message.
    @_app_task(
        app, base=LockedTask, bind=True, name="fault.cooled_publish", lock_at="publish",
        lock_cooldown=5.0, lock_unique_on=["job"], shared=False,
    )  # fmt: skip
    def cooled_publish(self: Any, job: str) -> str:
        return _recorded(self, job, 0.0)

    @_app_task(
        app, base=LockedTask, bind=True, name="fault.queued", lock_at="queue",
        lock_retry_countdown=0.2, max_retries=0, lock_unique_on=["job"], shared=False,
    )  # fmt: skip
    def queued(self: Any, job: str, seconds: float = 0.0) -> str:
        return _recorded(self, job, seconds)

    # lock_at="queue" with the default lock_on_locked (a refused queued copy waits for the run
    # to end, tests/test_celery_queue.py): a lease shorter than the bodies the tests give them,
    # the app's lease (singleton_lock_ttl), and debounced.
    @_app_task(
        app, base=LockedTask, bind=True, name="fault.queue_wake", lock_at="queue", lock_ttl=4,
        lock_unique_on=["job"], shared=False,
    )  # fmt: skip
    def queue_wake(self: Any, job: str, seconds: float = 0.0) -> str:
        return _recorded(self, job, seconds)

    @_app_task(
        app, base=LockedTask, bind=True, name="fault.queue_default", lock_at="queue",
        lock_unique_on=["job"], shared=False,
    )  # fmt: skip
    def queue_default(self: Any, job: str, seconds: float = 0.0) -> str:
        return _recorded(self, job, seconds)

    @_app_task(
        app, base=LockedTask, bind=True, name="fault.queue_patient", lock_at="queue",
        lock_ttl=30, lock_retry_countdown=30, lock_unique_on=["job"], shared=False,
    )  # fmt: skip
    def queue_patient(self: Any, job: str, seconds: float = 0.0) -> str:
        """A queued copy's fallback comes back in 30 s: only a wake starts it sooner."""
        return _recorded(self, job, seconds)

    @_app_task(
        app, base=LockedTask, bind=True, name="fault.queue_lost", lock_at="queue", lock_ttl=4,
        acks_late=True, reject_on_worker_lost=True, lock_unique_on=["job"], shared=False,
    )  # fmt: skip
    def queue_lost(self: Any, job: str, seconds: float = 0.0, again: float = 0.0) -> str:
        """Sleeps ``seconds``, or ``again`` when this task id started before (a redelivery)."""
        before = [s for s in records_of(self.app, "starts", job) if s["id"] == self.request.id]
        return _recorded(self, job, again if before else seconds)

    @_app_task(
        app, base=LockedTask, bind=True, name="fault.queue_limited", lock_at="queue",
        lock_limit=2, lock_ttl=4, lock_unique_on=["job"], shared=False,
    )  # fmt: skip
    def queue_limited(self: Any, job: str, seconds: float = 0.0) -> str:
        return _recorded(self, job, seconds)

    @_app_task(
        app, base=LockedTask, bind=True, name="fault.queue_pickled", lock_at="queue",
        lock_ttl=4, serializer="pickle", lock_unique_on=["job"], shared=False,
    )  # fmt: skip
    def queue_pickled(self: Any, job: str, seconds: float = 0.0, extra: Any = None) -> str:
        """``extra``: what JSON cannot carry (a set); its type and items come back."""
        _recorded(self, job, seconds)
        return f"{type(extra).__name__}:{sorted(extra or ())}"

    @_app_task(
        app, base=LockedTask, bind=True, name="fault.queue_debounced", lock_at="queue",
        lock_debounce=0.5, lock_ttl=4, lock_unique_on=["job"], shared=False,
    )  # fmt: skip
    def queue_debounced(self: Any, job: str, seconds: float = 0.0) -> str:
        return _recorded(self, job, seconds)

    @_app_task(
        app, base=LockedTask, bind=True, name="fault.debounced", lock_at="publish",
        lock_debounce=1.0, lock_unique_on=["job"], shared=False,
    )  # fmt: skip
    def debounced(self: Any, job: str, value: int = 0, hold: float = 0.0) -> str:
        """``hold``: the body runs until the test sets ``go:<job>`` (that long at most)."""
        return _held_until_go(self, job, hold)

    @_app_task(
        app, base=LockedTask, bind=True, name="fault.debounced_queue", lock_at="queue",
        lock_debounce=0.5, lock_retry_countdown=0.2, lock_unique_on=["job"], shared=False,
    )  # fmt: skip
    def debounced_queue(self: Any, job: str, seconds: float = 0.0) -> str:
        return _recorded(self, job, seconds)

    # The web page's browser tests (tests/test_web_browser.py): a run that lasts until the test
    # says go (STARTED is stored, so the lock page shows a result state a run has), a job of
    # three slots and a queued copy; their keys are the job as written (a page shows it).
    @_app_task(
        app, base=LockedTask, bind=True, name="fault.web_work", lock_ttl=30, track_started=True,
        lock_key=_job_key, shared=False,
    )  # fmt: skip
    def web_work(self: Any, job: str, hold: float = 120.0) -> str:
        return _held_until_go(self, job, hold)

    @_app_task(
        app, base=LockedTask, bind=True, name="fault.web_slots", lock_limit=3, lock_ttl=30,
        lock_key=_job_key, shared=False,
    )  # fmt: skip
    def web_slots(self: Any, job: str, hold: float = 120.0) -> str:
        return _held_until_go(self, job, hold)

    @_app_task(
        app, base=LockedTask, bind=True, name="fault.web_queued", lock_at="queue",
        lock_key=_job_key, shared=False,
    )  # fmt: skip
    def web_queued(self: Any, job: str) -> str:
        return _recorded(self, job, 0.0)

    # Where features meet operator commands (tests/test_celery_seams.py).
    @_app_task(
        app, base=LockedTask, bind=True, name="fault.cooled_long", lock_cooldown=60.0,
        lock_unique_on=["job"], shared=False,
    )  # fmt: skip
    def cooled_long(self: Any, job: str) -> str:
        return _recorded(self, job, 0.0)

    @_app_task(
        app, base=LockedTask, bind=True, name="fault.retry_later", lock_at="publish",
        max_retries=1, lock_unique_on=["job"], shared=False,
    )  # fmt: skip
    def retry_later(self: Any, job: str, countdown: float = 60.0) -> str:
        """Its first run retries with ``countdown`` (its hold parked meanwhile), then runs."""
        result = _recorded(self, job, 0.0)
        if self.request.retries == 0:
            raise self.retry(countdown=countdown)
        return result

    @_app_task(
        app, base=LockedTask, bind=True, name="fault.debounced_retry", lock_at="publish",
        lock_debounce=0.2, max_retries=1, lock_unique_on=["job"], shared=False,
    )  # fmt: skip
    def debounced_retry(self: Any, job: str, countdown: float = 3.0) -> str:
        """A debounced job whose first run retries with ``countdown``, then runs."""
        result = _recorded(self, job, 0.0)
        if self.request.retries == 0:
            raise self.retry(countdown=countdown)
        return result

    # -- lock_rate ---------------------------------------------------------------------------

    @_app_task(
        app, base=LockedTask, bind=True, name="fault.rated", lock_rate="5/s", max_retries=0,
        lock_unique_on=["job"], shared=False,
    )  # fmt: skip
    def rated(self: Any, job: str, n: int = 0) -> str:
        """At most 5 starts a second per job, whatever the number of calls; every call runs."""
        return _rate_start(self, job)

    @_app_task(
        app, base=LockedTask, bind=True, name="fault.rated_shared_a", lock_rate="2/s",
        lock_rate_key="fault-partner", max_retries=0, shared=False,
    )  # fmt: skip
    def rated_shared_a(self: Any, job: str, n: int = 0) -> str:
        return _rate_start(self, job)

    @_app_task(
        app, base=LockedTask, bind=True, name="fault.rated_shared_b", lock_rate="2/s",
        lock_rate_key="fault-partner", max_retries=0, shared=False,
    )  # fmt: skip
    def rated_shared_b(self: Any, job: str, n: int = 0) -> str:
        return _rate_start(self, job)

    @_app_task(
        app, base=LockedTask, bind=True, name="fault.rated_customer", lock_rate="2/s",
        lock_rate_key=lambda job, customer, n=0: f"fault-customer:{job}:{customer}",
        max_retries=0, shared=False,
    )  # fmt: skip
    def rated_customer(self: Any, job: str, customer: str, n: int = 0) -> str:
        return _rate_start(self, job, customer=customer)

    @_app_task(
        app, base=LockedTask, bind=True, name="fault.rated_429", lock_rate="50/s",
        lock_rate_key=lambda job, n=0: f"fault-429:{job}", max_retries=0, shared=False,
    )  # fmt: skip
    def rated_429(self: Any, job: str, n: int = 0) -> str:
        """The first call of a job is told "slow down" for 2 s by the partner (its body raises
        RateLimited once); the others run."""
        result = _rate_start(self, job)
        if n == 0 and data(self.app).set(f"told:{job}", 1, nx=True):
            raise RateLimited(retry_after=2)
        return result

    @_app_task(
        app, base=LockedTask, bind=True, name="fault.rated_limited", lock_rate="4/s",
        lock_limit=2, lock_on_locked="wait", lock_wait_timeout=20, max_retries=0,
        lock_unique_on=["job"], shared=False,
    )  # fmt: skip
    def rated_limited(self: Any, job: str, n: int = 0, seconds: float = 0.3) -> str:
        """Two at once and four starts a second per job; a call over two at once waits for a
        slot, then for its turn."""
        start = _enter(self, job)
        _rate_start(self, job)
        _sleep(seconds)
        _leave(self, job, start)
        return str(self.request.id)

    @_app_task(
        app, base=LockedTask, bind=True, name="fault.rated_publish", lock_at="publish",
        lock_rate="1/s", lock_rate_key=lambda job, n=0: f"fault-pub:{job}", max_retries=0,
        shared=False,
    )  # fmt: skip
    def rated_publish(self: Any, job: str, n: int = 0) -> str:
        """Deduplicated at publish (one job per n) and one start a second per job."""
        return _rate_start(self, job)

    @_app_task(
        app, base=LockedTask, bind=True, name="fault.rated_plan",
        lock_rate=lambda job, plan, n=0: "3/s" if plan == "pro" else "1/s",
        lock_rate_key=lambda job, plan, n=0: f"fault-plan:{job}:{plan}", max_retries=0,
        shared=False,
    )  # fmt: skip
    def rated_plan(self: Any, job: str, plan: str, n: int = 0) -> str:
        """A limit by plan: three starts a second for "pro", one for the others."""
        return _rate_start(self, job, plan=plan)

    @_app_task(
        app, base=PartnerTask, bind=True, name="fault.rated_mapped", lock_rate="50/s",
        lock_rate_key=lambda job, n=0: f"fault-mapped:{job}", max_retries=0, shared=False,
    )  # fmt: skip
    def rated_mapped(self: Any, job: str, n: int = 0) -> str:
        """The first call of a job meets the partner's own "busy" error (mapped to a pause of
        1 s by the task class); the others run."""
        result = _rate_start(self, job)
        if n == 0 and data(self.app).set(f"told:{job}", 1, nx=True):
            raise PartnerBusy(1.0)
        return result

    @_app_task(
        app, base=LockedTask, bind=True, name="fault.rated_queue", lock_at="queue",
        lock_rate="1/2s", lock_unique_on=["job"], max_retries=0, shared=False,
    )  # fmt: skip
    def rated_queue(self: Any, job: str, n: int = 0) -> str:
        """One queued and one running per job, and one start per 2 s."""
        return _rate_start(self, job)

    @_app_task(
        app, base=LockedTask, bind=True, name="fault.rated_impatient", lock_rate="1/m",
        lock_rate_key=lambda job, n=0: f"fault-impatient:{job}", lock_rate_max_delay=0,
        shared=False,
    )  # fmt: skip
    def rated_impatient(self: Any, job: str, n: int = 0) -> str:
        """One start a minute per job, and no waiting for a turn: lock_on_locked at once."""
        return _rate_start(self, job)

    @_app_task(
        app, base=LockedTask, bind=True, name="fault.rated_impatient_soon", lock_rate="1/0.2s",
        lock_rate_key=lambda job, n=0: f"fault-impatient-soon:{job}", lock_rate_max_delay=0,
        shared=False,
    )  # fmt: skip
    def rated_impatient_soon(self: Any, job: str, n: int = 0) -> str:
        """One start per 0.2 s per job, and no waiting for a turn, however near it is."""
        return _rate_start(self, job)

    @_app_task(
        app, base=LockedTask, bind=True, name="fault.rated_impatient_raise", lock_rate="1/m",
        lock_rate_key=lambda job, n=0: f"fault-impatient:{job}", lock_rate_max_delay=0,
        lock_on_locked="raise", shared=False,
    )  # fmt: skip
    def rated_impatient_raise(self: Any, job: str, n: int = 0) -> str:
        return _rate_start(self, job)

    return app


class PartnerBusy(Exception):
    """A client library's own "429 Too Many Requests", with the partner's Retry-After."""

    def __init__(self, retry_after: float) -> None:
        super().__init__(f"busy, retry after {retry_after} s")
        self.retry_after_s = retry_after


class PartnerTask(LockedTask):
    """A task class that maps the partner's "busy" error to a pause of its limiter."""

    def rate_limit_pause(self, exc: BaseException) -> float | None:
        if isinstance(exc, PartnerBusy):
            return exc.retry_after_s
        return super().rate_limit_pause(exc)


#: the message header of a rate comeback: ``[comebacks, since, retries]`` (docs/limits.md)
RATE_HEADER = "singleton_lock_rate"


def _comebacks(request: Any) -> int:
    """The comebacks a call's message counts: only a comeback's own (a later retry of the run
    copies the header along, with other ``retries``)."""
    value = request.get(RATE_HEADER)
    if isinstance(value, list | tuple) and len(value) == 3 and value[2] == (request.retries or 0):
        return int(value[0])
    return 0


def _rate_start(task: Any, job: str, **extra: Any) -> str:
    """Record a start of a rate-limited body: the limiter's start (Redis's clock), the body's
    own reading of Redis's clock, and who ran it."""
    turn = task.rate_turn
    client = data(task.app)
    seconds, micros = client.time()
    item = {
        "id": task.request.id,
        "pid": os.getpid(),
        "at": turn.at if turn is not None else None,
        "t": seconds + micros / 1e6,
        "retries": task.request.retries,
        "comebacks": _comebacks(task.request),
        **extra,
    }
    client.rpush(f"rate:{job}", json.dumps(item))
    return str(task.request.id)


if os.environ.get(URL_ENV):
    _vis = os.environ.get(VISIBILITY_ENV)
    app = make_app(
        os.environ[URL_ENV],
        visibility=float(_vis) if _vis else None,
        beat=os.environ.get(BEAT_ENV) == "1",
    )
    if os.environ.get(PICKLE_ENV) == "1":
        app.conf.accept_content = ["json", "pickle"]
    if os.environ.get(TTL_ENV):
        app.conf.singleton_lock_ttl = float(os.environ[TTL_ENV])
    if os.environ.get(COUNTS_ENV) == "0":
        app.conf.singleton_lock_counts = False
    if os.environ.get(METRICS_ENV):
        app.conf.update(
            singleton_lock_metrics_port=int(os.environ[METRICS_ENV]),
            singleton_lock_metrics_address="127.0.0.1",
        )
