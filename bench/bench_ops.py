#!/usr/bin/env python
"""What an operator's read of every lock costs: ``find_locks`` (``celery locks list``, the web
page) over 10,000 held locks, against a Redis on loopback.

    .venv/bin/python bench/bench_ops.py              # 10,000 locks, 5 rounds
    .venv/bin/python bench/bench_ops.py -n 2000 --rounds 3
    .venv/bin/python bench/bench_ops.py --json       # the results as JSON on stdout

The bench starts its own throw-away ``redis-server`` on a free loopback port
(:class:`celery_singleton_lock.testing.RedisServer`), takes N locks with a Celery holder's info
(every tenth a slot of a job of ``lock_limit=3``, so the slot count is worked out too), and
times, interleaved, in rounds (the median is reported):

* ``find_locks``: SCAN with a large COUNT, then lua/inspect.lua per lock, pipelined in batches;
* ``one round trip per lock``: the same SCAN and views with one ``LockSpace.inspect`` each, as
  ``find_locks`` read them before (the reference: what the batches save).

Both must return the same views (checked each round). Target: 10,000 locks in under 0.5 s.
Then the locks page's list (``celery_singleton_lock.web``, the ``web`` extra) over real HTTP
from wsgiref's server, first page, once per round: the whole answer, read, sorted, paged and
rendered. Target: under 1 s.

Then what a refused call pays for the recent counts (``singleton_lock_counts``): the Celery
layer's ``report_refusal`` of a ``LockedTask`` (what a duplicate's path calls once), with the
setting on (a dict increment; a thread writes them each second) and off, per call, beside the
round trip every refused call makes anyway (a refused acquire: one EVALSHA).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

_ROOT = Path(__file__).resolve().parent.parent
if str(_ROOT) not in sys.path:
    sys.path.insert(0, str(_ROOT))

from celery_singleton_lock._celery.hold import holder_info
from celery_singleton_lock._lock import LockSpace, scripts
from celery_singleton_lock._lock.keys import LockKeys
from celery_singleton_lock._lock.scripts import META_RETENTION_MS
from celery_singleton_lock._ops import locks
from celery_singleton_lock.testing import RedisServer

#: the target: 10,000 held locks read in under this many seconds
TARGET_S = 0.5
#: the target: the locks page's list of 10,000 held locks answers in under this many seconds
PAGE_TARGET_S = 1.0


def take_locks(client: Any, prefix: str, n: int) -> None:
    """N held locks, pipelined (the set-up is not what is measured)."""
    lease_ms = 600_000
    calls = []
    for i in range(n):
        # every tenth and the next: two slots of one job of three (its row says "2/3")
        limit = 3 if i % 10 < 2 else 1
        name = f"tasks.work:{i - i % 10 if limit > 1 else i}"
        keys = LockKeys.for_name(prefix, name, 1 + i % 10 if limit > 1 else 1)
        info = holder_info("tasks.work", f"id-{i}", limit)
        args = (f"owner-{i}", lease_ms, f"req-{i}", lease_ms + META_RETENTION_MS, info, "", "")
        calls.append((keys.pair, args))
    for start in range(0, n, 1000):
        scripts.ACQUIRE.pipelined(client, calls[start : start + 1000])


def one_by_one(client: Any, prefix: str = "lock", pattern: str = "*") -> list[locks.LockView]:
    """``find_locks`` as it was: one inspect round trip per lock found."""
    space = LockSpace(client, prefix)
    now = locks.server_clock(client)
    return locks.views_of((space.inspect(keys.lock) for keys in space.find(pattern)), now)


def per_call_us(call: Any, n: int, rounds: int) -> float:
    """Median over ``rounds`` of the microseconds one ``call()`` takes, ``n`` calls a round."""
    times = []
    for _ in range(rounds):
        started = time.perf_counter()
        for _ in range(n):
            call()
        times.append((time.perf_counter() - started) / n * 1e6)
    return statistics.median(times)


def _never_run() -> None:
    """The benched task's body: never run, only its reports are timed."""


