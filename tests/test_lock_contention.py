"""Mutual exclusion under contention, and how waiters are woken: the multi-process overlap
checker, exactly one winner, push wake-up with one shared subscription per process, and wake-ups
that never arrive (the lock deleted without a publish, the subscription killed)."""

from __future__ import annotations

import itertools
import multiprocessing
import threading
import time
from typing import Any

import pytest
import redis
from lock_helpers import count_wakeups, overlap_worker, try_once_worker, wait_until

from celery_singleton_lock import LockLostError, LockNotOwnedError, ReentrantLock
from celery_singleton_lock._lock import commands
from celery_singleton_lock._lock.keys import LockKeys
from celery_singleton_lock._lock.runtime import LockRuntime
from celery_singleton_lock._lock.scripts import ACQUIRE

FORK = multiprocessing.get_context("fork")
#: a push wake-up takes well under a millisecond; this bound leaves room for a loaded machine
#: and is still far below the leases of these tests, which a missed push would cost
PROMPT = 0.5
#: scheduling allowance on top of a lease
SLACK = 0.5


def _pubsub_clients(client: Any) -> list[dict[str, Any]]:
    return list(client.client_list(_type="pubsub"))


def _subscribers(client: Any, channel: str) -> int:
    return int(dict(client.pubsub_numsub(channel))[channel.encode()])


def _await_waiters(client: Any, key: str, count: int = 1) -> None:
    """Wait until ``count`` threads of this process wait for the lock ``key`` on the process's
    subscription to that lock's channel, and that subscription is live on the server."""
    hub = LockRuntime.of(client).hub
    channel = key + ":wake"

    def waiting() -> int:
        sub = hub.subscriptions.get(channel)
        return 0 if sub is None else sub.waiters

    def asleep() -> int:
        sub = hub.subscriptions.get(channel)
        return 0 if sub is None else sub.sleeping

    wait_until(lambda: waiting() == count, 5)
    wait_until(lambda: _subscribers(client, channel) == 1, 5)
    # A registered waiter tries once more before it waits (a release in between is seen by
    # that try, or pushed): the tests below meet it in its wait, asleep.
    wait_until(lambda: asleep() == count, 5, f"{count} waiter(s) asleep")


# -- the overlap checker -------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_no_two_processes_ever_hold_the_lock_at_once(redis_client: Any, redis_server: Any) -> None:
    processes, rounds, name = 16, 50, "overlap"
    barrier = FORK.Barrier(processes)
    results = FORK.Queue()
    workers = [
        FORK.Process(
            target=overlap_worker,
            args=(redis_server.port, name, rounds, 1.0, barrier, results),
            daemon=True,
        )
        for _ in range(processes)
    ]
    for worker in workers:
        worker.start()
    reports = [results.get(timeout=150) for _ in workers]
    for worker in workers:
        worker.join(30)
        assert worker.exitcode == 0

    assert [error for _, _, error in reports if error] == []
    assert len({pid for pid, _, _ in reports}) == processes
    # every process got the lock, every time it asked
    assert sorted(len(intervals) for _, intervals, _ in reports) == [rounds] * processes

    holds = [
        (start, end, fence, pid) for pid, intervals, _ in reports for start, end, fence in intervals
    ]
    overlaps = [
        (a, b)
        for a, b in itertools.combinations(holds, 2)
        if a[0] < b[1] and b[0] < a[1]  # the intervals intersect
    ]
    assert overlaps == [], f"{len(overlaps)} overlapping holds, e.g. {overlaps[:3]}"
    # fencing tokens grow with every new holder, in the order the holds happened
    by_start = sorted(holds)
    assert all(a[2] < b[2] for a, b in itertools.pairwise(by_start))
    # and no read-modify-write inside the lock was lost
    assert int(redis_client.get(f"counter:{{{name}}}")) == processes * rounds
    assert redis_client.exists(f"lock:{{{name}}}") == 0


def test_overlap_checker_can_see_an_overlap() -> None:
    # The check above is only worth something if it fails on overlapping holds.
    holds = [(0.0, 1.0, 1, 1), (0.5, 1.5, 2, 2)]
    assert [(a, b) for a, b in itertools.combinations(holds, 2) if a[0] < b[1] and b[0] < a[1]]


