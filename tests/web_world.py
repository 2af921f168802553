"""A whole deployment for the web page's browser tests and ``scripts/screenshots``: a
redis-server, a ``celery worker`` and a ``celery beat`` (the leader scheduler) of the fault
tests' app, the standalone page (``celery -A tests.faultapp locks web``) on a free loopback
port, and a realistic set of locks taken by real calls of real tasks:

- a running job (``fault.web_work``, its run lasts until the world says go);
- a queued copy (``fault.web_queued``, ``lock_at="queue"``, in a queue no worker reads);
- a cooldown (``fault.cooled_long``: 60 s after its run);
- two slots of three (``fault.web_slots``, ``lock_limit=3``);
- a rate limiter in use, with a refusal (``fault.rated_impatient``, one start a minute);
- the beat leader (``<prefix>:{beat:faultapp}``).
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import faultapp
import redis
from beatproj.harness import LEADER_SCHEDULER, Beat
from celery import Celery
from celery_procs import ROOT, WorkerProcess, close_app, new_job, redis_base
from lock_helpers import START_TIMEOUT, wait_until

from celery_singleton_lock import LockSpace
from celery_singleton_lock.testing import RedisServer

PREFIX = "lock"
#: the suffix of a queued lock's name: `<job's lock name>:queued` (docs/upgrading.md)
QUEUED = ":queued"
#: the token that lets the page change locks (given to the server in its environment)
TOKEN = "open-sesame-4f2a"
#: the leader lock of the fault app's beats
BEAT_KEY = f"{PREFIX}:{{beat:faultapp}}"
#: a queue no worker reads: a message published to it waits there
PARKED = "parked"


def free_port() -> int:
    """A TCP port free on loopback now (the server binds it a moment later)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class WebServer:
    """``celery -A tests.faultapp locks web`` on a free loopback port, as an operator runs it
    (the token in its environment), logging to a file; stopped with SIGTERM, then SIGKILL."""

    def __init__(
        self, base: str, log_dir: Path, token: str | None = TOKEN, args: tuple[str, ...] = ()
    ) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/"
        self.log_path = log_dir / "web.log"
        env = {**os.environ, faultapp.URL_ENV: base, "PYTHONUNBUFFERED": "1"}
        env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
        env.pop("CELERY_SINGLETON_LOCK_WEB_TOKEN", None)
        if token is not None:
            env["CELERY_SINGLETON_LOCK_WEB_TOKEN"] = token
        command = [
            sys.executable, "-m", "celery", "-A", "tests.faultapp", "locks", "web",
            "--host", "127.0.0.1", "--port", str(self.port), "--refresh", "0", *args,
        ]  # fmt: skip
        self._log = open(self.log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            command, cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=self._log,
            stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        try:
            wait_until(self._answers, START_TIMEOUT, f"the web page at {self.url}", 0.05)
        except BaseException:
            self.stop()
            raise

    def _answers(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(
                f"the web server exited with {self.proc.returncode}:\n{self.log()}"
            )
        try:
            with urllib.request.urlopen(self.url, timeout=5) as reply:
                return int(reply.status) == 200
        except (urllib.error.URLError, ConnectionError):
            return False

    def page(self) -> str:
        """The list page's HTML."""
        with urllib.request.urlopen(self.url, timeout=10) as reply:
            return str(reply.read().decode())

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._log.close()


@dataclass
class World:
    """What :func:`locks_world` started and the jobs whose locks it took."""

    server: RedisServer
    app: Celery
    worker: WorkerProcess
    beat: Beat
    web: WebServer
    locks: Any  # a client of the locks' database
    data: Any  # a client of what the tasks record
    jobs: dict[str, str] = field(default_factory=dict)
    task_ids: dict[str, list[str]] = field(default_factory=dict)

    @property
    def space(self) -> LockSpace:
        return LockSpace(self.locks, PREFIX)

    def key(self, task_name: str, job: str) -> str:
        """The Redis key of the (first permit of the) lock of ``task_name(job)``."""
        task = self.app.tasks[task_name]
        return self.space.keys(task.locking.lock_name(task.name, [job], {})).lock

    def queued_key(self, task_name: str, job: str) -> str:
        """The Redis key of the queued copy's lock of ``task_name(job)`` (``lock_at="queue"``)."""
        task = self.app.tasks[task_name]
        return self.space.keys(task.locking.lock_name(task.name, [job], {}) + QUEUED).lock

    def starts(self, job: str) -> list[str]:
        """The task ids of the runs of ``job`` that started, in order."""
        return [item["id"] for item in faultapp.records_of(self.app, "starts", job)]

    def start_run(self, job: str) -> str:
        """Call ``fault.web_work(job)`` and wait until that call's run started; its task id."""
        result = self.app.tasks["fault.web_work"].delay(job)
        self.jobs.setdefault(job, job)
        wait_until(lambda: result.id in self.starts(job), 30, f"web_work({job}) to start")
        self.task_ids.setdefault(job, []).append(result.id)
        return str(result.id)

    def held_state(self, key: str) -> str | None:
        state = self.space.inspect(key)
        return state.state if state.held else None


def populate(world: World, long_job: str = "") -> None:
    """Take the locks the module docstring lists, by calling the tasks; returns once each is
    as the page should show it. ``long_job``: a job name for one more queued copy (a key too
    long for a table cell)."""
    app, jobs = world.app, world.jobs
    jobs.update(
        running=new_job("nightly-report"),
        queued=new_job("resize-image"),
        cooled=new_job("sync-customer"),
        slots=new_job("export-batch"),
        rated=new_job("partner-api"),
    )
    world.start_run(jobs["running"])
    slots = [app.tasks["fault.web_slots"].delay(jobs["slots"]) for _ in range(2)]
    wait_until(lambda: len(world.starts(jobs["slots"])) == 2, 30, "two slots to run")
    world.task_ids["slots"] = [r.id for r in slots]
    app.tasks["fault.cooled_long"].delay(jobs["cooled"])
    cooled_key = world.key("fault.cooled_long", jobs["cooled"])
    wait_until(lambda: world.held_state(cooled_key) == "cooldown", 30, "the cooldown")
    queued = app.tasks["fault.web_queued"]
    queued.apply_async((jobs["queued"],), queue=PARKED)
    if long_job:
        jobs["long"] = long_job
        queued.apply_async((long_job,), queue=PARKED)
    rated = app.tasks["fault.rated_impatient"]
    first = rated.delay(jobs["rated"])

    def ran() -> list[str]:
        return [r["id"] for r in faultapp.records_of(app, "rate", jobs["rated"])]

    wait_until(lambda: first.id in ran(), 30, "the rated job's start")
    rated.delay(jobs["rated"], 1)  # refused: one start a minute
    # the beat started with the world: its start may be what is left to wait for
    wait_until(lambda: world.space.inspect(BEAT_KEY).holder, START_TIMEOUT, "a beat to lead")
    # The page keeps one read for every viewer a while (longer after a slow read, as its
    # first one may be on a loaded machine): the tests start once it has read these locks.
    shown = [BEAT_KEY, world.key("fault.web_work", jobs["running"])]
    shown.append(world.queued_key("fault.web_queued", jobs["queued"]))
    wait_until(lambda: all(k in world.web.page() for k in shown), 60, "the page to list them")


def finish(world: World) -> None:
    """Let every run that waits for the word go end (so the worker stops at once)."""
    for job in world.jobs.values():
        world.data.set(f"go:{job}", 1)


@contextlib.contextmanager
def locks_world(
    log_dir: Path, token: str | None = TOKEN, web_args: tuple[str, ...] = ()
) -> Iterator[World]:
    """Everything the module docstring lists, running; stopped at the end (no locks taken yet:
    :func:`populate` takes them). ``web_args``: more options of ``locks web``."""
    with contextlib.ExitStack() as stack:
        server = stack.enter_context(RedisServer())
        base = redis_base(server.port)
        app = faultapp.make_app(base)
        stack.callback(close_app, app)
        worker = WorkerProcess(base, log_dir, concurrency=6).start()
        stack.callback(worker.stop)
        env = {faultapp.URL_ENV: base, faultapp.BEAT_ENV: "1"}
        beat = Beat("tests.faultapp", log_dir, 1, env, LEADER_SCHEDULER)
        stack.callback(beat.stop)
        web = WebServer(base, log_dir, token, web_args)
        stack.callback(web.stop)
        locks = redis.Redis(port=server.port, db=faultapp.LOCK_DB, decode_responses=True)
        data = redis.Redis(port=server.port, db=faultapp.DATA_DB)
        stack.callback(locks.close)
        stack.callback(data.close)
        world = World(server, app, worker, beat, web, locks, data)
        stack.callback(finish, world)
        yield world
