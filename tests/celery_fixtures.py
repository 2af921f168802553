"""Helpers of the Celery tests: a real Redis started by the test module, an app configured
on it (broker on db 0, results on db 1, locks on db 2) and a real embedded worker
(:func:`celery.contrib.testing.worker.start_worker`) running the module's tasks.

Each ``tests/test_celery_*.py`` module defines its app and tasks at module level (distinct
task names), then uses :func:`celery_env` from a module-scoped fixture: one server, one worker
per module keeps the suite fast. Blocking task bodies use :class:`Gates` (the worker runs in
this process with the ``threads`` pool, so a ``threading.Event`` reaches the body).

A test makes its in-process apps with :func:`new_app` (or :func:`bare_app`; :func:`configure`
counts too): every test ends with :func:`close_apps` (``tests/conftest.py``), which writes the
recent counts those apps have not written yet, into the Redis the test used and while it still
runs, and ends their writer threads: without it a count's write lands about a second later,
in whatever the next test put on that server.
"""

from __future__ import annotations

import gc
import shutil
import threading
import weakref
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar, cast, overload

import redis
from celery import Celery
from celery.contrib.testing.worker import start_worker
from kombu.asynchronous import set_event_loop
from lock_helpers import wait_until

from celery_singleton_lock import LockedTask, close, reload_settings
from celery_singleton_lock.testing import RedisServer

DB_BROKER, DB_RESULTS, DB_LOCKS = 0, 1, 2

#: configuration every test app gets (fast, quiet, nothing left to chance)
BASE_CONF: dict[str, Any] = {
    "task_serializer": "json",
    "result_serializer": "json",
    "accept_content": ["json", "pickle"],
    "result_accept_content": ["json", "pickle"],
    "worker_hijack_root_logger": False,
    "worker_redirect_stdouts": False,
    "broker_connection_retry_on_startup": True,
    "task_default_queue": "celery",
    "result_expires": 3600,
    "worker_prefetch_multiplier": 4,
    # an idle worker's BRPOP returns every 0.1 s (kombu's default: 1 s), so that a worker
    # stops within a fraction of a second instead of a second at the end of each module
    "broker_transport_options": {"polling_interval": 0.1},
    # a result backend whose server a finished module stopped: give up at once (an
    # AsyncResult collected later unsubscribes from it)
    "result_backend_transport_options": {
        "retry_policy": {
            "max_retries": 1,
            "interval_start": 0,
            "interval_step": 0.1,
            "interval_max": 0.1,
        },
    },
}


TaskT = TypeVar("TaskT", bound=LockedTask)


@overload
def app_task(
    app: Celery, *, base: type[TaskT], **options: Any
) -> Callable[[Callable[..., Any]], TaskT]: ...
@overload
def app_task(app: Celery, **options: Any) -> Callable[[Callable[..., Any]], Any]: ...
def app_task(app: Celery, **options: Any) -> Callable[[Callable[..., Any]], Any]:
    """``app.task(**options)``, typed: celery ships no type information. The task it makes of a
    function (a proxy to it until the app is finalized) is an instance of ``base``."""
    return cast("Callable[[Callable[..., Any]], Any]", app.task(**options))


#: the apps made in this process by :func:`new_app`, configured by :func:`configure` or given
#: to :func:`track`, held weakly: what :func:`close_apps` closes at the end of every test
_apps: weakref.WeakSet[Celery] = weakref.WeakSet()


def track(app: Celery) -> Celery:
    """``app``, closed by :func:`close_apps` at the end of every test from now on."""
    _apps.add(app)
    return app


def new_app(main: str, **options: Any) -> Celery:
    """``Celery(main, set_as_current=False, **options)``, closed by :func:`close_apps` at the
    end of every test: for module-level task definitions (:func:`configure` points it at a
    server) and for a test's own app."""
    options.setdefault("set_as_current", False)
    return track(Celery(main, **options))


