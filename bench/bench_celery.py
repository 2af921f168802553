#!/usr/bin/env python
"""No-op task throughput through a real Celery worker: a plain task, ``LockedTask`` in both
modes, and the two well-known peers, in one run, against a Redis on loopback.

    .venv/bin/python bench/bench_celery.py            # full run: N=3000, 5 rounds, ~5 min
    .venv/bin/python bench/bench_celery.py --quick    # smoke run, ~30 s
    .venv/bin/python bench/bench_celery.py --json     # the results as JSON on stdout
    .venv/bin/python bench/bench_celery.py -n 5000 --rounds 7 --pools solo

What it measures:

* The bench starts its own throw-away ``redis-server`` on a free loopback port
  (:class:`celery_singleton_lock.testing.RedisServer`): the broker is db 0, every lock of every
  contender lives in db 1. No result backend (every task is ``ignore_result``), the same for all.
* For each pool (``solo``, ``prefork -c 2``) it starts ONE ``celery worker`` subprocess with all
  the tasks registered, and measures the contenders interleaved, in an order that rotates every
  round, after a warm-up of each (connections, Lua scripts, every pool process):

  - ``plain``            ``@app.task``
  - ``locked-run``       ``@app.task(base=LockedTask)``                    (lock_at="run")
  - ``locked-publish``   ``@app.task(base=LockedTask, lock_at="publish")``
  - ``locked-limit3``    ``@app.task(base=LockedTask, lock_limit=3)``      (three slots a key:
    the run finds its owner's slot, if any, in one round trip before it takes one)
  - ``locked-rate``      ``@app.task(base=LockedTask, lock_rate="100/s")``  (a rate limit per
    key and nothing else: every call admitted, one EVALSHA of lua/rate_take.lua each)
  - ``celery-once``      ``@app.task(base=QueueOnce)``  (celery_once: lock at publish, DEL after)
  - ``celery-singleton`` ``@app.task(base=Singleton)``  (celery_singleton: same)
  - ``floor-run``        a reference, not a product: a ``Task`` subclass whose ``__call__``
    runs one EVALSHA of a hash-lock acquire script (field = owner, with a lease) before
    ``super().__call__`` and one release EVALSHA after it, through redis-py's registered
    scripts, key = sha1 of the task name and arguments; nothing else (no re-entry, renewal,
    fence, skip state). The run-mode target is a ratio to it.

* One measurement: N tasks with DISTINCT arguments (``task.delay(i)``, ``i`` never used twice in
  the whole run) are published from this process while the worker is told (remote control,
  ``cancel_consumer``) not to consume; then the worker is told to consume (``add_consumer``) and
  drains them. The figure is N / (publish time + drain time), from the first ``delay()`` to the
  end of the last body, without the gap between the two phases. Publishing first keeps worker
  start-up out of the figure (the worker stays up), puts the publish-side lock of the
  publish-time contenders on the clock, and keeps the two phases from competing for the two
  CPUs of a small machine, which made the overlapped variant swing with the scheduler.
* The body is identical for every contender and nearly free, so the figure shows the cost of
  the locking, not of the work: it appends its ``time.perf_counter()`` (8 bytes, ``O_APPEND``)
  to a counter file that this process polls; the end time is the largest stamp written
  (``perf_counter`` is ``CLOCK_MONOTONIC`` on Linux: one clock for every process).
  ``--body-incr`` adds a Redis ``INCR`` to the body (one round trip of real work) for all.
* Reported per contender and pool: the median over the rounds of tasks/s and its ratio to
  ``plain``; the publish and drain rates; CPU microseconds per task of the publisher (this
  process, publish phase), of the worker (its process tree) and of redis-server (INFO cpu);
  and the server time per task from INFO commandstats: the usec of the commands the clients
  send (broker and locks alike), a script's time including the commands it runs, which are
  not added again (which calls ran inside scripts is read by MONITOR during the warm-up).

Targets: ``locked-run`` >= 0.97x the reference (``floor-run``); ``locked-publish`` >= 1.00x the
best of celery-once and celery-singleton.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

_HERE = Path(__file__).resolve().parent
_ROOT = _HERE.parent
if str(_ROOT) not in sys.path:
    sys.path.insert(0, str(_ROOT))

from celery import Celery, Task

from celery_singleton_lock import LockedTask

try:
    from celery_once import QueueOnce
except ImportError:  # pragma: no cover - optional contender
    QueueOnce = None  # type: ignore[assignment,misc]  # the peer is optional: its row is left out
try:
    from celery_singleton import Singleton
except ImportError:  # pragma: no cover - optional contender
    Singleton = None  # type: ignore[assignment,misc]  # the peer is optional: its row is left out

TARGET_RUN_RATIO = 0.97  # x the bare two-EVALSHA hash-lock reference (floor-run)
TARGET_PUBLISH_RATIO = 1.00  # x the best of celery-once and celery-singleton
QUEUE = "bench"
RECORD = struct.Struct("d")

#: contender name -> task name
CONTENDERS = {
    "plain": "bench.plain",
    "locked-run": "bench.locked_run",
    "locked-publish": "bench.locked_publish",
    "locked-limit3": "bench.locked_limit3",
    "locked-rate": "bench.locked_rate",
    "celery-once": "bench.once",
    "celery-singleton": "bench.singleton",
    "floor-run": "bench.floor_run",
}
#: not a product: the least any run-time lock costs here (not part of the targets)
REFERENCE = ("floor-run",)

#: the reference's acquire: a hash lock (field = owner) taken with a lease when free
_TAKE = (
    "if redis.call('exists', KEYS[1]) == 0 then redis.call('hset', KEYS[1], ARGV[1], 1) "
    "redis.call('pexpire', KEYS[1], ARGV[2]) return 1 end return 0"
)
#: the reference's release: by its owner only
_CAD = (
    "if redis.call('hexists', KEYS[1], ARGV[1]) == 1 then return redis.call('del', KEYS[1]) "
    "end return 0"
)


# -- the Celery app (shared by this process, the publisher, and the worker subprocess) ---------


def make_app(broker_url: str, locks_url: str, counter_path: str, body_incr: bool) -> Celery:
    app = Celery("bench_celery", broker=broker_url)
    app.conf.update(
        task_default_queue=QUEUE,
        task_ignore_result=True,
        result_backend=None,
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=True,
        # the lock settings of each contender: all on db 1 of the same server
        singleton_lock_redis_url=locks_url,
        ONCE={
            "backend": "celery_once.backends.Redis",
            "settings": {"url": locks_url, "default_timeout": 60},
        },
        singleton_backend_url=locks_url,
        singleton_lock_expiry=60,
    )

    fd: list[int] = []
    counter_client: list[Any] = []

    def body(i: int) -> None:
        """The work of every contender: one 8-byte append (plus one INCR with --body-incr)."""
        if body_incr:
            if not counter_client:
                import redis

                counter_client.append(redis.Redis.from_url(locks_url))
            counter_client[0].incr("bench:done")
        if not fd or fd[1] != os.getpid():
            fd[:] = [
                os.open(counter_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600),
                os.getpid(),
            ]
        os.write(fd[0], RECORD.pack(time.perf_counter()))

    @app.task(name="bench.plain", ignore_result=True)
    def plain(i: int) -> None:
        body(i)

    @app.task(name="bench.locked_run", base=LockedTask, ignore_result=True)
    def locked_run(i: int) -> None:
        body(i)

    @app.task(name="bench.locked_publish", base=LockedTask, lock_at="publish", ignore_result=True)
    def locked_publish(i: int) -> None:
        body(i)

    @app.task(name="bench.locked_limit3", base=LockedTask, lock_limit=3, ignore_result=True)
    def locked_limit3(i: int) -> None:
        body(i)

    @app.task(name="bench.locked_rate", base=LockedTask, lock_rate="100/s", ignore_result=True)
    def locked_rate(i: int) -> None:
        body(i)

    floor_client: list[Any] = []

    class FloorRunTask(Task):  # type: ignore[misc]  # celery ships no type information
        """The reference: one EVALSHA of a hash-lock acquire before ``super().__call__`` and one
        release EVALSHA after it, through redis-py's registered scripts (the client made once
        per process), key = sha1 of the task name and arguments; nothing else."""

        def __call__(self, *args: Any, **kwargs: Any) -> Any:
            if not floor_client:
                import redis

                client = redis.Redis.from_url(locks_url)
                floor_client[:] = [client.register_script(_TAKE), client.register_script(_CAD)]
            take, cad = floor_client
            text = json.dumps([self.name, args, kwargs], sort_keys=True)
            key = "floor:{" + hashlib.sha1(text.encode()).hexdigest() + "}"
            token = self.request.id
            if not take(keys=[key], args=[token, 30_000]):
                return None  # a duplicate: skipped
            try:
                return super().__call__(*args, **kwargs)
            finally:
                cad(keys=[key], args=[token])

    @app.task(name="bench.floor_run", base=FloorRunTask, ignore_result=True)
    def floor_run(i: int) -> None:
        body(i)

    if QueueOnce is not None:

        @app.task(name="bench.once", base=QueueOnce, ignore_result=True)
        def once(i: int) -> None:
            body(i)

    if Singleton is not None:

        @app.task(name="bench.singleton", base=Singleton, ignore_result=True)
        def singleton(i: int) -> None:
            body(i)

    return app


if os.environ.get("BENCH_CELERY_WORKER") == "1":
    # Imported by the `celery -A bench_celery:app worker` subprocess.
    from celery import signals

    app = make_app(
        os.environ["BENCH_BROKER_URL"],
        os.environ["BENCH_LOCKS_URL"],
        os.environ["BENCH_COUNTER"],
        os.environ.get("BENCH_BODY_INCR") == "1",
    )

    @signals.worker_ready.connect
    def _ready(**_: Any) -> None:
        Path(os.environ["BENCH_READY"]).write_text(str(os.getpid()))


# -- the driver --------------------------------------------------------------------------------


def say(text: str, *, quiet: bool) -> None:
    if not quiet:
        print(text, file=sys.stderr, flush=True)


class Counter:
    """The file every task body appends its end time to."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.path.write_bytes(b"")

    def reset(self) -> None:
        os.truncate(self.path, 0)

    def count(self) -> int:
        return os.stat(self.path).st_size // RECORD.size

    def last(self) -> float:
        data = self.path.read_bytes()
        usable = len(data) - len(data) % RECORD.size
        return max(t for (t,) in RECORD.iter_unpack(data[:usable]))

    def wait_for(self, n: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while self.count() < n:
            if time.monotonic() > deadline:
                raise RuntimeError(f"only {self.count()} of {n} tasks finished in {timeout} s")
            time.sleep(0.004)


class Worker:
    def __init__(
        self, pool: str, concurrency: int, env: dict[str, str], workdir: Path, ready: Path
    ) -> None:
        self.pool = pool
        self.name = f"bench-{pool}-{os.getpid()}@127.0.0.1"
        self.ready = ready
        if ready.exists():
            ready.unlink()
        cmd = [
            sys.executable, "-m", "celery", "-A", "bench_celery:app", "worker",
            "-P", pool, "-Q", QUEUE, "-n", self.name, "--loglevel", "WARNING",
            "--without-gossip", "--without-mingle", "--without-heartbeat",
        ]  # fmt: skip
        if pool != "solo":
            cmd += ["-c", str(concurrency)]
        self.log = open(workdir / f"worker-{pool}.log", "wb")  # noqa: SIM115  # closed in stop()
        self.proc = subprocess.Popen(
            cmd, cwd=str(_HERE), env=env, stdout=self.log, stderr=subprocess.STDOUT
        )

    def wait_ready(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while not self.ready.exists():
            if self.proc.poll() is not None:
                raise RuntimeError(f"the {self.pool} worker exited at start; see {self.log.name}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"the {self.pool} worker was not ready in {timeout} s")
            time.sleep(0.05)

    def consume(self, app: Celery, on: bool) -> None:
        """Start or stop consuming the bench queue (remote control, answered by the worker)."""
        control = app.control.add_consumer if on else app.control.cancel_consumer
        replies = control(QUEUE, destination=[self.name], reply=True, timeout=10.0)
        if not replies:
            raise RuntimeError(f"the {self.pool} worker did not answer {control.__name__}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()  # warm shutdown
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.log.close()


def tree_cpu(pid: int) -> float:
    """CPU seconds (user + system) used so far by a process and its live descendants."""
    tick = os.sysconf("SC_CLK_TCK")
    parents: dict[int, int] = {}
    times: dict[int, float] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rpartition(")")[2].split()
        except OSError:
            continue
        parents[int(entry)] = int(fields[1])
        times[int(entry)] = (int(fields[11]) + int(fields[12])) / tick
    total, todo = 0.0, [pid]
    while todo:
        current = todo.pop()
        total += times.get(current, 0.0)
        todo += [child for child, parent in parents.items() if parent == current]
    return total


def server_cpu(client: Any) -> float:
    info = client.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def commandstats(client: Any) -> dict[str, tuple[int, int]]:
    """{command: (calls, usec)} from INFO commandstats."""
    return {
        key[len("cmdstat_") :]: (int(value["calls"]), int(value["usec"]))
        for key, value in client.info("commandstats").items()
    }


#: commands whose usec include the commands they run (counted in full)
SCRIPT_COMMANDS = frozenset(("evalsha", "eval", "evalsha_ro", "eval_ro", "fcall", "fcall_ro"))
#: a transaction's EXEC times the commands it runs, which are counted on their own: left out
TRANSACTION_COMMANDS = frozenset(("exec", "multi"))
_MONITOR_MARK = "bench-celery-monitor-end"


def lua_shares(client: Any, run: Any) -> dict[str, float]:
    """Run ``run()`` under MONITOR: for each command, the share of its calls that a Lua
    script made (MONITOR tags them ``[db lua]``)."""
    seen: dict[str, int] = {}
    in_lua: dict[str, int] = {}
    watcher = client.monitor()
    monitor = watcher.__enter__()  # MONITOR sent, its OK read

    def read() -> None:
        while True:
            raw = monitor.connection.read_response()
            line = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)
            # '1732500000.123456 [1 lua] "hset" "key" ...' or '... [1 127.0.0.1:5555] "get" ...'
            where_end = line.find("]")
            if where_end < 0:
                continue
            where = line[line.find("[") + 1 : where_end]
            name = line[where_end + 1 :].split('"', 2)[1].lower()
            if name == "echo" and _MONITOR_MARK in line:
                return
            seen[name] = seen.get(name, 0) + 1
            if where.endswith(" lua"):
                in_lua[name] = in_lua.get(name, 0) + 1

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        run()
    finally:
        client.echo(_MONITOR_MARK)
        reader.join(60)
        watcher.__exit__(None, None, None)
    return {name: in_lua.get(name, 0) / calls for name, calls in seen.items()}


def server_us(
    before: dict[str, tuple[int, int]], after: dict[str, tuple[int, int]], shares: dict[str, float]
) -> float:
    """usec the server spent on the commands clients sent, between two INFO commandstats."""
    total = 0.0
    for name, (_, usec) in after.items():
        spent = usec - before.get(name, (0, 0))[1]
        if not spent or name in TRANSACTION_COMMANDS or name in ("info", "monitor", "echo"):
            continue
        total += spent if name in SCRIPT_COMMANDS else spent * (1.0 - shares.get(name, 0.0))
    return total


class Bench:
    def __init__(self, args: argparse.Namespace, redis_client: Any = None) -> None:
        self.args = args
        self.redis = redis_client
        self.quiet = args.json
        self.next_arg = 0
        #: contender -> the share of each command's calls made inside scripts (its warm-up)
        self.shares: dict[str, dict[str, float]] = {}

    def fresh_args(self, n: int) -> range:
        start = self.next_arg
        self.next_arg += n
        return range(start, start + n)

    def measure(
        self,
        app: Celery,
        counter: Counter,
        worker: Worker,
        task_name: str,
        n: int,
        shares: dict[str, float] | None = None,
    ) -> dict[str, float]:
        """Publish ``n`` tasks while the worker does not consume, then let it drain them."""
        task = app.tasks[task_name]
        counter.reset()
        values = self.fresh_args(n)
        stats = commandstats(self.redis)
        worker_cpu, redis_cpu = tree_cpu(worker.proc.pid), server_cpu(self.redis)
        c0 = time.process_time()
        t0 = time.perf_counter()
        for i in values:
            task.delay(i)
        t1 = time.perf_counter()
        publisher_cpu = time.process_time() - c0
        worker.consume(app, True)
        counter.wait_for(n, timeout=max(120.0, n / 20))
        t_end = counter.last()
        worker.consume(app, False)
        worker_cpu = tree_cpu(worker.proc.pid) - worker_cpu
        redis_cpu = server_cpu(self.redis) - redis_cpu
        server = server_us(stats, commandstats(self.redis), shares or {})
        if counter.count() != n:
            raise RuntimeError(f"{task_name}: {counter.count()} bodies ran for {n} tasks")
        publish, drain = t1 - t0, t_end - t1
        return {
            "seconds": publish + drain,
            "rate": n / (publish + drain),
            "publish_rate": n / publish,
            "drain_rate": n / drain,
            "publisher_cpu_us": publisher_cpu / n * 1e6,
            "worker_cpu_us": worker_cpu / n * 1e6,
            "redis_cpu_us": redis_cpu / n * 1e6,
            "server_us": server / n,
        }

    def run_pool(
        self,
        pool: str,
        concurrency: int,
        app: Celery,
        counter: Counter,
        env: dict[str, str],
        workdir: Path,
        contenders: list[str],
    ) -> dict[str, list[dict[str, float]]]:
        label = pool if pool == "solo" else f"{pool} -c {concurrency}"
        say(f"== pool {label}: starting the worker", quiet=self.quiet)
        worker = Worker(pool, concurrency, env, workdir, workdir / f"ready-{pool}")
        results: dict[str, list[dict[str, float]]] = {c: [] for c in contenders}
        try:
            worker.wait_ready()
            worker.consume(app, False)
            for name in contenders:  # warm-up: connections, Lua scripts, every pool child
                self.measure(app, counter, worker, CONTENDERS[name], self.args.warmup)
                # then, untimed, which of its calls run inside scripts (for server_us)
                self.shares[name] = lua_shares(
                    self.redis,
                    lambda name=name: self.measure(
                        app, counter, worker, CONTENDERS[name], self.args.warmup
                    ),
                )
            for r in range(self.args.rounds):
                order = contenders[r % len(contenders) :] + contenders[: r % len(contenders)]
                line = []
                for name in order:
                    m = self.measure(
                        app, counter, worker, CONTENDERS[name], self.args.n, self.shares[name]
                    )
                    results[name].append(m)
                    line.append(f"{name} {m['rate']:.0f}/s")
                    time.sleep(self.args.pause)
                say(f"   round {r + 1}/{self.args.rounds}: " + ", ".join(line), quiet=self.quiet)
        finally:
            worker.stop()
        return results


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("-n", type=int, default=None, help="tasks per measurement (default 3000)")
    p.add_argument("--rounds", type=int, default=None, help="rounds per pool (default 5)")
    p.add_argument("--warmup", type=int, default=None, help="warm-up tasks per contender")
    p.add_argument("--pools", default="solo,prefork", help="comma-separated: solo,prefork")
    p.add_argument("--concurrency", type=int, default=2, help="prefork children (default 2)")
    p.add_argument("--pause", type=float, default=0.2, help="seconds between measurements")
    p.add_argument("--body-incr", action="store_true", help="the body also does a Redis INCR")
    p.add_argument("--quick", action="store_true", help="a smoke run of about 30 s")
    p.add_argument("--json", action="store_true", help="print the results as JSON on stdout")
    args = p.parse_args(argv)
    if args.quick:
        args.n = args.n or 500
        args.rounds = args.rounds or 2
        args.warmup = args.warmup or 100
    args.n = args.n or 3000
    args.rounds = args.rounds or 5
    args.warmup = args.warmup or 300
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from celery_singleton_lock.testing import RedisServer

    contenders = [
        c
        for c in CONTENDERS
        if not (c == "celery-once" and QueueOnce is None)
        and not (c == "celery-singleton" and Singleton is None)
    ]
    pools = [p.strip() for p in args.pools.split(",") if p.strip()]
    workdir = Path(tempfile.mkdtemp(prefix="csl-bench-celery-"))
    counter = Counter(workdir / "done.bin")
    started = time.monotonic()
    results: dict[str, dict[str, list[dict[str, float]]]] = {}
    with RedisServer() as server:
        bench = Bench(args, server.client())
        broker = f"redis://127.0.0.1:{server.port}/0"
        locks = f"redis://127.0.0.1:{server.port}/1"
        app = make_app(broker, locks, str(counter.path), args.body_incr)
        env = dict(os.environ)
        env.update(
            BENCH_CELERY_WORKER="1",
            BENCH_BROKER_URL=broker,
            BENCH_LOCKS_URL=locks,
            BENCH_COUNTER=str(counter.path),
            BENCH_BODY_INCR="1" if args.body_incr else "0",
            PYTHONPATH=os.pathsep.join(
                [str(_HERE), str(_ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]
            ),
        )
        say(
            f"redis-server on 127.0.0.1:{server.port} (broker db 0, locks db 1); N={args.n}, "
            f"{args.rounds} rounds, body={'append+INCR' if args.body_incr else 'append'}",
            quiet=bench.quiet,
        )
        for pool in pools:
            env["BENCH_READY"] = str(workdir / f"ready-{pool}")
            results[pool] = bench.run_pool(
                pool, args.concurrency, app, counter, env, workdir, contenders
            )
        server_version = server.client().info("server").get("redis_version", "?")
    shutil.rmtree(workdir, ignore_errors=True)  # kept (with the worker logs) when a run fails
    report = summarize(results, args, contenders, server_version, time.monotonic() - started)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print_table(report)
    return 0


def summarize(
    results: dict[str, dict[str, list[dict[str, float]]]],
    args: argparse.Namespace,
    contenders: list[str],
    server_version: str,
    wall: float,
) -> dict[str, Any]:
    import celery

    import celery_singleton_lock

    pools: dict[str, Any] = {}
    for pool, per in results.items():
        plain = statistics.median(m["rate"] for m in per["plain"])
        rows = {}
        for name in contenders:
            rates = [m["rate"] for m in per[name]]
            med = statistics.median(rates)
            rows[name] = {
                "tasks_per_s": round(med, 1),
                "ratio_to_plain": round(med / plain, 3),
                # INFO commandstats usec per task of the commands the clients sent (scripts
                # with the commands they run), median of the rounds
                "server_us_per_task": round(
                    statistics.median(m["server_us"] for m in per[name]), 2
                ),
                "rounds": [round(x, 1) for x in rates],
                "publish_rate": round(statistics.median(m["publish_rate"] for m in per[name]), 1),
                "drain_rate": round(statistics.median(m["drain_rate"] for m in per[name]), 1),
                "cpu_us_per_task": {
                    who: round(statistics.median(m[f"{who}_cpu_us"] for m in per[name]), 1)
                    for who in ("publisher", "worker", "redis")
                },
            }
        reference = rows["floor-run"]["tasks_per_s"]
        for row in rows.values():
            row["ratio_to_reference"] = round(row["tasks_per_s"] / reference, 3)
        run_ok = rows["locked-run"]["ratio_to_reference"] >= TARGET_RUN_RATIO
        peers = [rows[c]["tasks_per_s"] for c in ("celery-once", "celery-singleton") if c in rows]
        best_peer = max(peers, default=0.0)
        if best_peer:
            rows["locked-publish"]["ratio_to_best_peer"] = round(
                rows["locked-publish"]["tasks_per_s"] / best_peer, 3
            )
        pub_ok = rows["locked-publish"]["tasks_per_s"] >= TARGET_PUBLISH_RATIO * best_peer
        pools[pool if pool == "solo" else f"{pool} -c {args.concurrency}"] = {
            "contenders": rows,
            "targets": {
                f"locked-run >= {TARGET_RUN_RATIO:.2f}x the two-EVALSHA reference": run_ok,
                f"locked-publish >= {TARGET_PUBLISH_RATIO:.2f}x the best peer": pub_ok,
            },
        }
    return {
        "n": args.n,
        "rounds": args.rounds,
        "body": "append+INCR" if args.body_incr else "append",
        "wall_seconds": round(wall, 1),
        "machine": {
            "python": platform.python_version(),
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "celery": celery.__version__,
            "celery_singleton_lock": celery_singleton_lock.__version__,
            "redis_server": server_version,
        },
        "pools": pools,
    }


def print_table(report: dict[str, Any]) -> None:
    m = report["machine"]
    print(
        f"No-op task throughput through a real worker, end to end: publish N (worker not "
        f"consuming), then drain; N={report['n']} distinct arguments, median of "
        f"{report['rounds']} interleaved rounds, body: {report['body']}"
    )
    print(
        f"Python {m['python']}, Celery {m['celery']}, Redis {m['redis_server']} on loopback, "
        f"{m['cpus']} CPUs, {m['platform']}"
    )
    for pool, data in report["pools"].items():
        print()
        print(f"pool {pool}")
        print(
            f"  {'contender':<17} {'tasks/s':>7} {'srv us':>6} {'x plain':>7} {'x ref':>6} "
            f"{'publish/s':>9} {'drain/s':>7}"
            f"   {'CPU us/task: publisher':>22} {'worker':>6} {'redis':>5}   rounds (tasks/s)"
        )
        for name, row in data["contenders"].items():
            rounds = " ".join(f"{x:.0f}" for x in row["rounds"])
            cpu = row["cpu_us_per_task"]
            print(
                f"  {name:<17} {row['tasks_per_s']:>7.0f} {row['server_us_per_task']:>6.1f} "
                f"{row['ratio_to_plain']:>6.2f}x "
                f"{row['ratio_to_reference']:>5.2f}x "
                f"{row['publish_rate']:>9.0f} {row['drain_rate']:>7.0f}   "
                f"{cpu['publisher']:>22.0f} {cpu['worker']:>6.0f} {cpu['redis']:>5.0f}   {rounds}"
            )
        for target, ok in data["targets"].items():
            print(f"  target {target}: {'PASS' if ok else 'MISS'}")
    print(
        "\n(srv us = server time per task, INFO commandstats usec of the commands the clients "
        "sent, broker and locks: a script's include the commands it runs, a transaction's are "
        "counted as its commands)"
    )
    print(f"(wall time {report['wall_seconds']:.0f} s)")


if __name__ == "__main__":
    sys.exit(main())
