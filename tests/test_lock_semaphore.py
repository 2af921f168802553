"""Semaphore on a real Redis: N holders of one name at once and the next one refused, re-entry in
the process and through Redis (another process of the same owner), run tokens, a blocked acquire
woken by any permit's release, release_all and park, a holder SIGKILLed or paused past its lease,
bad ``permits``, the permit keys found by ``LockSpace.find``, and one hash tag for every key."""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
import redis
from lock_helpers import hold_counts, wait_until, wake_subscribers
from redis.backoff import NoBackoff
from redis.crc import key_slot
from redis.retry import Retry

from celery_singleton_lock import (
    LockBackendError,
    LockLostError,
    LockNotOwnedError,
    LockSpace,
    LockTimeoutError,
    ReentrantLock,
    Semaphore,
)
from celery_singleton_lock._lock.runtime import LockRuntime
from celery_singleton_lock.lock import LockKeys
from celery_singleton_lock.testing import RedisServer

FORK = multiprocessing.get_context("fork")


def _permit_of(key: str) -> int:
    """The permit number of a semaphore's lock key (``...}`` is 1, ``...}:s<k>`` is k)."""
    return LockKeys.from_lock_key(key).slot


# -- N holders at once ---------------------------------------------------------------------


def test_n_owners_hold_at_once_and_the_next_is_refused_by_the_first_to_free(
    redis_client: Any,
) -> None:
    # Unrenewed leases of 10, 20 and 30 s: the permit that frees first is the 10 s one.
    leases = {"a": 20.0, "b": 10.0, "c": 30.0}
    holders = {
        o: Semaphore(redis_client, "pool", 3, ttl=t, owner=o, renew=False)
        for o, t in leases.items()
    }
    for sem in holders.values():
        reply = sem.try_acquire()
        assert reply.acquired and reply.hold_count == 1 and reply.fence is not None
    assert sorted(_permit_of(sem.key) for sem in holders.values()) == [1, 2, 3]
    assert holders["a"].holders() == {"a": 1, "b": 1, "c": 1}

    late = Semaphore(redis_client, "pool", 3, ttl=30, owner="late")
    refused = late.try_acquire()
    assert not refused.acquired and not refused.other_run
    assert refused.holder == "b"
    assert 9 < refused.lease_left <= 10
    assert late.acquire(blocking=False) is False
    assert late.held is None and late.hold_count == 0 and late.fence is None
    assert late.key == holders["b"].key  # no permit held: the key of the refusal's holder
    # Nothing of the refused owner was written into any permit.
    states = LockSpace(redis_client).named("pool", 3).inspect()
    assert [set(s.owners) for s in states] == [{h} for h in _holders_by_permit(holders)]

    freed = holders["b"].key
    holders["b"].release()
    assert late.acquire(blocking=False)
    assert late.key == freed  # the one free permit
    for owner in ("a", "c"):
        holders[owner].release()
    late.release()
    assert all(redis_client.exists(k.lock) == 0 for k in _keys("pool", 3))


def _holders_by_permit(holders: dict[str, Semaphore]) -> list[str]:
    by_permit = {_permit_of(sem.key): owner for owner, sem in holders.items()}
    return [by_permit[k] for k in sorted(by_permit)]


def _keys(name: str, permits: int) -> list[LockKeys]:
    return [LockKeys.for_name("lock", name, k) for k in range(1, permits + 1)]


def test_many_threads_never_hold_more_than_n_permits(redis_client: Any) -> None:
    sem_permits, threads_n, rounds = 3, 8, 15
    inside: list[str] = []
    most = [0]
    guard = threading.Lock()
    errors: list[BaseException] = []

    def work() -> None:
        sem = Semaphore(redis_client, "busy", sem_permits, ttl=10)
        try:
            for _ in range(rounds):
                with sem:
                    with guard:
                        inside.append(sem.owner)
                        most[0] = max(most[0], len(inside))
                        assert len(inside) <= sem_permits
                    assert len(sem.holders()) <= sem_permits
                    with guard:
                        inside.remove(sem.owner)
        except BaseException as exc:  # reported to the test thread
            errors.append(exc)

    workers = [threading.Thread(target=work) for _ in range(threads_n)]
    for thread in workers:
        thread.start()
    for thread in workers:
        thread.join(60)
    assert errors == [] and not any(t.is_alive() for t in workers)
    assert most[0] <= sem_permits
    assert all(redis_client.exists(k.lock) == 0 for k in _keys("busy", sem_permits))