# -- exactly one winner --------------------------------------------------------------------


def _contend(lock: ReentrantLock, barrier: threading.Barrier, outcomes: list[Any]) -> None:
    barrier.wait(10)
    got = lock.acquire(blocking=False)
    outcomes.append((got, lock.hold_count))  # list.append is atomic
    barrier.wait(10)  # the winner holds it until everyone has tried
    if got:
        lock.release()


def test_exactly_one_thread_wins(redis_client: Any) -> None:
    threads = 16
    for round_ in range(20):
        lock = ReentrantLock(redis_client, f"race-{round_}", ttl=10)
        barrier = threading.Barrier(threads)
        outcomes: list[Any] = []
        runners = [
            threading.Thread(target=_contend, args=(lock, barrier, outcomes))
            for _ in range(threads)
        ]
        for runner in runners:
            runner.start()
        for runner in runners:
            runner.join(20)
        assert len(outcomes) == threads
        assert sorted(outcomes) == [(False, 0)] * (threads - 1) + [(True, 1)], round_
        assert redis_client.exists(lock.key) == 0


def test_exactly_one_process_wins(redis_client: Any, redis_server: Any) -> None:
    processes = 16
    barrier = FORK.Barrier(processes)
    results = FORK.Queue()
    workers = [
        FORK.Process(
            target=try_once_worker,
            args=(redis_server.port, "race-p", barrier, results),
            daemon=True,
        )
        for _ in range(processes)
    ]
    for worker in workers:
        worker.start()
    outcomes = [results.get(timeout=60) for _ in workers]
    for worker in workers:
        worker.join(30)
    assert sum(got for _, got in outcomes) == 1
    winner = next(pid for pid, got in outcomes if got)
    holders = list(redis_client.hkeys("lock:{race-p}"))
    assert len(holders) == 1 and f":{winner}:".encode() in holders[0]


# -- push wake-up --------------------------------------------------------------------------


def test_release_wakes_waiters_promptly_and_they_share_one_subscription_per_lock(
    redis_client: Any,
) -> None:
    prefix = "push"
    lease = 5.0  # a waiter that missed the push would wait about this long
    holder = ReentrantLock(redis_client, "handoff", ttl=lease, owner="holder", prefix=prefix)
    other = ReentrantLock(redis_client, "other", ttl=lease, owner="holder", prefix=prefix)
    assert holder.acquire() and other.acquire()
    got_at: dict[str, float] = {}
    order: list[str] = []
    done = threading.Event()

    def take_in_turn(lock_name: str, tag: str) -> None:
        lock = ReentrantLock(redis_client, lock_name, ttl=lease, prefix=prefix)
        assert lock.acquire(timeout=30)
        got_at[tag] = time.monotonic()
        order.append(tag)
        done.wait(0.02 if lock_name == "handoff" else 0)
        lock.release()

    waiters = [threading.Thread(target=take_in_turn, args=("handoff", f"w{i}")) for i in range(4)]
    waiters.append(threading.Thread(target=take_in_turn, args=("other", "o")))
    for waiter in waiters:
        waiter.start()

    # Five threads wait, on two locks: the process has one subscription to each lock's channel.
    _await_waiters(redis_client, holder.key, 4)
    _await_waiters(redis_client, other.key, 1)
    assert _subscribers(redis_client, holder.key + ":wake") == 1
    assert _subscribers(redis_client, other.key + ":wake") == 1
    assert len(_pubsub_clients(redis_client)) == 2
    assert got_at == {}

    released_at = time.monotonic()
    holder.release()
    wait_until(lambda: len([t for t in got_at if t != "o"]) == 4, 5 * lease)
    other_released = time.monotonic()
    other.release()
    for waiter in waiters:
        waiter.join(10)
    assert len(got_at) == 5

    # The first waiter was woken by the push, well under the lease; each later waiter was
    # handed the lock the moment the one before released it.
    handoffs = sorted(t for tag, t in got_at.items() if tag != "o")
    assert handoffs[0] - released_at < PROMPT
    assert all(b - a < PROMPT for a, b in itertools.pairwise(handoffs)), handoffs
    assert got_at["o"] - other_released < PROMPT
    assert redis_client.exists(holder.key, other.key) == 0