def refusal_costs(server: RedisServer, rounds: int) -> dict[str, float]:
    """Microseconds per refused call: its report with the counts on and off, and a refused
    acquire (the round trip of the refusal itself)."""
    from celery import Celery

    from celery_singleton_lock import LockedTask, reload_settings
    from celery_singleton_lock._celery.config import LockConfig
    from celery_singleton_lock._celery.hold import report_refusal

    app = Celery("bench_ops", set_as_current=False)
    app.conf.singleton_lock_redis_url = f"redis://127.0.0.1:{server.port}/1"

    task = app.task(base=LockedTask, name="bench.refused", shared=False)(_never_run)
    space = task.locking.space(app)
    job = space.named("bench-refused")
    assert job.take("holder", 600.0).acquired
    results = {
        "refused acquire (EVALSHA)": per_call_us(lambda: job.take("other", 600.0), 2_000, rounds)
    }
    for on in (True, False):
        app.conf.singleton_lock_counts = on
        reload_settings(app)
        results[f"report_refusal, counts {'on' if on else 'off'}"] = per_call_us(
            lambda: report_refusal(task, "limit"), 200_000, rounds
        )
        counter = LockConfig.of(app).counter_if_made
        if counter is not None:
            counter.flush()  # written while the server runs (a reload makes a new counter)
    return results


def _comparable(views: list[locks.LockView]) -> list[tuple[Any, ...]]:
    # age and lease move between two reads: compared without them
    return [(v.key, v.task, v.holder, v.pid, v.state, v.fence, v.slots) for v in views]


def _redis_cpu(client: Any) -> float:
    """The server's CPU seconds so far (INFO cpu: system + user)."""
    info = client.info("cpu")
    return float(info["used_cpu_sys"]) + float(info["used_cpu_user"])


