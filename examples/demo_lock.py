"""A tour of ReentrantLock: re-entry, fencing tokens, push hand-off, heartbeat, lost leases.

Run it with ``scripts/demo`` (which installs what it needs), or in a venv where
``celery-singleton-lock[embedded]`` is installed::

    python examples/demo_lock.py               # $REDIS_URL, else 127.0.0.1:6379/15, else embedded
    python examples/demo_lock.py --embedded    # always a throw-away server of its own
    python examples/demo_lock.py --url redis://127.0.0.1:6380/3

It never flushes anything: every key it writes starts with a prefix unique to the run, and the
keys it leaves are deleted at the end. On a Redis it finds it uses database 15 unless the URL says
otherwise.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import multiprocessing
import os
import sys
import time
import uuid
from collections.abc import Iterator
from typing import Any

import redis

from celery_singleton_lock import LockLostError, LockNotOwnedError, ReentrantLock

DEFAULT_URL = "redis://127.0.0.1:6379/15"
PREFIX = f"csl-demo-{uuid.uuid4().hex[:8]}"


def say(text: str = "") -> None:
    print(text, flush=True)


def title(text: str) -> None:
    say()
    say(f"== {text}")


def fail(text: str) -> None:
    say(f"UNEXPECTED: {text}")
    sys.exit(1)


def hash_in_redis(client: Any, lock: ReentrantLock) -> dict[str, int]:
    return {k.decode(): int(v) for k, v in client.hgetall(lock.key).items()}


def short(owner: str) -> str:
    return owner if len(owner) <= 48 else owner[:45] + "..."


# -- where Redis is --------------------------------------------------------------------------


def reachable(url: str) -> tuple[Any, str]:
    client = redis.Redis.from_url(url, socket_connect_timeout=0.5, socket_timeout=5)
    try:
        client.ping()
    except redis.RedisError as exc:
        client.close()
        return None, f"{type(exc).__name__}: {exc}"
    return client, ""


@contextlib.contextmanager
def redis_for_demo(args: argparse.Namespace) -> Iterator[tuple[Any, str]]:
    if not args.embedded:
        url = args.url or os.environ.get("REDIS_URL") or DEFAULT_URL
        client, why = reachable(url)
        if client is not None:
            say(f"Using the Redis at {url} (keys prefixed {PREFIX!r}; nothing is flushed)")
            yield client, url
            return
        say(f"No Redis answered at {url} ({why}).")
    from celery_singleton_lock.testing import RedisServer

    with RedisServer() as server:
        url = f"redis://127.0.0.1:{server.port}/15"
        say(f"Started a throw-away server on port {server.port}: {server.binary}")
        client = redis.Redis.from_url(url, socket_timeout=5)
        yield client, url


# -- 1. take and re-enter -------------------------------------------------------------------


def demo_reentry(client: Any) -> None:
    title("1. Take the lock, re-enter it, release it")
    lock = ReentrantLock(client, "report", ttl=30, prefix=PREFIX)
    say(f"lock key {lock.key!r}, owner {short(lock.owner)!r}")
    say(f"acquire()                 -> {lock.acquire()}   hold_count={lock.hold_count}")
    say(f"  in Redis: one hash, field = owner, value = hold count: {hash_in_redis(client, lock)}")
    with lock:
        say(f"with lock: (re-entered)   hold_count={lock.hold_count}")
        say(
            f"  in Redis still {list(hash_in_redis(client, lock).values())}: nested re-entry in "
            "one process is counted locally, no round trip"
        )
        twin = ReentrantLock(client, "report", ttl=30, prefix=PREFIX)
        say(f"  another lock object, same name and owner, shares the hold: {twin.hold_count=}")
    say(f"after the with block      hold_count={lock.hold_count}")

    other = ReentrantLock(client, "report", ttl=30, owner="someone-else", prefix=PREFIX)
    say(f"another owner: acquire(blocking=False) -> {other.acquire(blocking=False)}")
    try:
        other.release()
        fail("another owner released a lock it does not hold")
    except LockNotOwnedError as exc:
        say(f"another owner: release()  -> LockNotOwnedError: {exc}")

    lock.release()
    say(f"release()                 hold_count={lock.hold_count}, locked()={lock.locked()}")


# -- 2. fencing tokens ----------------------------------------------------------------------


def demo_fencing(client: Any) -> None:
    title("2. Fencing tokens: every new holder gets a larger one")
    first = ReentrantLock(client, "ledger", owner="worker-a", prefix=PREFIX)
    second = ReentrantLock(client, "ledger", owner="worker-b", prefix=PREFIX)
    with first:
        fence_a = first.fence
        say(f"worker-a holds it: fence={fence_a}")
    with second:
        fence_b = second.fence
        say(f"worker-b holds it: fence={fence_b}")
    if fence_a is None or fence_b is None or fence_b <= fence_a:
        fail(f"fence did not increase: {fence_a} then {fence_b}")
    say(
        "A store that remembers the largest fence it has seen can refuse a late write from "
        "worker-a (a holder paused past its lease)."
    )


# -- 3. a second process, woken by the release ----------------------------------------------


def _waiter(url: str, prefix: str, queue: Any) -> None:
    client = redis.Redis.from_url(url, socket_timeout=5)
    lock = ReentrantLock(client, "handoff", ttl=30, prefix=prefix)
    queue.put(("tried", lock.acquire(blocking=False)))
    started = time.monotonic()
    queue.put(("waiting", started))
    got = lock.acquire(timeout=20)
    # CLOCK_MONOTONIC is system-wide on Linux and macOS, so the parent can compare it with its own.
    queue.put(("acquired", got, time.monotonic(), started, lock.fence))
    if got:
        lock.release()


def demo_handoff(client: Any, url: str) -> None:
    title("3. A second process blocks, and the release wakes it (push, not polling)")
    lock = ReentrantLock(client, "handoff", ttl=30, prefix=PREFIX)
    lock.acquire()
    say(f"this process (pid {os.getpid()}) holds it with a 30 s lease, fence={lock.fence}")
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    child = ctx.Process(target=_waiter, args=(url, PREFIX, queue), daemon=True)
    child.start()
    try:
        _, took = queue.get(timeout=30)
        say(f"child (pid {child.pid}): acquire(blocking=False) -> {took}")
        queue.get(timeout=30)
        say("child: acquire(timeout=20) ... blocked")
        time.sleep(1.0)
        released_at = time.monotonic()
        lock.release()
        say("this process: release()")
        _, got, acquired_at, started, fence = queue.get(timeout=30)
    finally:
        child.join(30)
    if not got:
        fail("the child did not get the lock")
    say(f"child: acquired after waiting {acquired_at - started:.2f} s, fence={fence}")
    say(
        f"hand-off: {(acquired_at - released_at) * 1000:.2f} ms from the release call to the "
        "child holding the lock"
    )
    say("  (no polling: the final release publishes a wake-up; had that message been lost, the")
    say("   waiter would have looked again when the holder's lease ended, here within 30 s)")


# -- 4. the heartbeat -----------------------------------------------------------------------


def demo_heartbeat(client: Any) -> None:
    title("4. The heartbeat keeps a 1 s lease alive for as long as it is held")
    lock = ReentrantLock(client, "long-job", ttl=1.0, prefix=PREFIX)
    lock.acquire()
    start = time.monotonic()
    while (elapsed := time.monotonic() - start) < 3.0:
        time.sleep(0.5)
        say(
            f"  t={time.monotonic() - start:.1f} s  lease left in Redis: "
            f"{client.pttl(lock.key):4d} ms  lost={lock.lost.is_set()}"
        )
    lock.ensure_held()
    say(f"held {elapsed:.1f} s on a 1 s lease: ensure_held() passes (renewed about every ttl/3)")
    lock.release()

    crashed = ReentrantLock(client, "crashed-job", ttl=1.0, renew=False, prefix=PREFIX)
    crashed.acquire()
    say("a holder that stops renewing (renew=False here; a crashed worker in real life):")
    say(f"  locked() -> {crashed.locked()}")
    time.sleep(1.2)
    say(f"  1.2 s later, locked() -> {crashed.locked()}: the lease ended, no stuck lock")
    if crashed.locked():
        fail("an unrenewed lock outlived its lease")
    with contextlib.suppress(LockNotOwnedError):
        crashed.release()


# -- 5. lost ---------------------------------------------------------------------------------


def demo_lost(client: Any) -> None:
    title("5. `lost` is set when the lease is gone behind the holder's back")
    lock = ReentrantLock(client, "fragile", ttl=1.0, prefix=PREFIX)
    lock.acquire()
    client.delete(lock.key)
    deleted_at = time.monotonic()
    say(f"held with a 1 s lease; then DEL {lock.key} from outside")
    if not lock.lost.wait(3.0):
        fail("lost was not set within 3 s")
    say(f"lock.lost set {(time.monotonic() - deleted_at) * 1000:.0f} ms later, by the heartbeat")
    try:
        lock.ensure_held()
        fail("ensure_held() passed after the lease was lost")
    except LockLostError as exc:
        say(f"ensure_held() -> LockLostError: {exc}")
    try:
        lock.release()
        fail("release() of a lost lock passed")
    except LockNotOwnedError as exc:
        say(f"release()     -> LockNotOwnedError: {exc}")


def cleanup(client: Any) -> None:
    # Only this run's keys (the meta hashes that keep the last fencing token for a minute).
    keys = list(client.scan_iter(match=f"{PREFIX}:*", count=100))
    if keys:
        client.delete(*keys)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", help="Redis URL (default: $REDIS_URL, else " + DEFAULT_URL + ")")
    parser.add_argument(
        "--embedded", action="store_true", help="start a throw-away server instead of using one"
    )
    args = parser.parse_args()
    logging.basicConfig(
        level=logging.WARNING, stream=sys.stdout, format="  [log %(levelname)s] %(message)s"
    )

    with redis_for_demo(args) as (client, url):
        try:
            demo_reentry(client)
            demo_fencing(client)
            demo_handoff(client, url)
            demo_heartbeat(client)
            demo_lost(client)
        finally:
            cleanup(client)
    say()
    say("Done.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
