#!/usr/bin/env python
"""Deduplicated jobs with ``LockedTask(lock_at="publish")``: a second ``.delay()`` of a job that is
still queued or running does not send a second message; it returns the first one's AsyncResult.
With ``lock_on_duplicate="raise"`` it raises ``AlreadyQueuedError`` (holder's task id and lease
left) instead.

    python examples/dedup_jobs.py               # $REDIS_URL if it answers, else its own server
    REDIS_URL=redis://127.0.0.1:6379/0 python examples/dedup_jobs.py
    python examples/dedup_jobs.py --embedded    # always a throw-away server of its own

It starts a real ``celery worker`` (a subprocess, prefork pool), publishes, waits for the results,
prints what happened in plain words, stops the worker and exits 0 (1 if anything unexpected
happened). On a Redis of yours it touches only keys and a queue named for this run, and deletes
them and its results at the end; nothing is flushed.

The module is also the Celery app the worker imports (``celery -A dedup_jobs worker``); the
settings come from environment variables the script sets for its worker.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

_HERE = Path(__file__).resolve().parent
_ROOT = _HERE.parent
if (_ROOT / "celery_singleton_lock").is_dir() and str(_ROOT) not in sys.path:
    sys.path.insert(0, str(_ROOT))  # run from a checkout without installing

import redis
from _support import check, problems, redis_url, say
from celery import Celery

from celery_singleton_lock import AlreadyQueuedError, LockedTask

# -- the Celery app: what a project would write -------------------------------------------------

REDIS_URL = os.environ.get("DEDUP_EXAMPLE_URL", "redis://127.0.0.1:6379/0")
RUN = os.environ.get("DEDUP_EXAMPLE_RUN", "dedup-example")

app = Celery("dedup_jobs", broker=REDIS_URL, backend=REDIS_URL)
app.conf.update(
    task_default_queue=f"{RUN}-queue",  # a queue of this run only
    singleton_lock_prefix=f"{RUN}-lock",  # lock keys of this run only
    broker_connection_retry_on_startup=True,
    result_expires=600,
)


def _count_run(job: str) -> None:
    """Count the runs of each job in Redis, so the script can show how often a body ran."""
    client = redis.Redis.from_url(REDIS_URL)
    client.incr(f"{RUN}-runs:{job}")
    client.expire(f"{RUN}-runs:{job}", 600)
    client.close()


@app.task(base=LockedTask, lock_at="publish")
def send_digest(user_id: int, day: str) -> str:
    """A slow job that must not be queued twice: a duplicate .delay() gets the first's result."""
    _count_run(f"send_digest:{user_id}:{day}")
    time.sleep(2.0)
    return f"digest for user {user_id} on {day} sent"


@app.task(base=LockedTask, lock_at="publish", lock_on_duplicate="raise")
def charge_invoice(invoice_id: int) -> str:
    """A job where the caller wants to know about the duplicate: AlreadyQueuedError."""
    _count_run(f"charge_invoice:{invoice_id}")
    time.sleep(1.0)
    return f"invoice {invoice_id} charged"


# -- the script ----------------------------------------------------------------------------------

results: list[object] = []  # every AsyncResult seen, to forget() at the end


