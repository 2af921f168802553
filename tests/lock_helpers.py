"""Helpers of the lock tests: bounded waiting, server statistics, and the bodies of the
processes that the multi-process tests start (module-level, so any start method can run them)."""

from __future__ import annotations

import functools
import os
import re
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Literal, TypeVar

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from celery_singleton_lock import ReentrantLock
from celery_singleton_lock._lock import runtime
from celery_singleton_lock.lock import LockKeys
from celery_singleton_lock.testing import RedisServer, find_redis_server

T = TypeVar("T")

#: seconds a process may take to start (a Python interpreter importing Celery or Django, or a
#: fresh venv's packages for the first time, then connecting) before a test gives up on it. The
#: suite runs three test processes on a 2-CPU machine, often beside other work: at a load of 6
#: or 7 a start that takes 2 s idle can take ten times that. A wait for a start, or for a
#: subprocess that starts one, only bounds a hang: it returns as soon as the process is up, so
#: a long bound costs nothing when all is well (a per-test timeout that covers such a wait is
#: this plus the scenario's own time).
START_TIMEOUT = 120.0


def wait_until(
    predicate: Callable[[], T | Literal[False] | None],
    timeout: float = 10.0,
    what: str = "",
    interval: float = 0.01,
) -> T:
    """Poll ``predicate`` until it returns something truthy (returned); fail after ``timeout``
    seconds, naming ``what`` was awaited. The one bounded wait of the tests (lock, Celery and
    subprocess tests alike)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what or predicate}")
        time.sleep(interval)


def settled(client: Any) -> None:
    """Return once the server has run every command that had reached it when this was called:
    two round trips on ``client``. The server runs what is readable on every connection in
    each turn of its event loop, and the second PING is read a turn after the first one's;
    so a late command (a resend, a reply that was held up) cannot come after this. Not while
    a ``CLIENT PAUSE`` holds commands back."""
    client.ping()
    client.ping()


def renewed_holds() -> list[Any]:
    """Every hold a renewal lane of this process renews now, over every client's runtime (a
    forked child sees only its own). White-box: the package keeps no view of its lanes."""
    holds: list[Any] = []
    for one in list(runtime._runtimes.values()):  # noqa: SLF001  # white-box (see above)
        with one.lane.cond:
            holds += one.lane.holds.values()
    return holds


def renewed_here(lock: ReentrantLock) -> bool:
    """Whether a renewal lane of this process still renews ``lock``'s hold (its owner's, on
    its key): it gives up a lost hold, and sends nothing more for it, when it notices."""
    return any(hold.keys.lock == lock.key and hold.owner == lock.owner for hold in renewed_holds())


def evalsha_calls(client: Any) -> int:
    """How many EVALSHA commands the server has run (INFO commandstats)."""
    stats = client.info("commandstats")
    return int(stats.get("cmdstat_evalsha", {}).get("calls", 0))


def command_calls(client: Any) -> dict[str, int]:
    """Calls per command name, from INFO commandstats."""
    stats = client.info("commandstats")
    return {name[len("cmdstat_") :]: int(v["calls"]) for name, v in stats.items()}


def counting_client(port: int, **options: Any) -> Any:
    """A redis-py client that counts its round trips (each write of one or more commands to
    the socket) in ``client.round_trips[0]``: client-side, no MONITOR, no fake."""
    sent = [0]

    class CountingConnection(redis.Connection):
        def send_packed_command(self, command: Any, check_health: bool = True) -> None:
            sent[0] += 1
            super().send_packed_command(command, check_health)  # type: ignore[no-untyped-call]  # redis-py: unannotated

    pool = redis.ConnectionPool(port=port, connection_class=CountingConnection, **options)
    client: Any = redis.Redis(connection_pool=pool)  # with an attribute of ours
    client.round_trips = sent
    return client


def count_wakeups(client: Any) -> list[int]:
    """Count, in ``[0]`` from now on, the wake-up messages ``client``'s waiting threads read."""
    hub = runtime.LockRuntime.of(client).hub
    read, seen = hub.read, [0]

    def counted(pubsub: Any, timeout: float) -> Any:
        reply = read(pubsub, timeout)
        seen[0] += reply is not None
        return reply

    hub.read = counted  # type: ignore[method-assign]  # a counting wrapper, this hub only
    return seen