def page_costs(url: str, client: Any, n: int, rounds: int) -> dict[str, float]:
    """The locks page's list (``celery_singleton_lock.web``, first page, default options)
    over real HTTP from the page's own server, each view a fresh read (the shared read is
    forgotten first: what one viewer pays when nobody else looks): the median over ``rounds``
    of its wall time, the page process's CPU and the Redis server's CPU (INFO cpu deltas)."""
    import threading
    import urllib.request

    from celery_singleton_lock.web import make_app
    from celery_singleton_lock.web.serve import make_server

    web = make_app(url=url)
    server = make_server(web, "127.0.0.1", 0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    page = f"http://127.0.0.1:{server.server_port}/"
    walls: list[float] = []
    cpus: list[float] = []
    redis_cpus: list[float] = []
    try:
        with urllib.request.urlopen(page) as answer:  # the scripts loaded, the client made
            answer.read()
        for _ in range(rounds):
            web.source.shared.forget()
            redis_before, cpu_before = _redis_cpu(client), time.process_time()
            started = time.perf_counter()
            with urllib.request.urlopen(page) as answer:
                body = answer.read().decode()
            walls.append(time.perf_counter() - started)
            cpus.append(time.process_time() - cpu_before)
            redis_cpus.append(_redis_cpu(client) - redis_before)
            listed = min(n, web.source.max_locks)
            assert f'<span id="total">{listed}</span>' in body, "the page did not list its share"
        viewers = {k: viewers_redis_cpu(page, client, k) for k in (2, 20)}
    finally:
        server.shutdown()
        server.server_close()
    return {
        "wall_s": statistics.median(walls),
        "page_cpu_s": statistics.median(cpus),
        "redis_cpu_s": statistics.median(redis_cpus),
        "redis_cpu_s_2_viewers_30s": viewers[2][0],
        "redis_cpu_s_20_viewers_30s": viewers[20][0],
        "redis_commands_2_viewers_30s": viewers[2][1],
        "redis_commands_20_viewers_30s": viewers[20][1],
    }


def viewers_redis_cpu(
    page: str, client: Any, viewers: int, seconds: float = 30.0
) -> tuple[float, int]:
    """Redis CPU seconds while ``viewers`` clients load the list back to back for
    ``seconds`` (tabs left open, reloading as fast as they can), and the commands it ran."""
    import threading
    import urllib.error
    import urllib.request

    stop = time.monotonic() + seconds

    def view() -> None:
        while time.monotonic() < stop:
            try:
                with urllib.request.urlopen(page) as answer:
                    answer.read()
            except urllib.error.HTTPError:  # 503 beyond the bound: answered at once
                time.sleep(0.05)

    client.config_resetstat()
    before = _redis_cpu(client)
    threads = [threading.Thread(target=view) for _ in range(viewers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    cpu = _redis_cpu(client) - before
    stats = client.info("commandstats")
    calls = sum(int(v["calls"]) for k, v in stats.items() if k not in _BENCH_COMMANDS)
    return cpu, calls


#: the bench's own commands, not counted
_BENCH_COMMANDS = ("cmdstat_info", "cmdstat_config|resetstat")


def page_bench(sizes: list[int], rounds: int) -> dict[int, dict[str, float]]:
    """:func:`page_costs` at each number of held locks, each on a fresh server."""
    results = {}
    for n in sizes:
        with RedisServer() as server:
            client = server.client()
            take_locks(client, "lock", n)
            results[n] = page_costs(server.url, client, n, rounds)
    return results


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("-n", type=int, default=10_000, help="held locks (default 10000)")
    p.add_argument("--rounds", type=int, default=5, help="rounds (default 5)")
    p.add_argument("--json", action="store_true", help="print the results as JSON on stdout")
    p.add_argument(
        "--page",
        default="",
        help="only the locks page, at these numbers of held locks (e.g. 10000,100000)",
    )
    args = p.parse_args()
    if args.page:
        by_size = page_bench([int(n) for n in args.page.split(",")], args.rounds)
        if args.json:
            print(json.dumps(by_size, indent=2))
            return 0
        print(f"The locks page's list over HTTP, a fresh read per view, median of {args.rounds}")
        print("| held locks | wall s | page CPU s | Redis CPU s | 2 / 20 viewers for 30 s: Redis")
        print("CPU s, commands |\n| ---: | ---: | ---: | ---: | ---: |")
        for size, c in by_size.items():
            two, twenty = "redis_cpu_s_2_viewers_30s", "redis_cpu_s_20_viewers_30s"
            calls = "redis_commands_2_viewers_30s", "redis_commands_20_viewers_30s"
            print(
                f"| {size:,} | {c['wall_s']:.3f} | {c['page_cpu_s']:.3f} | {c['redis_cpu_s']:.3f} "
                f"| {c[two]:.3f} / {c[twenty]:.3f}, {c[calls[0]]:.0f} / {c[calls[1]]:.0f} |"
            )
        return 0
    contenders = {"find_locks": locks.find_locks, "one round trip per lock": one_by_one}
    times: dict[str, list[float]] = {name: [] for name in contenders}
    with RedisServer() as server:
        client = server.client()
        take_locks(client, "lock", args.n)
        for r in range(args.rounds):
            found: dict[str, list[locks.LockView]] = {}
            order = list(contenders)[r % 2 :] + list(contenders)[: r % 2]
            for name in order:
                started = time.perf_counter()
                found[name] = contenders[name](client)
                times[name].append(time.perf_counter() - started)
            assert len(found["find_locks"]) == args.n, len(found["find_locks"])
            assert _comparable(found["find_locks"]) == _comparable(found["one round trip per lock"])
        page = page_costs(server.url, client, args.n, args.rounds)["wall_s"]
        costs = refusal_costs(server, args.rounds)
    medians = {name: statistics.median(t) for name, t in times.items()}
    result = {
        "locks": args.n,
        "rounds": args.rounds,
        "median_s": medians,
        "speedup": medians["one round trip per lock"] / medians["find_locks"],
        "target_s": TARGET_S,
        "met": medians["find_locks"] < TARGET_S,
        "page_s": page,
        "page_met": page < PAGE_TARGET_S,
        "refusal_us": costs,
    }
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(f"find_locks over {args.n:,} held locks, median of {args.rounds} interleaved rounds")
    print("| contender | median s | locks/s |\n| --- | ---: | ---: |")
    for name, seconds in medians.items():
        print(f"| {name} | {seconds:.3f} | {args.n / seconds:,.0f} |")
    met = "yes" if result["met"] else "**no**"
    speedup = result["speedup"]
    print(f"\nfind_locks is {speedup:.1f}x the one-by-one read; target < {TARGET_S} s: {met}")
    page_met = "yes" if result["page_met"] else "**no**"
    print(f"the locks page's list over HTTP: {page:.3f} s; target < {PAGE_TARGET_S} s: {page_met}")
    print("\nWhat a refused call pays for the recent counts, median of the rounds")
    print("| call | us/call |\n| --- | ---: |")
    for name, us in costs.items():
        print(f"| {name} | {us:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
