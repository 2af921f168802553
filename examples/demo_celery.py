#!/usr/bin/env python
"""The Celery job, shown with a real worker: what ``scripts/demo`` runs.

    python examples/demo_celery.py               # $REDIS_URL, else 127.0.0.1:6379/15, else its own
    python examples/demo_celery.py --embedded    # always a throw-away server of its own

It starts a ``celery worker`` subprocess (prefork, 4 processes) and shows, a few lines each:
a run-time duplicate skipped with the holder named, ``celery locks list`` while a task runs, a
publish-time duplicate returning the first job's AsyncResult, a retry that keeps its lock, and
the worker SIGKILLed mid-task with the lock freed within one lease. Task ids are shortened to
8 characters for reading. Exits 0, or 1 if anything did not go as described. On a Redis of
yours it touches only a queue and keys named for this run, and deletes them at the end.

The module is also the Celery app the worker imports (``celery -A demo_celery worker``).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

_HERE = Path(__file__).resolve().parent
_ROOT = _HERE.parent
if (_ROOT / "celery_singleton_lock").is_dir() and str(_ROOT) not in sys.path:
    sys.path.insert(0, str(_ROOT))  # run from a checkout without installing

import redis
from _support import check, problems, redis_url, say
from celery import Celery

from celery_singleton_lock import LockedTask

# -- the Celery app: what a project would write -------------------------------------------------

REDIS_URL = os.environ.get("DEMO_URL", "redis://127.0.0.1:6379/0")
RUN = os.environ.get("DEMO_RUN", "demo")

app = Celery("demo_celery", broker=REDIS_URL, backend=REDIS_URL)
app.conf.update(
    task_default_queue=f"{RUN}-queue",  # a queue of this run only
    singleton_lock_prefix=f"{RUN}-lock",  # lock keys of this run only
    broker_connection_retry_on_startup=True,
    result_expires=600,
    worker_prefetch_multiplier=1,
)


@app.task(base=LockedTask)
def rebuild_index(shard: int) -> str:
    """A singleton: a second run of the same shard while one runs is skipped."""
    time.sleep(3.0)
    return f"shard {shard} rebuilt"


@app.task(base=LockedTask, lock_at="publish")
def send_report(day: str) -> str:
    """Deduplicated: a second .delay() while one is queued or running returns the first."""
    time.sleep(2.0)
    return f"report for {day} sent"


@app.task(base=LockedTask, bind=True, max_retries=3)
def sync_account(self: Any, account_id: int) -> str:
    """Fails once, retries in 2 s: the retry keeps the lock, so no duplicate gets in."""
    if self.request.retries == 0:
        raise self.retry(countdown=2.0)
    return f"account {account_id} synced on try {self.request.retries + 1}"


@app.task(base=LockedTask, lock_ttl=3)
def import_feed(feed: str) -> None:
    """Runs long, with a 3 s lease that the worker's heartbeat renews while it lives."""
    time.sleep(60.0)


# -- the script ----------------------------------------------------------------------------------

#: used when $REDIS_URL is not set and a server answers here (only this run's keys are touched)
LOCAL_REDIS = "redis://127.0.0.1:6379/15"


#: every AsyncResult seen, to forget() at the end
results: list[Any] = []


def short(task_id: str | None) -> str:
    return (task_id or "-")[:8]