def close_apps() -> None:
    """Close (:func:`celery_singleton_lock.close`) every app made by :func:`new_app` or
    configured by :func:`configure`: their recent counts written now, their writer threads
    ended. Run as each test ends, before its fixtures stop or empty a server, and before
    :func:`own_redis_server` stops its server.

    An app whose Redis did not take its counts (the test stopped that server first: logged on
    ``celery_singleton_lock.counts``) is no longer closed here: trying again at every later
    test's end would only log it again, or write into a server that took the port since."""
    for app in list(_apps):
        if not close(app):
            _apps.discard(app)


def retire(app: Celery) -> None:
    """Done with ``app`` for good (its server is about to stop): closed now, and no longer
    closed by :func:`close_apps`, which would try its stopped server with a later count."""
    close(app)
    _apps.discard(app)


def bare_app(server: RedisServer, main: str, **conf: Any) -> Celery:
    """An app with only a broker and a result backend on ``server`` (databases 0 and 1), and
    ``conf``: for settings that decide where the locks live."""
    app = new_app(main)
    base = f"redis://127.0.0.1:{server.port}"
    app.conf.update(broker_url=f"{base}/0", result_backend=f"{base}/1", **conf)
    return app


def configure(app: Celery, server: RedisServer, **conf: Any) -> None:
    settings = dict(BASE_CONF)
    settings.update(
        broker_url=f"redis://127.0.0.1:{server.port}/{DB_BROKER}",
        result_backend=f"redis://127.0.0.1:{server.port}/{DB_RESULTS}",
        singleton_lock_redis_url=f"redis://127.0.0.1:{server.port}/{DB_LOCKS}",
    )
    settings.update(conf)
    app.conf.update(settings)
    reload_settings(app)
    track(app)


class Gates:
    """Per-key events a task body can block on: ``enter(key)`` counts a run of the body, says
    it started, and blocks until the test calls ``open(key)`` (at most ``timeout`` s)."""

    def __init__(self) -> None:
        self._mutex = threading.Lock()
        self._started: dict[str, threading.Event] = defaultdict(threading.Event)
        self._release: dict[str, threading.Event] = defaultdict(threading.Event)
        self.runs: dict[str, int] = defaultdict(int)
        self.data: dict[str, list[Any]] = defaultdict(list)

    def _events(self, key: str) -> tuple[threading.Event, threading.Event]:
        with self._mutex:
            return self._started[key], self._release[key]

    def enter(self, key: str, timeout: float = 15.0) -> bool:
        started, release = self._events(key)
        with self._mutex:
            self.runs[key] += 1
        started.set()
        return release.wait(timeout)

    def mark(self, key: str, value: Any = None) -> None:
        """Count a run of a body that does not block (and keep ``value``)."""
        started, _ = self._events(key)
        with self._mutex:
            self.runs[key] += 1
            self.data[key].append(value)
        started.set()

    def wait_started(self, key: str, timeout: float = 10.0) -> None:
        started, _ = self._events(key)
        assert started.wait(timeout), f"the body for {key!r} did not start within {timeout} s"

    def open(self, key: str) -> None:
        self._events(key)[1].set()

    def open_all(self) -> None:
        with self._mutex:
            events = list(self._release.values())
        for event in events:
            event.set()


@dataclass
class CeleryEnv:
    app: Celery
    server: RedisServer
    worker: Any

    @property
    def locks(self) -> redis.Redis:
        """A client of the lock database (db 2)."""
        return cast(redis.Redis, self.server.client(db=DB_LOCKS))

    @property
    def broker(self) -> redis.Redis:
        return cast(redis.Redis, self.server.client(db=DB_BROKER))

    def state(self, task_id: str) -> str:
        return str(self.app.AsyncResult(task_id).state)

    def wait_state(self, task_id: str, *states: str, timeout: float = 10.0) -> str:
        def reached() -> str | None:
            state = self.state(task_id)
            return state if state in states else None

        try:
            return str(wait_until(reached, timeout))
        except AssertionError:
            raise AssertionError(
                f"task {task_id} is {self.state(task_id)}, not one of {states}, after {timeout} s"
            ) from None

    def meta(self, task_id: str) -> Any:
        return self.app.AsyncResult(task_id).info


