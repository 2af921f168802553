"""One runtime per client (``_lock/runtime.py``): it goes with its client, it keeps one lease per
hold, its renewal notices a lock deleted behind its back, and a release wakes one waiting thread
of the process, not all of them, without losing a wake-up."""

from __future__ import annotations

import gc
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

import pytest
from lock_helpers import evalsha_calls, wait_until

from celery_singleton_lock import LockNotOwnedError, ReentrantLock
from celery_singleton_lock._lock.runtime import LockRuntime
from celery_singleton_lock._lock.wakeup import Subscription
from celery_singleton_lock.testing import RedisServer

#: how long each waiter of the hand-off test holds the lock
HOLD = 0.2
#: the longest a hand-off may take after the previous holder began its release
HANDOFF_BOUND = HOLD + 0.5


def _subscribers(client: Any, channel: str) -> int:
    return int(dict(client.pubsub_numsub(channel))[channel.encode()])


def _subscription(client: Any, channel: str) -> Subscription | None:
    return LockRuntime.of(client).hub.subscriptions.get(channel)


def _asleep(client: Any, channel: str) -> int:
    """Threads of this process asleep in the wait for ``channel``'s lock."""
    sub = _subscription(client, channel)
    return 0 if sub is None else sub.sleeping


def _connections(admin: Any, name: str) -> list[dict[str, Any]]:
    return [c for c in admin.client_list() if c.get("name") == name]


def _wait_once(server: RedisServer, admin: Any) -> tuple[weakref.ref[Any], weakref.ref[Any]]:
    """A new client, used by a waiter that blocks and is woken; then left idle (weak
    references to it and its runtime returned: the caller drops it by returning from here)."""
    client = server.client(client_name="dropped")
    holder = ReentrantLock(client, "rt", ttl=10, owner="holder")  # renewed: the lane starts
    assert holder.acquire()
    got: list[bool] = []

    def wait_for_it() -> None:
        lock = ReentrantLock(client, "rt", ttl=10)
        got.append(lock.acquire(timeout=10))
        lock.release()

    waiter = threading.Thread(target=wait_for_it)
    waiter.start()
    channel = holder.key + ":wake"
    wait_until(lambda: _asleep(client, channel) == 1, 5, "the waiter asleep")
    wait_until(lambda: _subscribers(admin, channel) == 1, 5, "its subscription live")
    holder.release()
    waiter.join(10)
    assert got == [True]
    # The subscription ended (UNSUBSCRIBE from the lane): its connection is kept idle for the
    # next wait, and the lane still runs (it ends only after a while with nothing to do).
    wait_until(
        lambda: any(c["cmd"] == "unsubscribe" for c in _connections(admin, "dropped")),
        5,
        "an idle pub/sub connection kept",
    )
    runtime = LockRuntime.of(client)
    assert runtime.lane.thread is not None  # the lane still runs
    return weakref.ref(client), weakref.ref(runtime)


def test_a_dropped_client_takes_its_runtime_and_its_pubsub_connections_with_it(
    make_redis_server: Callable[..., RedisServer],
) -> None:
    server = make_redis_server()
    admin = server.client()
    dead_client, dead_runtime = _wait_once(server, admin)
    gc.collect()
    assert dead_client() is None, gc.get_referrers(dead_client())
    wait_until(lambda: not _connections(admin, "dropped"), 5, "every connection closed")
    wait_until(lambda: gc.collect() is not None and dead_runtime() is None, 5, "the runtime gone")
    admin.close()


def test_lock_objects_of_one_owner_must_agree_on_ttl_and_renew(redis_client: Any) -> None:
    first = ReentrantLock(redis_client, "agree", ttl=10, owner="o")
    longer = ReentrantLock(redis_client, "agree", ttl=20, owner="o")
    unrenewed = ReentrantLock(redis_client, "agree", ttl=10, owner="o", renew=False)
    assert first.acquire()
    with pytest.raises(ValueError, match=r"ttl=10 renew=True.*ttl=20 renew=True"):
        longer.acquire()
    with pytest.raises(ValueError, match=r"ttl=10 renew=True.*ttl=10 renew=False"):
        unrenewed.acquire(blocking=False)
    assert first.hold_count == 1  # the refused ones took nothing
    same = ReentrantLock(redis_client, "agree", ttl=10, owner="o")
    assert same.acquire()
    assert first.hold_count == 2
    same.release()
    first.release()
    # Once nobody holds it, the next lock object takes it with its own lease.
    assert longer.acquire()
    assert redis_client.pttl(longer.key) > 10_000
    longer.release()