def test_one_permit_is_exactly_a_reentrant_lock(redis_client: Any) -> None:
    sem = Semaphore(redis_client, "single", 1, ttl=10, owner="me")
    lock = ReentrantLock(redis_client, "single", ttl=10, owner="me")
    assert sem.key == lock.key == "lock:{single}"
    assert sem.acquire() and lock.acquire()  # one hold, shared in this process
    assert sem.held is not None and sem.held.key == lock.key
    assert sem.hold_count == lock.hold_count == 2 and sem.fence == lock.fence
    assert hold_counts(redis_client, lock.key) == {"me": 1}
    other = Semaphore(redis_client, "single", 1, ttl=10, owner="other")
    assert other.try_acquire().holder == "me"
    sem.release()
    lock.release()
    assert redis_client.exists(lock.key) == 0


# -- re-entry ------------------------------------------------------------------------------


def test_reentry_in_the_process_costs_no_permit_and_no_round_trip(redis_client: Any) -> None:
    # Unrenewed: no renewal may reach the server while it is counted.
    sem = Semaphore(redis_client, "nest", 2, ttl=10, owner="me", renew=False)
    assert sem.acquire()
    key, fence = sem.key, sem.fence
    stats = redis_client.info("commandstats")
    before = sum(int(v["calls"]) for v in stats.values())
    reply = sem.try_acquire()
    stats = redis_client.info("commandstats")
    after = sum(int(v["calls"]) for v in stats.values())
    assert after - before == 1  # the first INFO itself: the re-entry sent nothing
    assert reply.acquired and reply.hold_count == 2 and reply.fence == fence
    assert sem.key == key and sem.hold_count == 2
    assert sem.holders() == {"me": 1}  # nesting in one process is counted here
    sem.release()
    assert sem.hold_count == 1 and redis_client.exists(key) == 1
    sem.release()
    assert sem.hold_count == 0 and redis_client.exists(key) == 0
    with pytest.raises(LockNotOwnedError):
        sem.release()


@pytest.mark.parametrize("name", [f"cross-{i}" for i in range(6)])
def test_the_same_owner_in_another_process_reenters_its_permit(
    redis_client: Any, name: str
) -> None:
    # A publisher took a permit for the task in Redis only (space.take); the run, acting as the
    # same owner, must re-enter that permit rather than take one of the two free ones (which a
    # random start picks two times in three).
    space = LockSpace(redis_client)
    taken = space.named(name, 3).take("task-1", 30)
    assert taken.acquired and taken.hold_count == 1
    [held_key] = [k.lock for k in _keys(name, 3) if redis_client.hexists(k.lock, "task-1")]

    run = Semaphore(redis_client, name, 3, ttl=30, owner="task-1")
    reply = run.try_acquire()
    assert reply.acquired and reply.hold_count == 2 and reply.fence == taken.fence
    assert run.key == held_key
    assert run.holders() == {"task-1": 2}
    # ... and LockSpace.take follows the same rule
    assert space.named(name, 3).take("task-1", 30).hold_count == 3
    assert run.holders() == {"task-1": 3}
    assert run.release_all().owned
    assert run.holders() == {}