def held_fence(lock: ReentrantLock) -> int:
    """The fencing token of a lock the caller holds (every hold has one)."""
    fence = lock.fence
    assert fence is not None, "the lock is not held"
    return fence


def wake_subscribers(client: Any, key: str) -> int:
    """How many connections are subscribed to the wake-up channel of the lock whose Redis key
    is ``key`` (``<key>:wake``, or for a semaphore's permit ``k`` the channel of its name's
    first permit; sharded pub/sub on a Redis Cluster). A waiter that was refused subscribes
    there before it blocks, so this is how a test sees that a waiter is waiting."""
    keys = LockKeys.from_lock_key(key)
    channel = keys.channel
    if hasattr(client, "get_node_from_key"):  # a RedisCluster: the channel's node answers
        node = client.get_node_from_key(channel)
        if runtime.LockRuntime.of(client).publish_command(keys.prefix) == "spublish":
            reply = client.pubsub_shardnumsub(channel, target_nodes=node)
        else:  # Redis 6.2: plain pub/sub, on the node of the channel's slot (redis-py's pick)
            reply = client.pubsub_numsub(channel, target_nodes=node)
    else:
        reply = client.pubsub_numsub(channel)
    counts = {(k if isinstance(k, bytes) else str(k).encode()): int(n) for k, n in reply}
    return counts.get(channel.encode(), 0)


@functools.cache
def server_version(binary: str | None = None) -> tuple[int, int]:
    """(major, minor) of the server binary the tests start (``binary``, or
    :func:`~celery_singleton_lock.testing.find_redis_server`'s): Redis's version, or Valkey's
    (every Valkey has what Redis 7.2 has)."""
    out = subprocess.run(
        [binary or find_redis_server(), "--version"],
        capture_output=True,
        text=True,
        timeout=10,
        check=True,
    ).stdout
    found = re.search(r"\bv=(\d+)\.(\d+)", out)
    assert found, f"no version in {out!r}"
    return int(found.group(1)), int(found.group(2))


def debug_command_args() -> list[str]:
    """Server arguments that allow ``DEBUG`` (``DEBUG SLEEP`` stalls a server): Redis 7.0 and
    later refuse it unless started with ``--enable-debug-command``, which Redis 6.2 does not
    know (it exits at start), and always allows ``DEBUG``."""
    return ["--enable-debug-command", "yes"] if server_version() >= (7, 0) else []


def server_stalled(port: int, within: float = 0.05) -> bool:
    """Whether the server on ``port`` leaves a PING on a new connection unanswered for
    ``within`` s: it is busy (a ``DEBUG SLEEP`` runs), and a command sent now waits for it."""
    probe: Any = redis.Redis(
        port=port, socket_timeout=within, socket_connect_timeout=1, retry=Retry(NoBackoff(), 0)
    )
    try:
        probe.ping()
    except redis.TimeoutError:
        return True
    finally:
        probe.close()
    return False


#: KEYS[1]: a key. The server's clock (TIME) and the key's PTTL, read in one step.
_LEASE_END = """
local now = redis.call('time')
return {now[1], now[2], redis.call('pttl', KEYS[1])}
"""


def lease_end(client: Any, key: str) -> float | None:
    """When ``key``'s lease ends, as a Unix time on the server's clock (the clock of this
    host, for the tests' servers): read from Redis in one step, so how late the reply comes
    does not move it. ``None`` when the key is gone or has no lease."""
    seconds, micros, pttl = (int(v) for v in client.eval(_LEASE_END, 1, key))
    if pttl < 0:
        return None
    return seconds + micros / 1e6 + pttl / 1000


def server_time(client: Any) -> float:
    """The server's clock now (TIME), as a Unix time."""
    seconds, micros = client.time()
    return int(seconds) + int(micros) / 1e6