def _wait_in_child(port: int, name: str, prefix: str, asleep: Any, results: Any) -> None:
    client = redis.Redis(port=port, socket_timeout=10)
    lock = ReentrantLock(client, name, ttl=5, prefix=prefix)
    hub = LockRuntime.of(client).hub

    def watch() -> None:
        """Tell the parent once this process's waiter sleeps in its wait."""
        channel = lock.key + ":wake"
        wait_until(lambda: getattr(hub.subscriptions.get(channel), "sleeping", 0) >= 1, 20)
        asleep.set()

    threading.Thread(target=watch, daemon=True).start()
    ok = lock.acquire(timeout=30)
    results.put((ok, time.monotonic()))
    lock.release()


def test_release_wakes_a_waiter_in_another_process(redis_client: Any, redis_server: Any) -> None:
    prefix = "xproc"
    holder = ReentrantLock(redis_client, "handoff", ttl=5, owner="holder", prefix=prefix)
    assert holder.acquire()
    asleep, results = FORK.Event(), FORK.Queue()
    child = FORK.Process(
        target=_wait_in_child,
        args=(redis_server.port, "handoff", prefix, asleep, results),
        daemon=True,
    )
    child.start()
    assert asleep.wait(20), "the child's waiter never slept in its wait"
    assert _subscribers(redis_client, holder.key + ":wake") == 1
    released = time.monotonic()
    holder.release()
    ok, got = results.get(timeout=20)
    child.join(10)
    assert ok and got - released < PROMPT


# -- lost wake-ups -------------------------------------------------------------------------


def _blocked_waiter(lock: ReentrantLock, got: dict[str, float]) -> threading.Thread:
    def run() -> None:
        if lock.acquire(timeout=20):
            got["at"] = time.monotonic()
            lock.release()

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def test_a_deleted_lock_wakes_its_waiter_within_one_lease(redis_client: Any) -> None:
    lease = 1.0
    holder = ReentrantLock(redis_client, "deleted", ttl=lease, owner="holder", prefix="sup")
    waiter_lock = ReentrantLock(redis_client, "deleted", ttl=lease, prefix="sup")
    assert holder.acquire()
    got: dict[str, float] = {}
    thread = _blocked_waiter(waiter_lock, got)
    _await_waiters(redis_client, holder.key)

    deleted = time.monotonic()
    assert redis_client.delete(holder.key) == 1  # gone, and nobody published it
    thread.join(5 * lease)
    assert "at" in got
    assert got["at"] - deleted <= lease + SLACK
    assert holder.lost.wait(lease)


def test_a_killed_subscription_still_wakes_the_waiter_and_recovers(redis_client: Any) -> None:
    lease = 2.0
    prefix = "killed"
    holder = ReentrantLock(redis_client, "k", ttl=lease, owner="holder", prefix=prefix)
    waiter_lock = ReentrantLock(redis_client, "k", ttl=lease, prefix=prefix)
    assert holder.acquire()
    got: dict[str, float] = {}
    thread = _blocked_waiter(waiter_lock, got)
    _await_waiters(redis_client, holder.key)

    # Kill the subscription and release at once: the publish may find no subscriber.
    killed = time.monotonic()
    assert redis_client.client_kill_filter(_type="pubsub") >= 1
    holder.release()
    thread.join(5 * lease)
    assert "at" in got and got["at"] - killed <= lease + SLACK

    # The next wait subscribes again, and push wake-ups are prompt again.
    assert holder.acquire()
    got.clear()
    thread = _blocked_waiter(waiter_lock, got)
    _await_waiters(redis_client, holder.key)
    released = time.monotonic()
    holder.release()
    thread.join(5 * lease)
    assert "at" in got and got["at"] - released < PROMPT


