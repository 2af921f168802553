#!/usr/bin/env python
"""Client instructions per job, publish + run, counted by callgrind: every contender of
``bench_celery.py`` in a form that reads within about 1 % between runs, where wall-clock
ratios on a shared machine move by a quarter.

    .venv/bin/python bench/instructions.py           # the table, about 3 min on 2 idle CPUs
    .venv/bin/python bench/instructions.py --quick   # a smoke run, about 1.5 min
    .venv/bin/python bench/instructions.py --out docs/bench   # + instructions.md and .json
    .venv/bin/python bench/instructions.py --keep /tmp/cg     # keep callgrind's files

One measurement is one process run under ``valgrind --tool=callgrind --instr-atstart=no``: it
builds ``bench_celery.py``'s app (the same task classes: plain, the two-EVALSHA reference,
celery-once, celery-singleton, ``LockedTask`` in each mode) against a Redis broker, warms the
contender's path up (connections, scripts, the first call's imports), then publishes N calls
with distinct arguments and runs the same N jobs through Celery's own tracer
(``celery.app.trace.build_tracer``, what a pool process calls for a message), each with the
request a worker makes of the message its publish sent (the headers, read back from the
broker). Instrumentation is on around the publishes and around the runs only (the process
turns it on and off with ``callgrind_control -i``), so the imports, the warm-up and the reading
back of the messages are not counted; the instructions of every thread are (a lock's renewal
thread is client CPU too).

What is left in a count besides N jobs (the toggles, the first instrumented call's cold
paths) is the same for any N: the figure is the slope between two job counts,
(I(N2) - I(N1)) / (N2 - N1). Each contender is measured at two pairs of counts (four
processes); the two slopes are printed side by side, their spread is the noise. Every process
runs with ``PYTHONHASHSEED=0``. A private ``redis-server`` on a free loopback port serves all
of them (each process its own queue and arguments).

Targets (what the table's last lines check): ``lock_at="publish"`` <= 1.00x the lower of
celery-once and celery-singleton; ``lock_at="run"`` <= 1.03x the reference.
"""

from __future__ import annotations

import argparse
import gc
import itertools
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

_HERE = Path(__file__).resolve().parent
_ROOT = _HERE.parent

#: contender -> its row's label (bench_celery.py's contender names)
KINDS = {
    "plain": "plain task",
    "celery-singleton": "celery-singleton `Singleton`",
    "celery-once": "celery-once `QueueOnce`",
    "floor-run": "reference: plain publish, two bare EVALSHAs (hash-lock acquire, release) "
    "around the run",
    "locked-run": 'ours, `lock_at="run"`',
    "locked-publish": 'ours, `lock_at="publish"`',
}
PEERS = ("celery-once", "celery-singleton")
TARGET_PUBLISH, TARGET_RUN = 1.00, 1.03
#: the job counts: (N1, N2) of the check slope, (N1, N2) of the figure
PAIRS = ((20, 80), (50, 250))
QUICK_PAIRS = ((10, 30), (20, 60))
#: jobs published and run before instrumentation starts
WARMUP = 30


# -- inside callgrind: one measurement ---------------------------------------------------------


def _callgrind(*command: str) -> None:
    """Send callgrind a command about this process (it returns once valgrind has done it)."""
    subprocess.run(
        ["callgrind_control", *command, str(os.getpid())], check=True, stdout=subprocess.DEVNULL
    )


def _instrument(on: bool) -> None:
    """Turn callgrind's instrumentation on or off."""
    _callgrind("-i", "on" if on else "off")


def _dump() -> None:
    """Write the counts so far to a file of their own (``<out>.1``) and start again from 0:
    the publishes' part, apart from the runs' (in ``<out>``, written at exit)."""
    _callgrind("-d")


