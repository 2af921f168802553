#!/usr/bin/env python
"""A beat-scheduled task that never overlaps itself: due every second, runs for 3 seconds.

    python examples/beat_singleton.py               # $REDIS_URL if it answers, else its own server
    python examples/beat_singleton.py --seconds 20  # run longer (default 12 s)
    python examples/beat_singleton.py --embedded    # always a throw-away server of its own

It starts ``celery beat`` and a ``celery worker`` with three pool processes (so, without the lock,
three runs could overlap) as subprocesses, lets them work for a bounded time, stops both, and
then prints what happened: every run with its start and end, the beat messages the worker skipped
because the previous run still held the lock (with the holder's task id, from the worker's log),
and whether any two runs overlapped. Exits 0, or 1 if anything unexpected happened. On a Redis of
yours it touches only keys and a queue named for this run, and deletes them and its results at
the end.

The module is also the Celery app that beat and the worker import (``celery -A beat_singleton``);
the settings come from environment variables the script sets for them.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import re
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

from celery_singleton_lock import LockedTask

# -- the Celery app: what a project would write -------------------------------------------------

REDIS_URL = os.environ.get("BEAT_EXAMPLE_URL", "redis://127.0.0.1:6379/0")
RUN = os.environ.get("BEAT_EXAMPLE_RUN", "beat-example")

app = Celery("beat_singleton", broker=REDIS_URL, backend=REDIS_URL)
app.conf.update(
    task_default_queue=f"{RUN}-queue",  # a queue of this run only
    singleton_lock_prefix=f"{RUN}-lock",  # lock keys of this run only
    broker_connection_retry_on_startup=True,
    result_expires=600,
    beat_schedule={
        "refresh-every-second": {"task": "beat_singleton.refresh_cache", "schedule": 1.0},
    },
)


@app.task(bind=True, base=LockedTask)  # lock_at="run", lock_on_locked="skip": the defaults
def refresh_cache(self: LockedTask) -> None:
    """Runs for 3 s; beat sends it every second. The lock skips the runs that would overlap."""
    started = time.time()
    time.sleep(3.0)
    record = {"id": self.request.id, "start": started, "end": time.time(), "pid": os.getpid()}
    client = redis.Redis.from_url(REDIS_URL)
    client.rpush(f"{RUN}-runs", json.dumps(record))
    client.expire(f"{RUN}-runs", 600)
    client.close()


# -- the script ----------------------------------------------------------------------------------

SKIP_LINE = re.compile(r"skipped \S+\[(?P<id>[^\]]+)\]: lock \S+ is held by task (?P<holder>\S+)")
SENT_LINE = re.compile(r"Sending due task refresh-every-second")


@contextlib.contextmanager
def process(cmd: list[str], env: dict[str, str], log: Path) -> Iterator[subprocess.Popen[bytes]]:
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, cwd=str(_HERE), env=env, stdout=out, stderr=subprocess.STDOUT)
        try:
            yield proc
        finally:
            proc.terminate()  # warm shutdown: a run in progress finishes
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="A beat task that never overlaps itself.")
    parser.add_argument("--seconds", type=float, default=12.0, help="how long beat runs")
    parser.add_argument("--embedded", action="store_true", help="always start a server of its own")
    args = parser.parse_args(argv)
    run = f"beat-example-{uuid.uuid4().hex[:8]}"
    with redis_url(args.embedded) as url, tempfile.TemporaryDirectory() as tmp:
        global REDIS_URL, RUN
        REDIS_URL, RUN = url, run
        app.conf.update(broker_url=url, result_backend=url, task_default_queue=f"{run}-queue")
        env = dict(os.environ, BEAT_EXAMPLE_URL=url, BEAT_EXAMPLE_RUN=run)
        env["PYTHONPATH"] = os.pathsep.join(
            filter(None, [str(_HERE), str(_ROOT), env.get("PYTHONPATH")])
        )
        name = f"beat-example-{os.getpid()}@127.0.0.1"
        worker_log, beat_log = Path(tmp) / "worker.log", Path(tmp) / "beat.log"
        celery = [sys.executable, "-m", "celery", "-A", "beat_singleton"]
        worker_cmd = [
            *celery, "worker", "-P", "prefork", "-c", "3", "-n", name, "--loglevel", "INFO",
            "--without-gossip", "--without-mingle",
        ]  # fmt: skip
        beat_cmd = [
            *celery, "beat", "--loglevel", "INFO", "--schedule", str(Path(tmp) / "beat-schedule"),
            "--pidfile", str(Path(tmp) / "beat.pid"),
        ]  # fmt: skip
        client = redis.Redis.from_url(url)
        try:
            with process(worker_cmd, env, worker_log) as worker:
                deadline = time.monotonic() + 60
                while not app.control.ping(destination=[name], timeout=0.5):
                    if worker.poll() is not None or time.monotonic() > deadline:
                        say(f"The worker did not start; its log:\n{worker_log.read_text()}")
                        return 1
                say(f"Started a celery worker with 3 pool processes ({name}).")
                with process(beat_cmd, env, beat_log):
                    say(
                        f"Started celery beat: refresh_cache is due every 1 s and runs for 3 s. "
                        f"Letting them work for {args.seconds:.0f} s ..."
                    )
                    time.sleep(args.seconds)
                say("Stopped beat; stopping the worker (it lets the run in progress finish) ...")
            ids = report(
                client, worker_log.read_text(errors="replace"), beat_log.read_text(errors="replace")
            )
            for task_id in ids:
                app.AsyncResult(task_id).forget()
        finally:
            keys = set(client.scan_iter(f"{run}-*")) | set(client.scan_iter(f"*{run}*"))
            if keys:
                client.delete(*keys)
            client.close()
    say()
    if problems:
        say(f"Something did not go as described ({len(problems)}): " + "; ".join(problems))
        return 1
    say("Done: the task never ran twice at once; every overlapping run was skipped and logged.")
    return 0


def report(client: redis.Redis, worker_log: str, beat_log: str) -> list[str]:
    """Print what happened; return the task ids seen (their results are forgotten after)."""
    runs = sorted(
        (json.loads(raw) for raw in client.lrange(f"{RUN}-runs", 0, -1)), key=lambda r: r["start"]
    )
    skips = [m.groupdict() for m in SKIP_LINE.finditer(worker_log)]
    sent = len(SENT_LINE.findall(beat_log))
    say()
    say(
        f"Beat sent refresh_cache {sent} times. {len(runs)} of them ran, {len(skips)} were skipped."
    )
    ids = [r["id"] for r in runs] + [s["id"] for s in skips]
    if not runs:
        check(False, "refresh_cache never ran")
        return ids
    t0 = runs[0]["start"]
    say()
    say("Runs (seconds from the first start):")
    for r in runs:
        start, end = r["start"] - t0, r["end"] - t0
        say(f"  {start:6.2f} -> {end:6.2f}   task {r['id']} (pool process {r['pid']})")
    overlaps = [(a, b) for a, b in itertools.pairwise(runs) if b["start"] < a["end"]]
    say()
    say("Skipped, as the worker logged them (the duplicate's id, then the holder's):")
    holders = {r["id"] for r in runs}
    for s in skips[:8]:
        tag = "" if s["holder"] in holders else " (a run that ended after the log was read)"
        say(f"  skipped {s['id']}: the lock is held by task {s['holder']}{tag}")
    if len(skips) > 8:
        say(f"  ... and {len(skips) - 8} more")
    if skips:
        result = app.AsyncResult(skips[0]["id"])
        say(
            f"  The result backend has them too: AsyncResult({skips[0]['id'][:8]}...).state = "
            f"{result.state!r}, info = {result.info!r}"
        )
        check(result.state == "SKIPPED", f"a skipped run's state is {result.state!r}")
    check(bool(skips), "no run was skipped, yet beat sends every second a task that takes 3 s")
    check(all(s["holder"] in holders for s in skips), "a skip named a holder that never ran")
    say()
    say(f"Overlapping runs: {len(overlaps)}.")
    for a, b in overlaps:
        check(
            False,
            f"task {b['id']} started at {b['start'] - t0:.2f} s, before task {a['id']} "
            f"ended at {a['end'] - t0:.2f} s",
        )
    check(sent >= len(runs) + len(skips) - 1, "the worker saw more messages than beat sent")
    return ids


if __name__ == "__main__":
    sys.exit(main())
