#!/usr/bin/env python
"""The per-task path of a locked task, timed and profiled in one process, without a broker's
worker in between: what this package adds to a run and to a publish.

    .venv/bin/python bench/profile_tasks.py              # µs per task, each contender
    .venv/bin/python bench/profile_tasks.py --profile run      # + cProfile's top entries
    .venv/bin/python bench/profile_tasks.py --profile publish

A run is Celery's own tracer (``celery.app.trace.build_tracer``: what a worker's pool process
calls for each message, result storing and signals included) called in a loop, against a real
``redis-server`` on loopback started here; a publish is ``apply_async`` to a Redis broker. The
contenders: a plain task, the reference of bench/bench_celery.py (a ``Task`` whose ``__call__``
runs one EVALSHA of a hash-lock acquire before ``super().__call__`` and one release EVALSHA
after, through redis-py's registered scripts, key = sha1 of the task name and arguments), and
``LockedTask`` in run and publish mode. Interleaved rounds, the median reported.
"""

from __future__ import annotations

import argparse
import cProfile
import hashlib
import json
import pstats
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

_ROOT = Path(__file__).resolve().parent.parent
if str(_ROOT) not in sys.path:
    sys.path.insert(0, str(_ROOT))

import redis
from celery import Celery, Task
from celery.app.trace import build_tracer

from celery_singleton_lock import LockedTask
from celery_singleton_lock.testing import RedisServer

#: the reference's two scripts: a hash lock taken (field = owner) with a lease, and released
#: by its owner
TAKE = (
    "if redis.call('exists', KEYS[1]) == 0 then redis.call('hset', KEYS[1], ARGV[1], 1) "
    "redis.call('pexpire', KEYS[1], ARGV[2]) return 1 end return 0"
)
RELEASE = (
    "if redis.call('hexists', KEYS[1], ARGV[1]) == 1 then return redis.call('del', KEYS[1]) "
    "end return 0"
)


def make_app(url: str) -> tuple[Celery, dict[str, Any]]:
    app = Celery("profile_tasks", broker=url + "/0")
    app.conf.update(
        task_ignore_result=True, result_backend=None, singleton_lock_redis_url=url + "/1"
    )
    client = redis.Redis.from_url(url + "/1")
    take, release = client.register_script(TAKE), client.register_script(RELEASE)

    class Reference(Task):  # type: ignore[misc]  # celery ships no type information
        def __call__(self, *args: Any, **kwargs: Any) -> Any:
            text = json.dumps([self.name, args, kwargs], sort_keys=True)
            key = "ref:{" + hashlib.sha1(text.encode()).hexdigest() + "}"
            if not take(keys=[key], args=[self.request.id, 30_000]):
                return None
            try:
                return super().__call__(*args, **kwargs)
            finally:
                release(keys=[key], args=[self.request.id])

    def body(i: int) -> None:
        return None

    tasks = {
        "plain": app.task(name="p.plain")(body),
        "reference": app.task(name="p.reference", base=Reference)(body),
        "run": app.task(name="p.run", base=LockedTask)(body),
        "publish": app.task(name="p.publish", base=LockedTask, lock_at="publish")(body),
    }
    app.finalize()
    return app, tasks


_numbers = iter(range(10**12))


def run_tasks(app: Celery, task: Any, n: int) -> float:
    """µs per task of ``n`` runs through Celery's tracer (distinct arguments)."""
    tracer = build_tracer(task.name, task, app=app, eager=False, propagate=False)
    started = time.perf_counter()
    for _ in range(n):
        task_id = str(uuid.uuid4())
        tracer(task_id, (next(_numbers),), {}, {"id": task_id, "delivery_info": {}})
    return (time.perf_counter() - started) / n * 1e6


def publish_tasks(task: Any, n: int) -> float:
    """µs per ``apply_async`` of ``n`` publishes (distinct arguments)."""
    started = time.perf_counter()
    for _ in range(n):
        task.apply_async((next(_numbers),))
    return (time.perf_counter() - started) / n * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", type=int, default=2000, help="tasks per round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--profile", choices=["run", "publish", "publish-run"], default=None)
    parser.add_argument("--top", type=int, default=25, help="cProfile entries shown")
    parser.add_argument("--sort", default="tottime", help="cProfile's sort key (cumtime, ...)")
    parser.add_argument("--match", default="", help="only the entries whose file matches")
    opts = parser.parse_args()
    with RedisServer() as server:
        app, tasks = make_app(f"redis://127.0.0.1:{server.port}")
        runs = {name: tasks[name] for name in ("plain", "reference", "run", "publish")}
        publishes = {name: tasks[name] for name in ("plain", "publish")}
        for task in runs.values():
            run_tasks(app, task, 200)  # warm: connections, scripts
        for task in publishes.values():
            publish_tasks(task, 200)
        timing: dict[str, list[float]] = {}
        for _ in range(opts.rounds):
            for name, task in runs.items():
                timing.setdefault(f"run {name}", []).append(run_tasks(app, task, opts.n))
            for name, task in publishes.items():
                timing.setdefault(f"publish {name}", []).append(publish_tasks(task, opts.n))
        print(f"{'path':24s} {'µs/task':>9s}  (median of {opts.rounds} rounds of {opts.n})")
        for name, values in timing.items():
            print(f"{name:24s} {statistics.median(values):9.1f}")
        ref = statistics.median(timing["run reference"])
        for name in ("run run", "run publish"):
            extra = statistics.median(timing[name]) - ref
            print(f"{name} - reference: {extra:+.1f} µs")
        if opts.profile:
            profiler = cProfile.Profile()
            profiler.enable()
            if opts.profile in ("run", "publish-run"):
                run_tasks(app, tasks[opts.profile.partition("-")[0]], opts.n)
            else:
                publish_tasks(tasks["publish"], opts.n)
            profiler.disable()
            stats = pstats.Stats(profiler)
            stats.sort_stats(opts.sort).print_stats(opts.match, opts.top)


if __name__ == "__main__":
    main()