def hold_counts(client: Any, key: str) -> dict[str, int]:
    """The lock hash as Redis has it: owner -> hold count."""
    return {
        (k.decode() if isinstance(k, bytes) else k): int(v) for k, v in client.hgetall(key).items()
    }


# -- bodies of child processes -------------------------------------------------------------


def overlap_worker(
    port: int, name: str, rounds: int, ttl: float, barrier: Any, results: Any
) -> None:
    """Take and release ``name`` ``rounds`` times; report the hold intervals.

    Inside each hold it does a read-modify-write of a counter without any atomicity of its own,
    so an overlap would also lose increments. Reports ``(pid, intervals, error)`` where an
    interval is ``(start, end, fence)`` in ``time.monotonic()`` (system-wide on Linux).
    """
    intervals: list[tuple[float, float, int]] = []
    error = ""
    try:
        client = redis.Redis(port=port, socket_timeout=10, socket_connect_timeout=10)
        lock = ReentrantLock(client, name, ttl=ttl)
        counter = f"counter:{{{name}}}"
        barrier.wait(30)
        for _ in range(rounds):
            if not lock.acquire(timeout=60):
                error = "acquire timed out"
                break
            start = time.monotonic()
            fence = lock.fence
            value = int(client.get(counter) or 0)
            time.sleep(0.0005)  # widens the window an overlap would need (the scenario)
            client.set(counter, value + 1)
            end = time.monotonic()
            lock.release()
            assert fence is not None
            intervals.append((start, end, fence))
    except BaseException as exc:  # report everything: the parent asserts
        error = f"{type(exc).__name__}: {exc}"
    results.put((os.getpid(), intervals, error))


def try_once_worker(port: int, name: str, barrier: Any, results: Any) -> None:
    """One non-blocking attempt at ``name`` after the barrier; reports (pid, acquired)."""
    client = redis.Redis(port=port, socket_timeout=10)
    lock = ReentrantLock(client, name, ttl=10.0)
    barrier.wait(30)
    got = lock.acquire(blocking=False)
    results.put((os.getpid(), got))


def hold_forever_worker(port: int, name: str, ttl: float, held: Any) -> None:
    """Take ``name`` (renewed by the heartbeat), say so, and wait to be killed."""
    client = redis.Redis(port=port, socket_timeout=10)
    lock = ReentrantLock(client, name, ttl=ttl)
    lock.acquire()
    held.set()
    time.sleep(120)  # holds it until the test kills this process (the scenario)


#: a store that keeps the largest fencing token it has seen and refuses writes with a smaller
#: one (KEYS[1] = the token, KEYS[2] = the value; ARGV[1] = token, ARGV[2] = value; 1 or 0)
FENCED_WRITE = """
local last = tonumber(redis.call('get', KEYS[1]) or '0')
local fence = tonumber(ARGV[1])
if fence < last then return 0 end
redis.call('set', KEYS[1], ARGV[1])
redis.call('set', KEYS[2], ARGV[2])
return 1
"""


def fenced_write(client: Any, fence: int, value: str) -> bool:
    """Write ``value`` to the fenced store as the holder of ``fence``; whether it was taken."""
    return bool(client.eval(FENCED_WRITE, 2, "store:fence", "store:value", fence, value))


def paused_holder_worker(port: int, name: str, ttl: float, report: Any, go_on: Any) -> None:
    """Hold ``name``, report the fence, wait (the test SIGSTOPs and SIGCONTs this process),
    then report whether ``lost`` is set and whether the late fenced write was taken."""
    client = redis.Redis(port=port, socket_timeout=10)
    lock = ReentrantLock(client, name, ttl=ttl)
    assert lock.acquire()
    fence = lock.fence
    assert fence is not None
    report.put(("held", fence))
    go_on.wait(60)  # set by the test once this process was stopped and continued
    lost = lock.lost.is_set()
    report.put(("woke", lost, fenced_write(client, fence, "late write of the paused holder")))


@contextmanager
def stopped(server: RedisServer) -> Iterator[None]:
    """The server SIGSTOPped (it accepts connections, never answers) until the block ends."""
    assert server.process is not None
    os.kill(server.process.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(server.process.pid, signal.SIGCONT)