def _worker_request(message: Any, hostname: str) -> tuple[str, Any, Any, dict[str, Any]]:
    """(task id, args, kwargs, request) of a message, the request as a worker makes it
    (``celery.worker.request.Request`` in the main process, then ``fast_trace_task`` in the
    pool process): the message's headers, its properties and delivery info, and the body's
    embedded callbacks."""
    args, kwargs, embed = message.decode()
    properties = message.properties or {}
    delivery = message.delivery_info or {}
    request = dict(message.headers)
    request.update(
        properties=properties,
        reply_to=properties.get("reply_to"),
        correlation_id=properties.get("correlation_id"),
        hostname=hostname,
        delivery_info={
            "exchange": delivery.get("exchange"),
            "routing_key": delivery.get("routing_key"),
            "priority": properties.get("priority"),
            "redelivered": delivery.get("redelivered", False),
        },
    )
    request.update({"args": args, "kwargs": kwargs, "is_eager": False}, **(embed or {}))
    return request["id"], args, kwargs, request


def measure(kind: str, n: int, broker: str, locks: str, queue: str, first: int) -> None:
    """Warm up, then publish ``n`` calls and run them, instrumented (see the module's doc)."""
    sys.path.insert(0, str(_HERE))
    from bench_celery import CONTENDERS, make_app
    from celery.app.trace import build_tracer
    from kombu.simple import SimpleQueue

    app = make_app(broker, locks, os.devnull, False)
    app.conf.task_default_queue = queue
    app.finalize()
    task = app.tasks[CONTENDERS[kind]]
    hostname = f"instructions@{platform.node()}"
    tracer = build_tracer(task.name, task, app=app, hostname=hostname)
    numbers = itertools.count(first)
    with app.connection_for_read() as connection:
        inbox = SimpleQueue(connection, queue)

        def take(count: int) -> list[tuple[str, Any, Any, dict[str, Any]]]:
            taken = []
            for _ in range(count):
                message = inbox.get(timeout=10)
                message.ack()
                taken.append(_worker_request(message, hostname))
            return taken

        def cycle(count: int, instrumented: bool) -> None:
            published = [next(numbers) for _ in range(count)]
            gc.collect()
            if instrumented:
                _instrument(True)
            for i in published:
                task.delay(i)
            if instrumented:
                _dump()
                _instrument(False)
            jobs = take(count)
            gc.collect()
            if instrumented:
                _instrument(True)
            for task_id, args, kwargs, request in jobs:
                tracer(task_id, args, kwargs, request)
            if instrumented:
                _instrument(False)

        cycle(WARMUP, instrumented=False)
        cycle(n, instrumented=True)
        inbox.close()


# -- the driver --------------------------------------------------------------------------------


def count_one(
    kind: str, n: int, broker: str, locks: str, slot: int, out_dir: Path
) -> tuple[int, int]:
    """Instructions of one measurement process (``kind``, ``n`` jobs) under callgrind: its
    publishes', its runs'."""
    out = out_dir / f"callgrind.{kind}.{n}.{slot}.out"
    cmd = [
        "valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}",
        sys.executable, str(Path(__file__).resolve()), "--measure", kind, str(n),
        "--broker", broker, "--locks", locks, "--queue", f"instructions-{slot}",
        "--first", str(slot * 1_000_000),
    ]  # fmt: skip
    env = dict(os.environ, PYTHONHASHSEED="0")
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{kind} x {n} failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    return _totals(Path(f"{out}.1")), _totals(out)


def _totals(path: Path) -> int:
    for line in path.read_text().splitlines():
        if line.startswith("totals:"):
            return int(line.split()[1])
    raise RuntimeError(f"no totals in {path}")


#: one process's counts: its publishes', its runs'
Counts = Mapping[int, Sequence[int]]


def slope(counts: Counts, pair: Sequence[int], part: int | None = None) -> float:
    """Instructions per job between the two job counts of ``pair``: of the publishes (``part``
    0), of the runs (1), or of both (``None``)."""
    low, high = pair

    def at(n: int) -> int:
        return sum(counts[n]) if part is None else counts[n][part]

    return (at(high) - at(low)) / (high - low)