def test_another_run_of_the_holding_owner_is_refused_and_takes_no_other_permit(
    redis_server: RedisServer,
) -> None:
    # Two clients stand for two processes (each client has its own holds).
    first, second = redis_server.client(), redis_server.client()
    first.flushdb()
    run1 = Semaphore(first, "runs", 3, ttl=30, owner="job", run_token="r1")
    run2 = Semaphore(second, "runs", 3, ttl=30, owner="job", run_token="r2")
    assert run1.acquire(blocking=False)
    refused = run2.try_acquire()
    assert not refused.acquired and refused.other_run and refused.holder == "job"
    assert refused.lease_left > 0
    assert run2.holders() == {"job": 1}  # no second permit for the same owner
    # A blocking wait for it ends at its timeout, still without a second permit.
    started = time.monotonic()
    assert run2.acquire(timeout=0.3) is False
    assert 0.3 <= time.monotonic() - started < 2.0
    assert run2.holders() == {"job": 1}
    # The owner without a run token (a publisher's hold) may always re-enter.
    assert LockSpace(second).named("runs", 3).take("job", 30).hold_count == 2
    assert run1.release_all().freed  # the first run is over
    assert run2.acquire(blocking=False)
    assert run2.holders() == {"job": 1}
    run2.release()
    assert run2.holders() == {}


def test_another_run_of_the_holding_owner_in_the_same_process_is_refused(
    redis_client: Any,
) -> None:
    """One client is one process: a thread pool's worker that gets a message again while its
    first run lives in another thread must be refused too (it re-entered in the process)."""
    for make in (
        lambda token: ReentrantLock(redis_client, "one", ttl=30, owner="job", run_token=token),
        lambda token: Semaphore(redis_client, "runs", 2, ttl=30, owner="job", run_token=token),
    ):
        first, again, same = make("r1"), make("r2"), make("r1")
        assert first.acquire(blocking=False)
        refused = again.try_acquire()
        assert not refused.acquired and refused.other_run and refused.holder == "job"
        assert refused.lease_left > 0
        assert again.acquire(timeout=0.2) is False
        assert same.acquire(blocking=False)  # the same run nests as before
        same.release()
        assert first.release_all().freed
        assert again.acquire(blocking=False)  # the first run is over
        again.release()


# -- waiting -------------------------------------------------------------------------------


def test_a_blocked_acquire_is_woken_by_the_release_of_another_permit(redis_client: Any) -> None:
    lease = 30.0
    holders = [Semaphore(redis_client, "wake", 2, ttl=lease, owner=f"h{i}") for i in range(2)]
    assert all(sem.acquire(blocking=False) for sem in holders)
    # The release comes from permit 2: its own key, but permit 1's channel.
    releaser = next(sem for sem in holders if _permit_of(sem.key) == 2)
    waiter = Semaphore(redis_client, "wake", 2, ttl=lease, owner="waiter")
    got: dict[str, Any] = {}

    def wait() -> None:
        got["acquired"] = waiter.acquire(timeout=20)
        got["at"] = time.monotonic()
        got["key"] = waiter.key
        waiter.release()

    thread = threading.Thread(target=wait)
    thread.start()
    # Asleep on the subscription, after the look that follows subscribing: only a wake-up
    # (or the end of a 30 s lease) gets it out now.
    hub = LockRuntime.of(redis_client).hub
    sub = wait_until(lambda: hub.subscriptions.get("lock:{wake}:wake"), 5, "the subscription")
    wait_until(lambda: sub.sleeping >= 1, 5, "the waiter asleep")
    assert "at" not in got
    released_key = releaser.key
    released = time.monotonic()
    releaser.release()
    thread.join(10)
    assert got["acquired"] is True
    assert got["at"] - released < 2.0  # pushed: long before a 30 s lease could have ended
    assert got["key"] == released_key
    # The waiter left the channel when it was done.
    wait_until(lambda: wake_subscribers(redis_client, "lock:{wake}") == 0, 5, "unsubscribe")
    next(sem for sem in holders if sem is not releaser).release()


