#!/usr/bin/env python
"""The one benchmark command: the lock and the Celery benchmarks in one run, written up.

    .venv/bin/python bench/run.py            # about 13 min
    .venv/bin/python bench/run.py --quick    # a smoke run, about 2.5 min

Runs ``bench_lock.py`` (the floors, redis-py ``Lock``, python-redis-lock and ``ReentrantLock``:
uncontended cycles in interleaved rounds, hand-offs in interleaved chunks against a push-woken
floor), then ``bench_celery.py`` (plain, the bare two-EVALSHA reference, celery-once,
celery-singleton and ``LockedTask`` in both modes, solo and prefork, interleaved rounds), then
``instructions.py`` (the same contenders' client instructions per job, publish + run, counted
by callgrind; skipped without valgrind), one after the other so they do not compete for the
CPUs. Each starts its own Redis on loopback.

It writes, into ``docs/bench/`` (``--out`` to change):

- ``results.md``: the tables (ratios first), the targets met or not, the machine and the
  command; the docs' benchmark page includes it, and the README quotes its targets;
- ``chart.png``: the ratios as bars (matplotlib, from the ``bench`` extra);
- ``results.json``: everything both benchmarks measured;
- ``instructions.md`` and ``instructions.json``: instructions.py's table and counts (the
  benchmarks page includes the table);

and puts ``results.md`` between the README's ``bench-results`` markers.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

_HERE = Path(__file__).resolve().parent
_ROOT = _HERE.parent

#: the Celery targets (bench_celery.py's own)
TARGET_RUN_RATIO, TARGET_PUBLISH_RATIO = 0.97, 1.00


def run_benchmarks(quick: bool) -> dict[str, Any]:
    flag = ["--quick"] if quick else []
    with tempfile.TemporaryDirectory(prefix="csl-bench-") as tmp:
        lock_json = Path(tmp) / "lock.json"
        print("== bench/bench_lock.py", flush=True)
        # exit 1 means a target was missed: a result to write up, not a failure
        done = subprocess.run(
            [sys.executable, str(_HERE / "bench_lock.py"), *flag, "--json", str(lock_json)]
        )
        if done.returncode not in (0, 1) or not lock_json.exists():
            raise SystemExit(f"bench_lock.py failed (exit {done.returncode})")
        lock = json.loads(lock_json.read_text())
    print("== bench/bench_celery.py", flush=True)
    done = subprocess.run(
        [sys.executable, str(_HERE / "bench_celery.py"), *flag, "--json"],
        check=True,
        stdout=subprocess.PIPE,
        text=True,
    )
    return {"lock": lock, "celery": json.loads(done.stdout)}


def run_instructions(quick: bool, out: Path) -> None:
    """bench/instructions.py (client instructions per job, by callgrind), last: it writes
    ``instructions.md`` and ``instructions.json`` into ``out`` itself. Left out, with a word,
    where valgrind is not installed."""
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        print("== bench/instructions.py skipped: valgrind is not installed", flush=True)
        return
    print("== bench/instructions.py", flush=True)
    flag = ["--quick"] if quick else []
    subprocess.run(
        [sys.executable, str(_HERE / "instructions.py"), *flag, "--out", str(out)], check=True
    )


def _x(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}x"


def _us(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}"


def render_markdown(results: dict[str, Any], command: str, when: str) -> str:
    lock, celery = results["lock"], results["celery"]
    env, machine = lock["environment"], celery["machine"]
    u, h = lock["uncontended"], lock["handoff"]
    lines = [
        f"Measured {when} with `{command}` on {env['cpus']} CPUs "
        f"({machine['platform']}), Python {env['python']}, redis-py {env['redis_py']}"
        + (f" (replies parsed by {env['parser']})" if env.get("parser") else "")
        + ", "
        f"Celery {machine['celery']}, {env['server']}; every contender in the same run, "
        "interleaved. Ratios are what to read: absolute figures move with the host.",
        "",
        "**The lock**: uncontended acquire + release (median of interleaved rounds), and the "
        "hand-off from a release in one process to a blocked acquire returning in another.",
        "",
        "| contender | cycles/s | x floor | server us/cycle | x floor (server) "
        "| hand-off p50 ms | p99 ms | x push floor (p50) |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    rows = [
        ("floor: SET NX PX + CAD, through redis-py", "floor", None),
        ("floor: bare hash lock woken by PUBLISH", "bare_hash", "floor_push"),
        (u["contenders"]["redispy"]["label"] + " (polls)", "redispy", "redispy"),
        ("python-redis-lock", "prl", "prl"),
        ("**ReentrantLock** (renew=True)", "csl", "csl"),
        ("its two scripts alone, no lock object", "scripts", None),
    ]
    for label, ukind, hkind in rows:
        ur = u["contenders"].get(ukind) if ukind else None
        hr = h["contenders"].get(hkind) if hkind else None
        if ur is None and hr is None:
            continue
        cycles = f"{ur['cycles_per_s']:,.0f}" if ur else ""
        ratio = _x(ur["ratio_to_floor"]) if ur else ""
        server = _us(ur.get("server_us_per_cycle")) if ur else ""
        server_ratio = _x(ur.get("server_ratio_to_floor")) if ur else ""
        p50 = f"{hr['p50_ms']:.3f}" if hr else ""
        p99 = f"{hr['p99_ms']:.3f}" if hr else ""
        handoff_ratio = _x(hr["p50_ratio_to_floor"]) if hr and "p50_ratio_to_floor" in hr else ""
        lines.append(
            f"| {label} | {cycles} | {ratio} | {server} | {server_ratio} | {p50} | {p99} "
            f"| {handoff_ratio} |"
        )
    lines += [
        "",
        "Server us: Redis's own time per cycle (INFO commandstats usec of the commands the "
        "contender sends itself; a script's include the commands it runs), median of the "
        "rounds.",
        "",
        f"**Celery**: a no-op task through a real worker, N = {celery['n']} distinct arguments "
        f"published then drained, median of {celery['rounds']} interleaved rounds (tasks/s; "
        "server us: Redis's time per task, broker and locks, INFO commandstats usec of the "
        "commands the clients send).",
        "",
    ]
    pools = list(celery["pools"])
    header = "| contender |" + "".join(
        f" {p} tasks/s | server us | x plain | x reference |" for p in pools
    )
    lines += [header, "| --- |" + " ---: | ---: | ---: | ---: |" * len(pools)]
    names = {
        "plain": "plain `@app.task`",
        "floor-run": "reference: two bare EVALSHAs (hash-lock acquire, release)",
        "celery-once": "celery-once `QueueOnce`",
        "celery-singleton": "celery-singleton `Singleton`",
        "locked-run": '**LockedTask** `lock_at="run"`',
        "locked-publish": '**LockedTask** `lock_at="publish"`',
        "locked-limit3": "**LockedTask** `lock_limit=3`",
        "locked-rate": '**LockedTask** `lock_rate="100/s"`',
    }
    for name, label in names.items():
        cells = []
        for p in pools:
            row = celery["pools"][p]["contenders"].get(name)
            if row is None:
                cells.append(" | | | |")
                continue
            cells.append(
                f" {row['tasks_per_s']:,.0f} | {_us(row.get('server_us_per_task'))} | "
                f"{_x(row['ratio_to_plain'])} | {_x(row.get('ratio_to_reference'))} |"
            )
        lines.append(f"| {label} |" + "".join(cells))
    lines += ["", "**Targets**", "", "| target | measured | met |", "| --- | --- | --- |"]
    for t in lock["summary"]:
        lines.append(f"| {t['target']} | {t['measured']} | {'yes' if t['pass'] else '**no**'} |")
    for p in pools:
        rows_p = celery["pools"][p]["contenders"]
        run = rows_p["locked-run"]["ratio_to_reference"]
        lines.append(
            f'| Celery `lock_at="run"` >= {TARGET_RUN_RATIO:.2f}x the two-EVALSHA reference ({p}) '
            f"| {run:.2f}x | {'yes' if run >= TARGET_RUN_RATIO else '**no**'} |"
        )
        pub = rows_p["locked-publish"]["tasks_per_s"]
        peers = {
            c: rows_p[c]["tasks_per_s"] for c in ("celery-once", "celery-singleton") if c in rows_p
        }
        best = max(peers.values(), default=0.0)
        met = best > 0 and pub >= TARGET_PUBLISH_RATIO * best
        measured = ", ".join(f"{pub / v:.2f}x {c}" for c, v in peers.items())
        lines.append(
            f'| Celery `lock_at="publish"` >= {TARGET_PUBLISH_RATIO:.2f}x the best of celery-once '
            f"and celery-singleton ({p}) | {measured} | {'yes' if met else '**no**'} |"
        )
    lines.append("")
    return "\n".join(lines)


#: the colour of this package's bars in every panel; the others' is PEERS
OURS, PEERS = "#d95f02", "#7570b3"


def render_chart(results: dict[str, Any], path: Path) -> None:
    """Four panels, two by two so each reads at page width: one colour for this package's
    bars and one for everything else (the Celery panel tells the pools apart by hatching),
    every bar labelled with its value, the legend outside the bars."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    lock, celery = results["lock"], results["celery"]
    u, h = lock["uncontended"]["contenders"], lock["handoff"]["contenders"]
    fig, grid = plt.subplots(2, 2, figsize=(12, 8.4))
    axes = grid.flatten()

    def finish(ax: Any, values: list[float], title: str) -> None:
        ax.axvline(1.0, color="black", linewidth=0.8)
        ax.set_title(title, fontsize=10)
        ax.set_xlim(0, max([1.0, *values]) * 1.18)  # room for the value labels
        ax.invert_yaxis()

    def bars(ax: Any, labels: list[str], values: list[float], title: str, ours: set[str]) -> None:
        colors = [OURS if label in ours else PEERS for label in labels]
        ax.barh(labels, values, color=colors)
        for y, v in enumerate(values):
            ax.text(v, y, f" {v:.2f}", va="center", fontsize=8)
        finish(ax, values, title)

    kinds = [k for k in ("redispy", "prl", "csl") if k in u]
    labels = {
        "redispy": "redis-py Lock",
        "prl": "python-redis-lock",
        "csl": "ReentrantLock",
    }
    bars(
        axes[0],
        [labels[k] for k in kinds],
        [u[k]["ratio_to_floor"] for k in kinds],
        "Uncontended cycles/s, x the redis-py floor (higher is better)",
        {"ReentrantLock"},
    )
    sk = [
        k
        for k in ("bare_hash", "redispy", "prl", "csl", "scripts")
        if k in u and u[k].get("server_ratio_to_floor") is not None
    ]
    server_labels = {**labels, "scripts": "its two scripts alone", "bare_hash": "bare hash lock"}
    bars(
        axes[1],
        [server_labels[k] for k in sk],
        [u[k]["server_ratio_to_floor"] for k in sk],
        "Uncontended server time per cycle, x the floor's (lower is better)",
        {"ReentrantLock", "its two scripts alone"},
    )
    hk = [k for k in ("prl", "csl") if k in h]
    bars(
        axes[2],
        [labels[k] for k in hk],
        [h[k]["p50_ratio_to_floor"] for k in hk],
        "Hand-off p50, x the push-woken floor (lower is better)",
        {"ReentrantLock"},
    )
    pretty = {
        "floor-run": "two-EVALSHA reference",
        "celery-once": "celery-once",
        "celery-singleton": "celery-singleton",
        "locked-run": "LockedTask run",
        "locked-publish": "LockedTask publish",
        "locked-limit3": "LockedTask lock_limit=3",
        "locked-rate": "LockedTask lock_rate",
    }
    pools = list(celery["pools"])
    names = [n for n in pretty if any(n in celery["pools"][p]["contenders"] for p in pools)]
    ax = axes[3]
    width = 0.8 / len(pools)
    hatches = ["", "//", "..", "xx"]
    values: list[float] = []
    for i, p in enumerate(pools):
        rows = celery["pools"][p]["contenders"]
        present = [n for n in names if n in rows]
        ys = [names.index(n) + i * width for n in present]
        ratios = [rows[n]["ratio_to_plain"] for n in present]
        colors = [OURS if n.startswith("locked-") else PEERS for n in present]
        ax.barh(ys, ratios, height=width, color=colors, hatch=hatches[i % 4], edgecolor="white")
        for y, v in zip(ys, ratios, strict=True):
            ax.text(v, y, f" {v:.2f}", va="center", fontsize=7)
        values += ratios
    ax.set_yticks([n + 0.4 - width / 2 for n in range(len(names))], [pretty[n] for n in names])
    finish(ax, values, "Celery tasks/s, x the plain task (higher is better)")
    ax.legend(
        handles=[
            Patch(facecolor="#bbbbbb", hatch=hatches[i % 4], edgecolor="white", label=p)
            for i, p in enumerate(pools)
        ],
        fontsize=8,
        loc="upper center",
        bbox_to_anchor=(0.5, -0.08),
        ncol=len(pools),
        frameon=False,
    )
    fig.legend(
        handles=[
            Patch(color=OURS, label="celery-singleton-lock"),
            Patch(color=PEERS, label="peers and references"),
        ],
        loc="upper right",
        ncol=2,
        fontsize=9,
        frameon=False,
    )
    fig.suptitle(
        f"celery-singleton-lock benchmarks ({lock['environment']['cpus']} CPUs, "
        f"{lock['environment']['server']}, Python {lock['environment']['python']})",
        fontsize=11,
        x=0.02,
        ha="left",
    )
    fig.tight_layout(rect=(0, 0, 1, 0.96))
    fig.savefig(path, dpi=110)
    plt.close(fig)