def summarize(counts: Mapping[str, Counts], pairs: Sequence[Sequence[int]]) -> dict[str, Any]:
    """Per contender: the figure (the last pair's slope) and its publish and run parts, the
    check slope (the first pair's), their spread, and the ratio to the plain task; then the
    targets' ratios."""
    rows: dict[str, dict[str, float]] = {}
    for kind, per_n in counts.items():
        figure, check = slope(per_n, pairs[-1]), slope(per_n, pairs[0])
        rows[kind] = {
            "per_job": round(figure),
            "publish": round(slope(per_n, pairs[-1], 0)),
            "run": round(slope(per_n, pairs[-1], 1)),
            "check": round(check),
            "spread": round(abs(figure - check) / figure, 4),
        }
    plain = rows["plain"]["per_job"] if "plain" in rows else None
    for row in rows.values():
        row["x_plain"] = round(row["per_job"] / plain, 3) if plain else float("nan")
    targets: dict[str, dict[str, Any]] = {}
    peers = [rows[p]["per_job"] for p in PEERS if p in rows]
    if "locked-publish" in rows and peers:
        ratio = rows["locked-publish"]["per_job"] / min(peers)
        targets["publish"] = {"ratio": round(ratio, 3), "target": TARGET_PUBLISH}
    if "locked-run" in rows and "floor-run" in rows:
        ratio = rows["locked-run"]["per_job"] / rows["floor-run"]["per_job"]
        targets["run"] = {"ratio": round(ratio, 3), "target": TARGET_RUN}
    return {"pairs": [list(p) for p in pairs], "rows": rows, "targets": targets}


def _k(value: float) -> str:
    return f"{value / 1000:,.0f} k"