def test_with_semaphore_times_out_and_never_enters(redis_client: Any) -> None:
    holder = Semaphore(redis_client, "full", 2, ttl=30, owner="a")
    other = Semaphore(redis_client, "full", 2, ttl=30, owner="b")
    assert holder.acquire() and other.acquire()
    late = Semaphore(redis_client, "full", 2, ttl=30, timeout=0.3)
    entered = False
    with pytest.raises(LockTimeoutError) as info, late:
        entered = True
    assert not entered and info.value.name == "full" and info.value.timeout == 0.3
    freed = holder.key
    holder.release()
    with late:
        assert late.hold_count == 1 and late.key == freed
    other.release()


# -- release_all, park ---------------------------------------------------------------------


def test_release_all_drops_the_holds_here_and_in_redis(redis_server: RedisServer) -> None:
    client, elsewhere = redis_server.client(), redis_server.client()
    client.flushdb()
    sem = Semaphore(client, "all", 3, ttl=30, owner="job")
    assert sem.acquire() and sem.acquire()
    LockSpace(client).named("all", 3).take("job", 30)  # another process's hold
    assert sem.holders() == {"job": 2} and sem.hold_count == 2
    reply = sem.release_all()
    assert reply.owned and reply.freed
    assert sem.hold_count == 0 and sem.holders() == {}
    assert not sem.release_all().owned  # nothing left

    # From a process that holds nothing itself: the owner's permit is found in Redis.
    assert LockSpace(client).named("all", 3).take("job", 30).acquired
    assert Semaphore(elsewhere, "all", 3, ttl=30, owner="job").release_all().owned
    assert sem.holders() == {}


def test_park_keeps_the_permit_for_a_later_run_of_the_owner(redis_server: RedisServer) -> None:
    client, later = redis_server.client(), redis_server.client()
    client.flushdb()
    sem = Semaphore(client, "parked", 2, ttl=30, owner="job", run_token="run-1")
    assert sem.acquire()
    key = sem.key
    assert sem.park(5, info="parked")
    assert sem.hold_count == 0
    state = LockSpace(client).inspect(key)  # by the permit's key
    assert state.owners == {"job": 1} and state.run_token == "" and state.info == "parked"
    assert state.lease_left is not None and 0 < state.lease_left <= 5
    # The next run (another run token, another process) re-enters the parked permit.
    retry = Semaphore(later, "parked", 2, ttl=30, owner="job", run_token="run-2")
    assert retry.try_acquire().hold_count == 2
    assert retry.key == key
    assert not Semaphore(client, "parked", 2, ttl=30, owner="nobody").park(5)
    space = LockSpace(client)
    assert space.named("parked", 2).park("job", 5)
    assert not space.named("parked", 2).park("nobody", 5)
    assert space.named("parked", 2).release("job").freed
    assert not space.named("parked", 2).release("job").owned
    assert client.exists(key) == 0


def test_a_release_that_cannot_find_the_permit_goes_to_every_permit(
    make_redis_server: Any,
) -> None:
    server = make_redis_server()
    client = redis.Redis(
        port=server.port,
        socket_timeout=0.2,
        socket_connect_timeout=0.2,
        retry=Retry(NoBackoff(), 0),
    )
    space = LockSpace(client, backend_timeout=0.5)
    assert space.named("lost-reply", 3).take("pub", 30).acquired
    os.kill(server.process.pid, signal.SIGSTOP)
    try:
        with pytest.raises(LockBackendError):
            space.named("lost-reply", 3).release("pub", retry_for=30)
    finally:
        os.kill(server.process.pid, signal.SIGCONT)
    # Sent again from the client's lane until Redis answers: the permit comes free.
    direct = server.client()
    wait_until(
        lambda: all(direct.exists(k.lock) == 0 for k in _keys("lost-reply", 3)), 10, "the release"
    )


# -- holders that die or stop --------------------------------------------------------------