README_START = "<!-- bench-results:start (written by bench/run.py) -->"
README_END = "<!-- bench-results:end -->"


def update_readme(readme: Path, write_up: str) -> bool:
    """Put the write-up between the README's markers (the README quotes the last run)."""
    text = readme.read_text(encoding="utf-8")
    start, end = text.find(README_START), text.find(README_END)
    if start < 0 or end < start:
        return False
    head = text[: start + len(README_START)]
    readme.write_text(head + "\n" + write_up.strip() + "\n" + text[end:], encoding="utf-8")
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run of each benchmark")
    parser.add_argument("--out", type=Path, default=_ROOT / "docs" / "bench")
    parser.add_argument(
        "--from-json", type=Path, help="write up an earlier run's results.json instead of running"
    )
    args = parser.parse_args(argv)
    if args.from_json:
        results = json.loads(args.from_json.read_text())
    else:
        results = run_benchmarks(args.quick)
        run_instructions(args.quick, args.out)
    command = "python bench/run.py" + (" --quick" if args.quick else "")
    # an earlier run written up again keeps its own date and command
    earlier = results.get("meta", {}) if args.from_json else {}
    command = earlier.get("command", command)
    when = earlier.get("date") or time.strftime("%Y-%m-%d")
    args.out.mkdir(parents=True, exist_ok=True)
    results["meta"] = {"command": command, "date": when, "machine": platform.machine()}
    (args.out / "results.json").write_text(json.dumps(results, indent=1, default=str) + "\n")
    (args.out / "results.md").write_text(render_markdown(results, command, when))
    render_chart(results, args.out / "chart.png")
    if args.out == _ROOT / "docs" / "bench" and update_readme(
        _ROOT / "README.md", (args.out / "results.md").read_text()
    ):
        print("updated the README's quote of the results")
    if args.out == _ROOT / "docs" / "bench":
        # the benchmarks page holds the write-up too, so that it reads whole on the repository
        subprocess.run([sys.executable, str(_ROOT / "docs" / "hooks.py")], check=True)
    print((args.out / "results.md").read_text())
    print(f"wrote {args.out / 'results.md'}, {args.out / 'chart.png'} ({shlex.join(sys.argv)})")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