def wait(predicate: Any, timeout: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


class Worker:
    """A ``celery worker`` subprocess in a process group of its own (to kill it whole)."""

    def __init__(self, env: dict[str, str], log: Path) -> None:
        self.name = f"demo-{uuid.uuid4().hex[:6]}@127.0.0.1"
        cmd = [
            sys.executable, "-m", "celery", "-A", "demo_celery", "worker", "-P", "prefork",
            "-c", "4", "-n", self.name, "--loglevel", "INFO", "--without-gossip",
            "--without-mingle",
        ]  # fmt: skip
        self.out = open(log, "ab")  # noqa: SIM115 - open for the worker's whole life
        self.proc = subprocess.Popen(
            cmd, cwd=str(_HERE), env=env, stdout=self.out, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
        deadline = time.monotonic() + 60
        while not app.control.ping(destination=[self.name], timeout=0.5):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"the worker did not start; its log:\n{log.read_text()}")

    def kill(self) -> None:
        os.killpg(self.proc.pid, signal.SIGKILL)  # the main process and its pool children
        self.proc.wait()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()  # warm shutdown
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.kill()
        self.out.close()


def locks_list(env: dict[str, str]) -> str:
    cmd = [sys.executable, "-m", "celery", "-A", "demo_celery", "locks", "list"]
    done = subprocess.run(cmd, cwd=str(_HERE), env=env, capture_output=True, text=True, timeout=60)
    return (done.stdout + done.stderr).rstrip()


def demo(env: dict[str, str]) -> None:
    say()
    say("== 1. A singleton task: a second run while one runs is skipped, the holder named")
    first = rebuild_index.delay(7)
    results.append(first)
    wait(lambda: rebuild_index.lock_holder(7) == first.id)
    dup = rebuild_index.delay(7)
    results.append(dup)
    say(f"rebuild_index.delay(7) -> {short(first.id)} (running)")
    wait(lambda: dup.state == "SKIPPED")
    holder = (dup.info or {}).get("holder") if isinstance(dup.info, dict) else None
    say(f"rebuild_index.delay(7) -> {short(dup.id)}: {dup.state}, held by {short(holder)}")
    check(dup.state == "SKIPPED" and holder == first.id, "the duplicate was not skipped")
    say("$ celery -A demo_celery locks list")
    for line in locks_list(env).splitlines():
        say("  " + line)
    say(f"{short(first.id)} -> {first.get(timeout=30)!r}")

    say()
    say("== 2. A deduplicated job: a second .delay() returns the first job's AsyncResult")
    queued = send_report.delay("2026-11-24")
    results.append(queued)
    again = send_report.delay("2026-11-24")
    say(f"send_report.delay('2026-11-24') -> {short(queued.id)}")
    say(f"send_report.delay('2026-11-24') -> {short(again.id)} (the same job: nothing sent)")
    check(again.id == queued.id, "the duplicate publish got a task of its own")
    say(f"{short(again.id)}.get() -> {again.get(timeout=30)!r}")

    say()
    say("== 3. A retry keeps its lock: no duplicate gets in during the countdown")
    sync = sync_account.delay(42)
    results.append(sync)
    wait(lambda: sync_account.lock_holder(42) == sync.id and sync.state == "RETRY")
    say(f"sync_account.delay(42) -> {short(sync.id)}: {sync.state} in 2 s")
    during = sync_account.delay(42)
    results.append(during)
    wait(lambda: during.state == "SKIPPED")
    say(
        f"sync_account.delay(42) -> {short(during.id)}: {during.state}, the lock is still "
        f"{short(sync_account.lock_holder(42))}'s"
    )
    check(during.state == "SKIPPED", "a duplicate ran during the retry's countdown")
    say(f"{short(sync.id)} -> {sync.get(timeout=30)!r}")


def kill_demo(worker: Worker) -> None:
    say()
    say("== 4. The worker is SIGKILLed mid-task: the lock frees itself within one lease (3 s)")
    job = import_feed.delay("prices")
    results.append(job)
    wait(lambda: import_feed.lock_holder("prices") == job.id)
    say(f"import_feed.delay('prices') -> {short(job.id)} (running, lock_ttl=3)")
    time.sleep(4.0)
    still = import_feed.lock_holder("prices") == job.id
    say(f"4 s later, renewed by the worker: held by {short(import_feed.lock_holder('prices'))}")
    check(still, "the running task's lock was not renewed")
    worker.kill()
    killed = time.monotonic()
    say("kill -9 the worker (main process and pool children)")
    freed = wait(lambda: not import_feed.is_locked("prices"), 10)
    took = time.monotonic() - killed
    say(f"lock free {took:.1f} s later: nobody renews it, so its lease ran out")
    check(freed and took <= 4.0, f"the lock was not freed within one lease ({took:.1f} s)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="celery-singleton-lock with a real worker.")
    parser.add_argument("--embedded", action="store_true", help="always start a server of its own")
    args = parser.parse_args(argv)
    run = f"demo-{uuid.uuid4().hex[:8]}"
    with redis_url(args.embedded, LOCAL_REDIS) as url, tempfile.TemporaryDirectory() as tmp:
        os.environ.update(DEMO_URL=url, DEMO_RUN=run)
        app.conf.update(
            broker_url=url,
            result_backend=url,
            task_default_queue=f"{run}-queue",
            singleton_lock_prefix=f"{run}-lock",
        )
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            filter(None, [str(_HERE), str(_ROOT), env.get("PYTHONPATH")])
        )
        client = redis.Redis.from_url(url)
        log = Path(tmp) / "worker.log"
        worker = Worker(env, log)
        say(f"Started a celery worker (prefork, 4 processes): {worker.name}")
        try:
            demo(env)
            kill_demo(worker)
        finally:
            worker.stop()
            for result in results:
                result.forget()
            keys = list(client.scan_iter(f"*{run}*"))
            if keys:
                client.delete(*keys)
            client.close()
    say()
    if problems:
        say(f"Something did not go as described ({len(problems)}): " + "; ".join(problems))
        return 1
    say("Done: every duplicate was skipped or answered with the first job, never run twice.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