def _hold_permit(port: int, name: str, ttl: float, report: Any, go_on: Any) -> None:
    """Hold a permit of ``name`` (renewed), report its key and fence, wait for ``go_on`` (the
    test kills or stops this process meanwhile), then report ``lost`` and ``ensure_held``."""
    client = redis.Redis(port=port, socket_timeout=10)
    sem = Semaphore(client, name, 2, ttl=ttl, owner="paused-or-killed")
    assert sem.acquire(timeout=10)
    report.put((sem.key, sem.fence))
    go_on.wait(60)
    try:
        sem.ensure_held()
        ensured = "held"
    except LockLostError:
        ensured = "lost"
    report.put((sem.lost.is_set(), ensured))


def _start_holder(port: int, name: str, ttl: float) -> tuple[Any, Any, Any, str, int]:
    report, go_on = FORK.Queue(), FORK.Event()
    process = FORK.Process(target=_hold_permit, args=(port, name, ttl, report, go_on), daemon=True)
    process.start()
    key, fence = report.get(timeout=20)
    return process, report, go_on, key, fence


def _wait_for_renewal(client: Any, key: str) -> None:
    """Wait until the lease of ``key`` goes up again: its holder renewed it."""
    lowest = [int(client.pttl(key))]

    def renewed() -> bool:
        now = int(client.pttl(key))
        lowest[0] = min(lowest[0], now)
        return now > lowest[0] + 50

    wait_until(renewed, 5, f"a renewal of {key}")


@pytest.mark.faults
def test_a_holder_killed_with_sigkill_frees_its_permit_within_a_lease(
    redis_client: Any, redis_server: RedisServer
) -> None:
    lease = 1.0
    keeper = Semaphore(redis_client, "killed", 2, ttl=30, owner="keeper")
    assert keeper.acquire()
    process, _, _, key, _ = _start_holder(redis_server.port, "killed", lease)
    try:
        assert key != keeper.key
        # The child's heartbeat renews it (its lease goes up again): renewing stops with it.
        _wait_for_renewal(redis_client, key)
        assert hold_counts(redis_client, key) == {"paused-or-killed": 1}
        waiter = Semaphore(redis_client, "killed", 2, ttl=lease, owner="next")
        got: dict[str, Any] = {}

        def wait() -> None:
            if waiter.acquire(timeout=10 * lease):
                got["at"], got["key"] = time.monotonic(), waiter.key
                waiter.release()

        thread = threading.Thread(target=wait)
        thread.start()
        wait_until(lambda: wake_subscribers(redis_client, "lock:{killed}") >= 1, 5, "the waiter")
        assert "at" not in got
        killed = time.monotonic()
    finally:
        assert process.pid is not None
        os.kill(process.pid, signal.SIGKILL)
    thread.join(10 * lease)
    process.join(5)
    assert process.exitcode == -signal.SIGKILL
    assert got["key"] == key  # the dead holder's permit, not the keeper's
    assert got["at"] - killed <= lease + 1.0
    keeper.release()


@pytest.mark.faults
def test_a_holder_paused_past_its_lease_loses_its_permit_and_knows_it(
    redis_client: Any, redis_server: RedisServer
) -> None:
    lease = 1.0
    keeper = Semaphore(redis_client, "paused", 2, ttl=30, owner="keeper")
    assert keeper.acquire()
    process, report, go_on, key, old_fence = _start_holder(redis_server.port, "paused", lease)
    assert process.pid is not None
    try:
        os.kill(process.pid, signal.SIGSTOP)
        contender = Semaphore(redis_client, "paused", 2, ttl=30, owner="contender", renew=False)
        started = time.monotonic()
        assert contender.acquire(timeout=10)
        assert 0.3 < time.monotonic() - started < 3.0  # at the paused holder's lease end
        assert contender.key == key
        assert contender.fence is not None and contender.fence > old_fence
        os.kill(process.pid, signal.SIGCONT)
        go_on.set()
        lost, ensured = report.get(timeout=20)
        assert lost is True and ensured == "lost"
        assert hold_counts(redis_client, key) == {"contender": 1}
        contender.release()
    finally:
        os.kill(process.pid, signal.SIGCONT)
        process.join(10)
        if process.is_alive():
            process.kill()
    keeper.release()