def forget_results(app: Celery) -> None:
    """Forget the result subscriptions of ``app`` while its redis-server still runs.

    The Redis result backend subscribes to a task's result channel when the task is sent, and
    an ``AsyncResult`` unsubscribes when it is garbage-collected. A failed test keeps its
    results alive (in the traceback) until after the server is gone, and their unsubscribe
    would then retry against a dead server (an "Exception ignored in AsyncResult.__del__"
    warning in a later test): forget the subscriptions now instead.
    """
    consumer = getattr(app.backend, "result_consumer", None)
    if consumer is not None:
        consumer.subscribed_to.clear()
        consumer.stop()
        # Celery before 5.5 still unsubscribes on a stopped consumer (AsyncResult.__del__),
        # retrying against the gone server for about 20 s: without a pubsub it does nothing.
        consumer._pubsub = None  # noqa: SLF001  # (see above): no public way to stop it


@contextmanager
def own_redis_server() -> Iterator[RedisServer]:
    """A redis-server of the caller's own (not the session's ``redis_server`` fixture): started,
    then stopped and its directory removed when the block ends."""
    server = RedisServer()
    server.start()
    try:
        yield server
    finally:
        close_apps()  # the counts of the apps on it written while it runs
        server.stop()
        shutil.rmtree(server.dir, ignore_errors=True)


@contextmanager
def running_worker(
    app: Celery, pool: str = "threads", concurrency: int = 8, **kwargs: Any
) -> Iterator[Any]:
    with start_worker(
        app,
        pool=pool,
        concurrency=concurrency,
        perform_ping_check=False,
        shutdown_timeout=30,
        loglevel="WARNING",
        **kwargs,
    ) as worker:
        # Tick the event loop: without it an idle asynloop (the amqp transport) only sees the
        # stop request when its poll times out, about 10 s later.
        worker.timer.call_repeatedly(0.3, lambda: None)
        try:
            yield worker
        finally:
            # The worker's event loop is kombu's process-wide "current" loop, and the next
            # in-process worker would take it over, timer and all: on Celery 5.4 its ETA
            # messages (retry countdowns) then never fire. Every worker gets a loop of its own.
            set_event_loop(None)


@contextmanager
def celery_env(
    app: Celery,
    gates: Gates | None = None,
    pool: str = "threads",
    concurrency: int = 8,
    **conf: Any,
) -> Iterator[CeleryEnv]:
    """A Redis server of its own, ``app`` configured on it and a worker running its tasks."""
    with own_redis_server() as server:
        configure(app, server, **conf)
        with running_worker(app, pool=pool, concurrency=concurrency) as worker:
            try:
                yield CeleryEnv(app, server, worker)
            finally:
                if gates is not None:
                    gates.open_all()
        # collect the module's AsyncResults while their result backend still answers
        gc.collect()
        forget_results(app)
        retire(app)  # its last counts, before the server stops


# -- the package's commands, as a user's shell finds them ---------------------------------------


def _entry_point(group: str, name: str) -> Any:
    """The package's entry point ``name`` of ``group``, loaded (what the installed package
    gives a shell: the tests reach its commands the same way, not through a private module)."""
    from importlib.metadata import entry_points

    (found,) = (
        ep
        for ep in entry_points(group=group, name=name)
        if ep.dist is not None and ep.dist.name == "celery-singleton-lock"
    )
    return found.load()


def locks_command() -> Any:
    """``celery ... locks``: the ``click`` group the ``celery`` command adds (its
    ``celery.commands`` entry point)."""
    return _entry_point("celery.commands", "locks")


def cli_main(argv: list[str]) -> None:
    """``celery-singleton-lock ARGS`` (the console script, also ``python -m
    celery_singleton_lock``), in this process."""
    _entry_point("console_scripts", "celery-singleton-lock")(argv)


class _AnyTask(LockedTask):
    """A locked task class of no app of its own: its public ``lock_space(app)`` is what every
    locked task of ``app`` (with the default prefix) locks in."""


def lock_space(app: Celery) -> Any:
    """``app``'s locks under its ``singleton_lock_prefix``, on its lock client (``.client``), as
    a locked task of ``app`` sees them (``LockedTask.lock_space``)."""
    return _AnyTask.lock_space(app)