def test_an_operators_force_release_wakes_waiters_and_the_holder_learns_it_lost(
    redis_client: Any,
) -> None:
    lease = 2.0
    holder = ReentrantLock(redis_client, "forced", ttl=lease, owner="holder", prefix="ops")
    waiter_lock = ReentrantLock(redis_client, "forced", ttl=lease, prefix="ops")
    assert holder.acquire()
    fence = holder.fence
    got: dict[str, float] = {}
    thread = _blocked_waiter(waiter_lock, got)
    _await_waiters(redis_client, holder.key)
    forced = time.monotonic()
    keys = LockKeys.for_name("ops", "forced")
    assert commands.force_release(redis_client, keys, holder="someone-else") is False
    assert commands.force_release(redis_client, keys, holder="holder") is True
    thread.join(5 * lease)
    assert "at" in got and got["at"] - forced < PROMPT  # the release was pushed
    assert holder.lost.wait(lease)  # the heartbeat found it gone
    with pytest.raises(LockLostError):
        holder.ensure_held()
    with pytest.raises(LockNotOwnedError):
        holder.release()
    assert waiter_lock.acquire(blocking=False)
    assert waiter_lock.fence is not None and fence is not None and waiter_lock.fence > fence
    waiter_lock.release()


# -- per-lock wake-up channels -------------------------------------------------------------


def test_a_waiter_hears_nothing_of_other_locks_and_nothing_is_subscribed_after(
    redis_client: Any,
) -> None:
    """Releases of lock B send no message to a process that waits only for lock A; once the
    wait ends, the process is subscribed to nothing."""
    prefix = "iso"
    a = ReentrantLock(redis_client, "a", ttl=5, owner="holder", prefix=prefix)
    b = ReentrantLock(redis_client, "b", ttl=5, owner="other", prefix=prefix)
    assert a.acquire()
    got: dict[str, float] = {}
    received = count_wakeups(redis_client)
    thread = _blocked_waiter(ReentrantLock(redis_client, "a", ttl=5, prefix=prefix), got)
    _await_waiters(redis_client, a.key)
    hub = LockRuntime.of(redis_client).hub
    for _ in range(200):
        assert b.acquire()
        b.release()
    # Nobody subscribes to B's channel, and this process's one pub/sub connection to A's
    # channel alone: no message of B's releases (all run by now) reached it, or will.
    assert _subscribers(redis_client, b.key + ":wake") == 0
    assert [(c["sub"], c["psub"]) for c in _pubsub_clients(redis_client)] == [("1", "0")]
    assert received[0] == 0  # not one delivery for B's 200 releases
    assert "at" not in got
    released = time.monotonic()
    a.release()
    thread.join(10)
    assert "at" in got and got["at"] - released < PROMPT
    assert received[0] == 1
    # the wait is over: no channel of this process is subscribed any more (the UNSUBSCRIBE
    # goes from the heartbeat lane, a moment after the waiter returned)
    assert hub.subscriptions == {}
    wait_until(lambda: redis_client.pubsub_channels(f"{prefix}:*") == [], 2)


class _CountingRedis(redis.Redis):
    """Counts the acquire script calls (a subclass: the lock sends through execute_command)."""

    acquires = 0

    def execute_command(self, *args: Any, **options: Any) -> Any:
        if args[0] == "EVALSHA" and args[1] == ACQUIRE.sha:
            type(self).acquires += 1
        return super().execute_command(*args, **options)  # type: ignore[no-untyped-call]  # redis-py: unannotated


def test_a_blocked_wait_on_a_contended_lock_sends_one_refused_acquire(
    redis_server: Any,
) -> None:
    client = _CountingRedis(port=redis_server.port, socket_timeout=5)
    prefix = "once"
    holder = ReentrantLock(client, "c", ttl=5, owner="holder", prefix=prefix)

    def blocked_wait_acquires() -> int:
        assert holder.acquire()
        got: dict[str, float] = {}
        start = _CountingRedis.acquires
        thread = _blocked_waiter(ReentrantLock(client, "c", ttl=5, prefix=prefix), got)
        _await_waiters(client, holder.key)
        refused = _CountingRedis.acquires - start
        holder.release()
        thread.join(10)
        assert "at" in got
        return refused

    # The first time: a try, the subscription, a second try (a release between the first try
    # and the subscription must not go unseen). Once the process knows the lock is contended,
    # it subscribes first: one refused try.
    assert blocked_wait_acquires() == 2
    assert blocked_wait_acquires() == 1