# -- bad input, keys -----------------------------------------------------------------------


BAD_PERMITS: list[tuple[object, type[Exception]]] = [
    (0, ValueError),
    (-1, ValueError),
    (True, TypeError),
    (2.5, TypeError),
    ("3", TypeError),
]


def _calls_with_permits(client: Any, space: LockSpace, bad: Any) -> list[Callable[[], object]]:
    return [
        lambda: Semaphore(client, "bad", bad, ttl=10),
        lambda: space.semaphore("bad", bad, ttl=10),
        lambda: space.named("bad", bad).take("o", 10),
        lambda: space.named("bad", bad).release("o"),
        lambda: space.named("bad", bad).park("o", 10),
        lambda: space.named("bad", bad).inspect(),
    ]


def test_bad_permits_are_refused_before_anything_reaches_redis(make_redis_server: Any) -> None:
    # A server of its own: nothing but this test sends it commands.
    client = make_redis_server().client()
    space = LockSpace(client)
    before = client.info("commandstats")
    for permits, error in BAD_PERMITS:
        for call in _calls_with_permits(client, space, permits):
            with pytest.raises(error, match="permits"):
                call()
    after = client.info("commandstats")
    # Only the first INFO ran in between: no script, no read, no write.
    assert {k for k in after if after[k] != before.get(k)} == {"cmdstat_info"}
    assert client.dbsize() == 0


def test_find_lists_every_permit_and_inspect_and_force_release_take_its_key(
    redis_client: Any,
) -> None:
    # A 3 s lease: the heartbeat looks at each hold every second.
    sems = [Semaphore(redis_client, "jobs", 3, ttl=3, owner=f"o{i}") for i in range(3)]
    assert all(sem.acquire() for sem in sems)
    plain = ReentrantLock(redis_client, "jobsx", ttl=30)
    assert plain.acquire()
    redis_client.hset("lock:{jobs}:last_run", "x", "1")  # a record hash: not a lock
    space = LockSpace(redis_client)
    found = sorted((k.name, k.slot) for k in space.find())
    assert found == [("jobs", 1), ("jobs", 2), ("jobs", 3), ("jobsx", 1)]
    assert sorted(k.lock for k in space.find("jobs")) == [k.lock for k in _keys("jobs", 3)]
    assert sorted(k.slot for k in space.find("j*s")) == [1, 2, 3]
    assert space.keys_of("lock:{jobs}:s3") == LockKeys.for_name("lock", "jobs", 3)
    permit3 = next(sem for sem in sems if sem.key == "lock:{jobs}:s3")
    assert space.inspect("lock:{jobs}:s3").holder == permit3.owner
    assert space.force_release("lock:{jobs}:s3")
    assert permit3.lost.wait(5)  # the heartbeat finds its lease gone
    with pytest.raises(LockLostError):
        permit3.ensure_held()
    assert sorted(k.slot for k in space.find("jobs")) == [1, 2]
    for sem in sems:
        if sem is not permit3:
            sem.release()
    plain.release()


@pytest.mark.parametrize("name", ["job", "}brace%", "a:b}:s2", "{x}"])
def test_every_key_of_every_permit_is_in_one_cluster_slot(name: str) -> None:
    keys = [LockKeys.for_name("lock", name, k) for k in range(1, 6)]
    every = [key for k in keys for key in (k.lock, k.meta, k.channel, k.records("last_run"))]
    assert len({key_slot(key.encode()) for key in every}) == 1
    assert {k.channel for k in keys} == {keys[0].channel}  # one wake-up channel per name
    assert len({k.lock for k in keys}) == len({k.meta for k in keys}) == 5
    for k in keys:
        assert LockKeys.from_lock_key(k.lock) == k
    for not_a_lock in (keys[1].meta, keys[0].lock + ":s1", keys[0].lock + ":s02", keys[0].meta):
        with pytest.raises(ValueError):
            LockKeys.from_lock_key(not_a_lock)