def render_markdown(summary: dict[str, Any], command: str, when: str, machine: str) -> str:
    """The table (and the targets' lines) as Markdown."""
    (c1, c2), (f1, f2) = summary["pairs"][0], summary["pairs"][-1]
    lines = [
        f"Measured {when} with `{command}` ({machine}): client instructions per job, publish "
        f"+ run, the slope between {f1} and {f2} jobs (its publish and run parts beside it); "
        f"the check slope between {c1} and {c2} jobs, measured in other processes, and its "
        "spread from the figure.",
        "",
        f"| kind | instructions per job | x plain | publish | run | check ({c1}->{c2}) | spread |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for kind, row in summary["rows"].items():
        label = KINDS.get(kind, kind)
        lines.append(
            f"| {label} | {_k(row['per_job'])} | {row['x_plain']:.2f} | {_k(row['publish'])} "
            f"| {_k(row['run'])} | {_k(row['check'])} | {row['spread']:.1%} |"
        )
    lines.append("")
    said = {
        "publish": ('`lock_at="publish"` per job, x the lower of celery-once and '
                    "celery-singleton"),
        "run": '`lock_at="run"` per job, x the reference',
    }  # fmt: skip
    for name, target in summary["targets"].items():
        met = "met" if target["ratio"] <= target["target"] else "**not met**"
        lines.append(
            f"- {said[name]}: {target['ratio']:.3f}x (target <= {target['target']:.2f}x, {met})"
        )
    return "\n".join(lines) + "\n"


def run_all(
    kinds: Iterable[str], pairs: Sequence[Sequence[int]], jobs: int, keep: Path | None
) -> dict[str, dict[int, tuple[int, int]]]:
    from celery_singleton_lock.testing import RedisServer

    sizes = sorted({n for pair in pairs for n in pair})
    # the longest first, so that the last processes to start are short ones
    plan = [(kind, n) for n in reversed(sizes) for kind in kinds]
    out_dir = keep or Path(tempfile.mkdtemp(prefix="csl-instructions-"))
    out_dir.mkdir(parents=True, exist_ok=True)
    counts: dict[str, dict[int, tuple[int, int]]] = {}
    try:
        with RedisServer() as server:
            broker = f"redis://127.0.0.1:{server.port}/0"
            locks = f"redis://127.0.0.1:{server.port}/1"
            with ThreadPoolExecutor(max_workers=jobs) as pool:
                futures = {
                    (kind, n): pool.submit(count_one, kind, n, broker, locks, slot, out_dir)
                    for slot, (kind, n) in enumerate(plan, start=1)
                }
                for (kind, n), future in futures.items():
                    counts.setdefault(kind, {})[n] = future.result()
                    publish, run = counts[kind][n]
                    print(f"  {kind} x {n}: {publish:,} + {run:,}", file=sys.stderr, flush=True)
    finally:
        if keep is None:
            shutil.rmtree(out_dir, ignore_errors=True)
    return counts


def parse_pairs(text: str) -> tuple[tuple[int, int], ...]:
    """``20:80,50:250`` -> ((20, 80), (50, 250)): two pairs of job counts, each growing."""
    pairs = tuple(tuple(int(n) for n in pair.split(":")) for pair in text.split(","))
    if len(pairs) != 2 or any(len(p) != 2 or not 0 < p[0] < p[1] for p in pairs):
        raise argparse.ArgumentTypeError(f"--pairs {text!r}: give two pairs N1:N2 with N1 < N2")
    return pairs  # type: ignore[return-value]  # two pairs of two, checked above


def _show(pairs: Sequence[Sequence[int]]) -> str:
    return ",".join(f"{low}:{high}" for low, high in pairs)


def available_kinds() -> list[str]:
    """The contenders whose packages are installed (the peers come with the bench extra)."""
    import importlib.util

    missing = {
        "celery-once": importlib.util.find_spec("celery_once") is None,
        "celery-singleton": importlib.util.find_spec("celery_singleton") is None,
    }
    return [kind for kind in KINDS if not missing.get(kind, False)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help=f"job counts {QUICK_PAIRS}")
    parser.add_argument(
        "--pairs",
        type=parse_pairs,
        help=f"job counts, check slope then figure (default {_show(PAIRS)})",
    )
    parser.add_argument("--kinds", default=",".join(KINDS), help="comma-separated contenders")
    parser.add_argument("-j", "--jobs", type=int, default=2, help="processes at once")
    parser.add_argument("--keep", type=Path, help="keep callgrind's output files in this folder")
    parser.add_argument("--out", type=Path, help="write instructions.md and .json here")
    parser.add_argument("--json", action="store_true", help="the summary as JSON on stdout")
    parser.add_argument("--measure", nargs=2, metavar=("KIND", "N"), help=argparse.SUPPRESS)
    parser.add_argument("--broker", help=argparse.SUPPRESS)
    parser.add_argument("--locks", help=argparse.SUPPRESS)
    parser.add_argument("--queue", help=argparse.SUPPRESS)
    parser.add_argument("--first", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.measure:
        measure(args.measure[0], int(args.measure[1]), args.broker, args.locks, args.queue,
                args.first)  # fmt: skip
        return 0
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        raise SystemExit("valgrind (with callgrind_control) is needed: apt-get install valgrind")
    wanted = [k.strip() for k in args.kinds.split(",") if k.strip()]
    kinds = [k for k in available_kinds() if k in wanted]
    pairs = args.pairs or (QUICK_PAIRS if args.quick else PAIRS)
    started = time.monotonic()
    counts = run_all(kinds, pairs, args.jobs, args.keep)
    summary = summarize(counts, pairs)
    import celery
    import redis

    try:
        import hiredis

        parser = f", hiredis {hiredis.__version__}"
    except ImportError:
        parser = ""
    machine = (
        f"Python {platform.python_version()}, Celery {celery.__version__}, "
        f"redis-py {redis.__version__}{parser}, {platform.machine()}"
    )
    command = "python bench/instructions.py" + (" --quick" if args.quick else "")
    if args.pairs:
        command += f" --pairs {_show(args.pairs)}"
    when = time.strftime("%Y-%m-%d")
    summary.update(counts=counts, command=command, date=when, machine=machine)
    text = render_markdown(summary, command, when, machine)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "instructions.md").write_text(text, encoding="utf-8")
        (args.out / "instructions.json").write_text(json.dumps(summary, indent=1) + "\n")
    if args.json:
        print(json.dumps(summary, indent=1))
    else:
        print(text)
        print(f"(wall time {time.monotonic() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
