"""Real ``celery worker`` / ``celery beat`` subprocesses for the fault tests, and bounded waits.

A :class:`WorkerProcess` runs ``python -m celery -A tests.faultapp worker`` in a process group
of its own (``start_new_session``), logs to a file the tests read, is ready when its log says
so, and is always stopped: SIGTERM, then SIGKILL to its whole group (main process, pool
children, embedded beat) if it does not exit in time.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import re
import signal
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import faultapp
import redis
from celery_fixtures import forget_results, retire
from lock_helpers import START_TIMEOUT, wait_until

ROOT = Path(__file__).resolve().parent.parent


def redis_base(port: int) -> str:
    return f"redis://127.0.0.1:{port}"


class WorkerProcess:
    """One ``celery worker`` subprocess (``-P pool -c concurrency``)."""

    def __init__(
        self,
        base: str,
        log_dir: Path,
        *,
        pool: str = "prefork",
        concurrency: int = 2,
        env: dict[str, str] | None = None,
        args: tuple[str, ...] = (),
    ) -> None:
        self.base = base
        self.node = f"fault-{uuid.uuid4().hex[:8]}"
        self.hostname = f"{self.node}@{socket.gethostname()}"
        self.log_path = Path(log_dir) / f"{self.node}.log"
        self.pool = pool
        self.concurrency = concurrency
        self.env = dict(env or {})
        self.args = args
        self.proc: subprocess.Popen[bytes] | None = None
        self._log_file: Any = None

    def command(self) -> list[str]:
        cmd = [
            sys.executable, "-m", "celery", "-A", "tests.faultapp", "worker",
            "-P", self.pool, "-n", self.hostname,
            "--without-mingle", "--without-gossip", "--without-heartbeat",
            "-l", "info", "-Q", "fault",
        ]  # fmt: skip
        if self.pool != "solo":
            cmd += ["-c", str(self.concurrency)]
        return cmd + list(self.args)

    def start(self, timeout: float = START_TIMEOUT) -> WorkerProcess:
        env = dict(os.environ)
        env.update(self.env)
        env[faultapp.URL_ENV] = self.base
        env["PYTHONPATH"] = os.pathsep.join(
            [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]
        )
        env["PYTHONUNBUFFERED"] = "1"
        self._log_file = open(self.log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            self.command(),
            cwd=ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            wait_until(self._ready, timeout, f"worker {self.hostname} to be ready", 0.05)
        except BaseException:
            self.stop()
            raise
        return self

    def _ready(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(
                f"worker exited with {self.proc.returncode} at start:\n{self.log()[-4000:]}"
            )
        return re.search(r"\bready\.", self.log()) is not None

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def wait_log(self, pattern: str, timeout: float, count: int = 1) -> list[re.Match[str]]:
        """Wait until ``pattern`` (a regex) matches the log ``count`` times."""

        def found() -> list[re.Match[str]] | None:
            matches = list(re.finditer(pattern, self.log()))
            return matches if len(matches) >= count else None

        return wait_until(found, timeout, f"{pattern!r} in the log of {self.hostname}", 0.05)

    def accepted(self, app: Any, task_id: str, timeout: float = 10.0) -> int:
        """Wait until the worker's main process has read that a pool process accepted
        ``task_id`` (``inspect active`` gives its pid); returns that pid. A test that kills the
        pool process waits for this first: billiard sends a job it has not seen accepted to
        another pool process instead of failing it with ``WorkerLostError``."""

        def pid() -> int | None:
            active = app.control.inspect([self.hostname], timeout=1.0).active() or {}
            for request in active.get(self.hostname, []):
                if request.get("id") == task_id and request.get("worker_pid"):
                    return int(request["worker_pid"])
            return None

        return wait_until(pid, timeout, f"{task_id} accepted by a pool process of {self.hostname}")

    def children(self) -> list[int]:
        """Pids of the main process's child processes (pool children, embedded beat)."""
        try:
            text = Path(f"/proc/{self.pid}/task/{self.pid}/children").read_text()
        except OSError:
            return []
        return [int(p) for p in text.split()]

    def signal(self, signum: int) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signum)

    def kill_group(self) -> None:
        """SIGKILL the main process and every process of its group at once."""
        assert self.proc is not None
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)

    def wait(self, timeout: float) -> int:
        assert self.proc is not None
        return self.proc.wait(timeout)

    def stop(self, timeout: float = 15.0) -> None:
        """Warm shutdown (SIGTERM), then SIGKILL to the whole group if it takes too long."""
        if self.proc is None:
            return
        try:
            if self.proc.poll() is None:
                self.proc.send_signal(signal.SIGTERM)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.proc.wait(timeout)
            # Whatever is left of the group (a child that outlived its main process).
            self.kill_group()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(5)
        finally:
            if self._log_file is not None:
                self._log_file.close()
                self._log_file = None

    def __enter__(self) -> WorkerProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def close_app(app: Any) -> None:
    """Close the test-process app while its redis-server still runs (see
    :func:`celery_fixtures.forget_results`)."""
    forget_results(app)
    retire(app)  # its counts written, its thread ended: nothing lands on the server after
    app.close()


def records(client: Any, kind: str, job: str) -> list[dict[str, Any]]:
    """The JSON items the tasks recorded (``starts``, ``intervals``, ...) for ``job``."""
    return [json.loads(item) for item in client.lrange(f"{kind}:{job}", 0, -1)]


def new_job(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def no_overlap(intervals: list[dict[str, Any]]) -> bool:
    ordered = sorted(intervals, key=lambda i: i["start"])
    return all(b["start"] >= a["end"] for a, b in itertools.pairwise(ordered))


def task_states(results: Any, ids: list[str]) -> dict[str, str]:
    """The stored state of each task of ``ids`` that has one (``results``: a client of the
    result backend's Redis database), read in batches."""
    states: dict[str, str] = {}
    for chunk in range(0, len(ids), 500):
        batch = ids[chunk : chunk + 500]
        metas = results.mget([f"celery-task-meta-{i}" for i in batch])
        for task_id, raw in zip(batch, metas, strict=True):
            if raw is not None:
                states[task_id] = json.loads(raw)["status"]
    return states


@contextlib.contextmanager
def hanging_job(
    port: int, log_dir: Path, task_name: str
) -> Iterator[tuple[Any, str, Any, WorkerProcess]]:
    """A one-child ``celery worker`` subprocess on the server at ``port``, running
    ``task_name(job, 60)`` (a fault-app task that records its start, then sleeps): yields the
    task, the job, the first run's result and the worker once that run has started."""
    base = redis_base(port)
    app = faultapp.make_app(base)
    worker = WorkerProcess(base, log_dir, concurrency=1).start()
    data = redis.Redis(port=port, db=faultapp.DATA_DB)
    try:
        task = app.tasks[task_name]
        job = new_job(task_name.rsplit(".", 1)[-1])
        first = task.delay(job, 60)
        wait_until(lambda: data.llen(f"starts:{job}") == 1, 20, f"{task_name} to start")
        yield task, job, first, worker
    finally:
        worker.stop()
        close_app(app)
        data.close()