@contextlib.contextmanager
def worker(env: dict[str, str], log: Path) -> Iterator[str]:
    name = f"dedup-{os.getpid()}@127.0.0.1"
    cmd = [
        sys.executable, "-m", "celery", "-A", "dedup_jobs", "worker", "-P", "prefork", "-c", "2",
        "-n", name, "--loglevel", "INFO", "--without-gossip", "--without-mingle",
    ]  # fmt: skip
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, cwd=str(_HERE), env=env, stdout=out, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 60
            while not app.control.ping(destination=[name], timeout=0.5):
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(f"the worker did not start; its log:\n{log.read_text()}")
            say(f"Started a celery worker (prefork, 2 processes): {name}")
            yield name
        finally:
            proc.terminate()  # warm shutdown
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def runs(client: redis.Redis, job: str) -> int:
    return int(client.get(f"{RUN}-runs:{job}") or 0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Deduplicated jobs with celery-singleton-lock.")
    parser.add_argument("--embedded", action="store_true", help="always start a server of its own")
    args = parser.parse_args(argv)
    run = f"dedup-example-{uuid.uuid4().hex[:8]}"
    with redis_url(args.embedded) as url, tempfile.TemporaryDirectory() as tmp:
        os.environ.update(DEDUP_EXAMPLE_URL=url, DEDUP_EXAMPLE_RUN=run)
        # This process is the publisher: point the app at the same Redis and names as the worker.
        global REDIS_URL, RUN
        REDIS_URL, RUN = url, run
        app.conf.update(
            broker_url=url,
            result_backend=url,
            task_default_queue=f"{run}-queue",
            singleton_lock_prefix=f"{run}-lock",
        )
        client = redis.Redis.from_url(url)
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            filter(None, [str(_HERE), str(_ROOT), env.get("PYTHONPATH")])
        )
        log = Path(tmp) / "worker.log"
        try:
            with worker(env, log):
                demo(client)
        finally:
            for result in results:
                result.forget()  # type: ignore[attr-defined]  # AsyncResult | EagerResult: both have it
            keys = list(client.scan_iter(f"{run}-*")) + list(client.scan_iter(f"*{run}*"))
            if keys:
                client.delete(*set(keys))
            client.close()
    say()
    if problems:
        say(f"Something did not go as described ({len(problems)}): " + "; ".join(problems))
        return 1
    say("Done: every duplicate was answered with the first job's result or an error, never run.")
    return 0


def demo(client: redis.Redis) -> None:
    day = "2024-06-01"
    say()
    say("== 1. lock_at='publish': a duplicate .delay() returns the first one's AsyncResult")
    first = send_digest.delay(42, day)
    say(f"send_digest.delay(42, {day!r})           -> task {first.id}")
    second = send_digest.delay(42, day)
    say(f"send_digest.delay(42, {day!r}) again     -> task {second.id}")
    check(second.id == first.id, "the duplicate got a task id of its own")
    say("   The same task id: no second message was sent, the caller got the first job's result.")
    third = send_digest.delay(user_id=42, day=day)
    check(third.id == first.id, "keyword arguments made another job")
    say(f"send_digest.delay(user_id=42, day=...)    -> task {third.id} (same job: same arguments)")
    other = send_digest.delay(7, day)
    results.extend([first, other])
    check(other.id != first.id, "another user's job was deduplicated")
    say(f"send_digest.delay(7, {day!r})            -> task {other.id} (another job: runs too)")
    say(
        f"While it runs, send_digest.is_locked(42, day) = {send_digest.is_locked(42, day)}, "
        f"held by task {send_digest.lock_holder(42, day)}"
    )

    say(f"Waiting for the results: {second.get(timeout=60)!r} / {other.get(timeout=60)!r}")
    job = f"send_digest:42:{day}"
    count = runs(client, job)
    check(count == 1, f"send_digest(42) ran {count} times, not once")
    say(f"The body of send_digest(42, {day!r}) ran {count} time(s) for 3 calls.")
    locked = send_digest.is_locked(42, day)
    check(not locked, "the lock was still held after the result was stored")
    say(f"After the result: is_locked = {locked} (released before the result was stored).")
    again = send_digest.delay(42, day)
    results.append(again)
    check(again.id != first.id, "a publish after the result was deduplicated onto the old job")
    say(f"send_digest.delay(42, {day!r}) now        -> task {again.id}: a new job, as it should be")
    again.get(timeout=60)
    say(f"   ... which ran too: send_digest(42) has now run {runs(client, job)} time(s).")

    say()
    say("== 2. lock_on_duplicate='raise': the duplicate raises AlreadyQueuedError")
    held = charge_invoice.delay(1001)
    results.append(held)
    say(f"charge_invoice.delay(1001)                -> task {held.id}")
    try:
        charge_invoice.delay(1001)
    except AlreadyQueuedError as exc:
        check(exc.task_id == held.id, "AlreadyQueuedError named another holder")
        say(
            f"charge_invoice.delay(1001) again          -> AlreadyQueuedError: held by task "
            f"{exc.task_id} (queued or running), {exc.ttl:.0f} s left on its lease"
        )
    else:
        check(False, "the duplicate charge_invoice.delay() did not raise AlreadyQueuedError")
    say(
        f"Waiting: {held.get(timeout=60)!r}; the body ran "
        f"{runs(client, 'charge_invoice:1001')} time(s)."
    )
    check(runs(client, "charge_invoice:1001") == 1, "charge_invoice(1001) did not run exactly once")


if __name__ == "__main__":
    sys.exit(main())