def test_a_renewal_that_finds_the_lock_gone_sets_lost(redis_client: Any) -> None:
    """The key is deleted behind the holder's back: the next renewal (about ttl/3 after the
    acquire) finds it gone and sets ``lost``, long before the local lease would end."""
    ttl = 10.0
    lock = ReentrantLock(redis_client, "deleted", ttl=ttl)
    assert lock.acquire()
    acquired = time.monotonic()
    redis_client.delete(lock.key)
    assert lock.lost.wait(ttl / 3 + 1), "the renewal did not notice"
    assert time.monotonic() - acquired <= ttl / 3 + 1
    with pytest.raises(LockNotOwnedError):
        lock.release()


def test_a_release_wakes_one_waiter_and_each_waiter_gets_the_lock_in_turn(
    make_redis_server: Callable[..., RedisServer],
) -> None:
    """Five threads wait for one lock: every release wakes one of them, which takes it (the
    others sleep on: no refused acquire); each hand-off is prompt after the previous release."""
    server = make_redis_server()  # of its own: the EVALSHA count is this test's alone
    admin = server.client()
    client = server.client()
    waiters = 5
    with ReentrantLock(client, "warm-up", ttl=10, renew=False):
        pass  # the scripts loaded: a NOSCRIPT reply would count as one more EVALSHA below
    holder = ReentrantLock(client, "turns", ttl=10, owner="holder", renew=False)
    assert holder.acquire()
    channel = holder.key + ":wake"
    turns: list[tuple[float, float, int]] = []  # (acquired, release began, asleep then)
    turns_lock = threading.Lock()

    def wait_turn() -> None:
        lock = ReentrantLock(client, "turns", ttl=10, renew=False)
        assert lock.acquire(timeout=30)
        acquired = time.monotonic()
        asleep = _asleep(client, channel)
        time.sleep(HOLD)  # the work done under the lock, not a synchronisation
        with turns_lock:
            turns.append((acquired, time.monotonic(), asleep))
        lock.release()

    threads = [threading.Thread(target=wait_turn) for _ in range(waiters)]
    for thread in threads:
        thread.start()
    wait_until(lambda: _asleep(client, channel) == waiters, 10, "every waiter asleep")
    wait_until(lambda: _subscribers(admin, channel) == 1, 5, "the subscription live")
    before = evalsha_calls(admin)
    released = time.monotonic()
    holder.release()
    for thread in threads:
        thread.join(30)
    assert len(turns) == waiters
    turns.sort()
    previous_release = released
    for i, (acquired, release_began, asleep) in enumerate(turns):
        handoff = acquired - previous_release
        assert 0 <= handoff <= HANDOFF_BOUND, (i, handoff)
        # the ones still waiting slept through this release: one thread was woken
        assert asleep == waiters - 1 - i, (i, asleep)
        previous_release = release_began
    # One acquire per waiter and one release per holder: no refused acquire after a release
    # (waking all five would add 4 + 3 + 2 + 1 of them).
    assert evalsha_calls(admin) - before == 2 * waiters + 1
    admin.close()


def test_a_woken_waiter_that_leaves_without_trying_passes_the_wake_up_on(
    redis_server: RedisServer, redis_client: Any
) -> None:
    """Two threads wait on one subscription; one release wakes one of them. If that one leaves
    without trying the lock again (an error, an interrupt), the other is woken in its place:
    the release is not lost on it."""
    client = redis_server.client()
    hub = LockRuntime.of(client).hub
    channel = "lock:{pass-on}:wake"
    sub = hub.join(channel)
    assert hub.join(channel) is sub  # the second waiter
    woken: list[str] = []

    def wait(name: str) -> None:
        if sub.wait(10):
            woken.append(name)

    threads = [threading.Thread(target=wait, args=(name,)) for name in ("a", "b")]
    for thread in threads:
        thread.start()
    wait_until(lambda: sub.sleeping == 2, 5, "both waiters asleep")
    redis_client.publish(channel, "")
    wait_until(lambda: len(woken) == 1, 5, "one waiter woken")
    assert sub.sleeping == 1  # the other sleeps on
    passed = time.monotonic()
    hub.leave(sub, woken=True)  # the woken one leaves without trying
    wait_until(lambda: len(woken) == 2, 5, "the wake-up passed on")
    assert time.monotonic() - passed < 1.0
    for thread in threads:
        thread.join(5)
    hub.leave(sub)
    client.close()
