"""ReentrantLock on one real Redis: hold counts and re-entry, owner-checked release, fencing
tokens, bounded keys, idempotent acquire (and the redis-py retry that makes it necessary),
bad input and the NOSCRIPT fallback."""

from __future__ import annotations

import itertools
import multiprocessing
import threading
import time
from typing import Any

import pytest
import redis
from lock_helpers import (
    command_calls,
    counting_client,
    debug_command_args,
    held_fence,
    hold_counts,
    wait_until,
)
from redis.backoff import ConstantBackoff, NoBackoff
from redis.retry import Retry

from celery_singleton_lock import LockLostError, LockNotOwnedError, LockSpace, ReentrantLock
from celery_singleton_lock._lock import commands
from celery_singleton_lock._lock import scripts as _scripts
from celery_singleton_lock._lock.commands import ReleaseReply
from celery_singleton_lock._lock.keys import LockKeys
from celery_singleton_lock.beat import record_if_held, records

FORK = multiprocessing.get_context("fork")


def _scripts_run(client: Any, before: dict[str, int]) -> int:
    """EVALSHA calls the server ran since ``before`` (INFO commandstats)."""
    return command_calls(client).get("evalsha", 0) - before.get("evalsha", 0)


# -- hold counts ---------------------------------------------------------------------------


def test_nested_reentry_counts_locally_with_no_round_trip(make_redis_server: Any) -> None:
    # A server of its own: nothing but this test sends it commands, so the counts are exact.
    # Counted twice: EVALSHA calls on the server, and every write to the socket on the client.
    server = make_redis_server()
    admin = server.client()
    client = counting_client(server.port)
    with ReentrantLock(client, "warm-up", ttl=30):  # connects and loads the scripts
        pass
    lock = ReentrantLock(client, "nested", ttl=30)

    before, sent = command_calls(admin), client.round_trips[0]
    assert lock.acquire()
    assert lock.acquire()
    assert lock.acquire(blocking=False)
    with lock:
        assert lock.hold_count == 4
    assert lock.hold_count == 3
    assert _scripts_run(admin, before) == 1
    assert client.round_trips[0] - sent == 1
    assert hold_counts(admin, lock.key) == {lock.owner: 1}

    before, sent = command_calls(admin), client.round_trips[0]
    lock.release()
    lock.release()
    assert lock.hold_count == 1
    assert _scripts_run(admin, before) == 0
    assert client.round_trips[0] - sent == 0
    assert admin.exists(lock.key) == 1

    before, sent = command_calls(admin), client.round_trips[0]
    lock.release()
    assert _scripts_run(admin, before) == 1
    assert client.round_trips[0] - sent == 1
    assert lock.hold_count == 0
    assert admin.exists(lock.key) == 0
    with pytest.raises(LockNotOwnedError):
        lock.release()


def _reenter_in_child(port: int, name: str, owner: str, results: Any) -> None:
    client = redis.Redis(port=port, socket_timeout=10)
    lock = ReentrantLock(client, name, ttl=30, owner=owner)
    got = lock.acquire(blocking=False)
    in_redis = hold_counts(client, lock.key)
    fence = lock.fence
    local = lock.hold_count
    lock.release()
    results.put((got, local, in_redis, fence, hold_counts(client, lock.key)))


def test_same_owner_in_another_process_reenters_through_redis(
    redis_client: Any, redis_server: Any
) -> None:
    lock = ReentrantLock(redis_client, "cross-process", ttl=30, owner="task-42")
    assert lock.acquire(blocking=False)
    results = FORK.Queue()
    child = FORK.Process(
        target=_reenter_in_child,
        args=(redis_server.port, "cross-process", "task-42", results),
        daemon=True,
    )
    child.start()
    got, local, in_redis, fence, after = results.get(timeout=30)
    child.join(30)
    assert child.exitcode == 0
    assert got is True
    assert local == 1  # the child's own hold
    assert in_redis == {"task-42": 2}  # the child's re-entry was counted in Redis
    assert fence == lock.fence  # same holder, same token
    assert after == {"task-42": 1}  # the child's release left the parent's hold
    assert lock.hold_count == 1
    lock.release()
    assert redis_client.exists(lock.key) == 0


def test_lock_objects_with_same_name_and_owner_share_one_hold(redis_client: Any) -> None:
    a = ReentrantLock(redis_client, "shared", ttl=30)
    b = ReentrantLock(redis_client, "shared", ttl=30)
    assert a.acquire()
    assert b.hold_count == 1 and b.fence == a.fence
    assert b.acquire(blocking=False)
    assert a.hold_count == 2
    assert hold_counts(redis_client, a.key) == {a.owner: 1}
    a.release()
    assert b.hold_count == 1
    b.release()
    assert a.hold_count == 0
    assert redis_client.exists(a.key) == 0


def test_other_threads_are_other_owners(redis_client: Any) -> None:
    lock = ReentrantLock(redis_client, "threads", ttl=30)
    assert lock.acquire()
    seen: dict[str, Any] = {}

    def other() -> None:
        seen["owner"] = lock.owner
        seen["count"] = lock.hold_count
        seen["got"] = lock.acquire(blocking=False)

    thread = threading.Thread(target=other)
    thread.start()
    thread.join(10)
    assert seen == {"owner": seen["owner"], "count": 0, "got": False}
    assert seen["owner"] != lock.owner
    assert lock.owned() and lock.locked()
    lock.release()
    assert not lock.owned() and not lock.locked()


def test_distinct_explicit_owners_exclude_each_other(redis_client: Any) -> None:
    a = ReentrantLock(redis_client, "owners", ttl=30, owner="a")
    b = ReentrantLock(redis_client, "owners", ttl=30, owner="b")
    assert a.acquire(blocking=False)
    assert not b.acquire(blocking=False)
    started = time.monotonic()
    assert not b.acquire(timeout=0.2)
    assert 0.2 <= time.monotonic() - started < 2.0
    a.release()
    assert b.acquire(blocking=False)
    b.release()


def test_a_reply_is_true_only_when_it_says_yes(redis_client: Any) -> None:
    """``if lock.try_acquire():`` reads as it should: a refused reply is false (a tuple of
    fields would be true), an acquired one true; a release reply is true when the owner held
    the lock."""
    a = ReentrantLock(redis_client, "replies", ttl=30, owner="a")
    b = ReentrantLock(redis_client, "replies", ttl=30, owner="b")
    taken = a.try_acquire()
    assert taken and taken.acquired
    refused = b.try_acquire()
    if refused:
        pytest.fail(f"a refused reply reads as true: {refused!r}")
    assert refused.holder == "a"
    assert not b.release_all()  # b never held it
    assert a.release_all()
    if b.try_acquire():
        b.release()
    else:
        pytest.fail("the free lock was not acquired")


# -- owner-checked release ----------------------------------------------------------------


def test_another_owner_cannot_release(redis_client: Any) -> None:
    holder = ReentrantLock(redis_client, "mine", ttl=30, owner="holder")
    intruder = ReentrantLock(redis_client, "mine", ttl=30, owner="intruder")
    assert holder.acquire()
    with pytest.raises(LockNotOwnedError, match="intruder"):
        intruder.release()
    # The Lua script checks the owner too, not only the local hold count.
    assert not commands.release(redis_client, LockKeys.for_name("lock", "mine"), "intruder").owned
    assert hold_counts(redis_client, holder.key) == {"holder": 1}
    holder.release()
    assert redis_client.exists(holder.key) == 0


def test_release_when_not_held_raises(redis_client: Any) -> None:
    lock = ReentrantLock(redis_client, "never", ttl=30)
    with pytest.raises(LockNotOwnedError):
        lock.release()
    assert lock.acquire()
    lock.release()
    with pytest.raises(LockNotOwnedError):
        lock.release()


def test_release_after_the_lease_was_lost_raises_and_sets_lost(redis_client: Any) -> None:
    lock = ReentrantLock(redis_client, "taken-away", ttl=30, renew=False)
    assert lock.acquire()
    redis_client.delete(lock.key)
    other = ReentrantLock(redis_client, "taken-away", ttl=30, owner="next")
    assert other.acquire(blocking=False)
    with pytest.raises(LockNotOwnedError, match="no longer held"):
        lock.release()
    assert lock.lost.is_set()
    assert hold_counts(redis_client, other.key) == {"next": 1}  # untouched
    other.release()


# -- fencing tokens ------------------------------------------------------------------------


def test_fence_increases_for_every_new_holder(redis_client: Any) -> None:
    a = ReentrantLock(redis_client, "fenced", ttl=30, owner="a")
    b = ReentrantLock(redis_client, "fenced", ttl=30, owner="b")
    keys = LockKeys.for_name("lock", "fenced")
    fences: list[int] = []

    assert a.fence is None
    assert a.acquire()
    fences.append(held_fence(a))
    assert a.acquire() and a.fence == fences[-1]  # re-entry is the same holder
    a.release()
    a.release()
    assert a.fence is None
    assert redis_client.exists(keys.lock) == 0  # the hash is gone; the token is not

    for lock in (b, a, b):  # new holders after the hash was deleted
        assert lock.acquire()
        fences.append(held_fence(lock))
        lock.release()

    assert a.acquire()  # an operator's force release: the next holder still gets more
    fences.append(held_fence(a))
    assert commands.force_release(redis_client, keys)
    assert b.acquire()
    fences.append(held_fence(b))
    b.release()
    with pytest.raises(LockNotOwnedError):
        a.release()

    # The meta hash (which keeps the last token) expired: the server clock carries on.
    redis_client.pexpire(keys.meta, 1)
    wait_until(lambda: redis_client.exists(keys.meta) == 0, 5)
    assert a.acquire()
    fences.append(held_fence(a))
    a.release()

    # A stored token ahead of the server clock still only grows.
    redis_client.hset(keys.meta, "fence", fences[-1] + 10**12)
    for lock in (b, a):
        assert lock.acquire()
        fences.append(held_fence(lock))
        lock.release()
    assert fences[-2:] == [fences[-3] + 10**12 + 1, fences[-3] + 10**12 + 2]

    assert all(isinstance(f, int) for f in fences)
    assert all(x < y for x, y in itertools.pairwise(fences)), fences


# -- bounded keys --------------------------------------------------------------------------


def test_keys_left_behind_are_bounded_and_all_expire(redis_client: Any) -> None:
    lock = ReentrantLock(redis_client, "user:0", ttl=10)
    assert lock.acquire()
    keys = LockKeys.for_name("lock", "user:0")
    assert 0 < redis_client.pttl(keys.lock) <= 10_000
    # (an acquire that writes the meta hash's TTL adds half a retention: see lua/acquire.lua)
    assert 0 < redis_client.pttl(keys.meta) <= 10_000 + _scripts.META_RETENTION_MS * 3 // 2
    lock.release()

    for i in range(2000):
        lock = ReentrantLock(redis_client, f"user:{i}", ttl=10)
        assert lock.acquire(blocking=False)
        lock.release()

    assert redis_client.dbsize() == 2000
    names = list(redis_client.scan_iter(count=1000))
    assert all(name.endswith(b"}:meta") for name in names)
    pipe = redis_client.pipeline(transaction=False)
    for name in names:
        pipe.pttl(name)
    ttls = pipe.execute()
    # the meta hash outlives the lease the last acquire set (10 s) by the retention, plus at
    # most half a retention
    assert all(0 < ttl <= 10_000 + 90_000 for ttl in ttls), sorted(set(ttls))[:5]


def test_a_lock_whose_holder_vanished_leaves_only_an_expiring_meta(redis_client: Any) -> None:
    lock = ReentrantLock(redis_client, "crashed", ttl=0.2, renew=False)
    assert lock.acquire()
    wait_until(lambda: redis_client.exists(lock.key) == 0, 5)
    remaining = list(redis_client.scan_iter())
    assert remaining == [lock.key.encode() + b":meta"]
    assert 0 < redis_client.pttl(remaining[0]) <= 200 + _scripts.META_RETENTION_MS * 3 // 2


def test_a_meta_hash_lost_while_held_is_rebuilt_with_a_ttl(redis_client: Any) -> None:
    # The meta hash (fence, request ids) can vanish while the lock is held: an eviction policy
    # such as volatile-lru picks keys with a TTL, or an operator deletes it.
    keys = LockKeys.for_name("lock", "evicted")
    first = commands.acquire(redis_client, keys, "task", 30_000, "r1")
    redis_client.delete(keys.meta)
    again = commands.acquire(redis_client, keys, "task", 30_000, "r2")  # another process
    assert again.acquired and again.hold_count == 2
    assert again.fence is not None and first.fence is not None
    assert again.fence > first.fence  # a new, larger token
    assert 0 < redis_client.pttl(keys.meta) <= 30_000 + _scripts.META_RETENTION_MS * 3 // 2

    redis_client.delete(keys.meta)
    assert commands.release(redis_client, keys, "task") == ReleaseReply(True, 1)
    assert all(redis_client.pttl(key) > 0 for key in redis_client.scan_iter())  # none immortal
    assert commands.release(redis_client, keys, "task").freed
    assert list(redis_client.scan_iter()) == [keys.meta.encode()]
    # (past the lease the release that rebuilt it saw, by the retention)
    assert 0 < redis_client.pttl(keys.meta) <= 30_000 + _scripts.META_RETENTION_MS


# -- idempotent acquire --------------------------------------------------------------------


def test_acquire_is_idempotent_per_request_id(redis_client: Any) -> None:
    keys = LockKeys.for_name("lock", "idem")
    first = commands.acquire(redis_client, keys, "worker-1", 30_000, "req-1")
    resent = commands.acquire(redis_client, keys, "worker-1", 30_000, "req-1")
    assert first.acquired and resent.acquired
    assert first.hold_count == resent.hold_count == 1
    assert resent.fence == first.fence
    assert hold_counts(redis_client, keys.lock) == {"worker-1": 1}
    assert commands.release(redis_client, keys, "worker-1").freed  # one release frees it
    assert redis_client.exists(keys.lock) == 0

    # Without the request id a resend would be a second hold, and one release would not free it.
    commands.acquire(redis_client, keys, "worker-1", 30_000, "req-2")
    again = commands.acquire(redis_client, keys, "worker-1", 30_000, "req-3")
    assert again.hold_count == 2
    assert commands.release(redis_client, keys, "worker-1") == ReleaseReply(True, 1)
    assert commands.release(redis_client, keys, "worker-1").freed


# A plain Lua loop keeps the single-threaded server busy (TIME inside a script may be frozen
# at the script's start on some servers, so the loop is sized by a measured run instead).
#: how long the server is busy: the first attempt (0.15 s timeout) must go out within 0.65 s
#: of the start, and its resend (1.2 s later) comes after the end
BUSY = 0.8


def _with_busy_server(server: Any, seconds: float, call: Any) -> Any:
    """Run ``call()`` while the server is busy for ``seconds`` (a ``DEBUG SLEEP``: a time, not
    an amount of work, so a loaded machine does not shorten it), so the first attempt of
    ``call`` times out on the client after the server received it."""
    admin = server.client()
    probe = server.client(socket_timeout=0.05, retry=Retry(NoBackoff(), 0))

    def busy() -> bool:
        try:
            probe.ping()
        except redis.TimeoutError:
            return True
        return False

    probe.ping()  # connected before the server is busy: only the call itself may time out
    runner = threading.Thread(target=admin.execute_command, args=("DEBUG", "SLEEP", seconds))
    runner.start()
    try:
        wait_until(busy, 5, interval=0.005)
        return call()
    finally:
        runner.join(10)


def test_redis_py_resends_a_timed_out_command_so_acquire_must_be_idempotent(
    make_redis_server: Any,
) -> None:
    server = make_redis_server(*debug_command_args())
    admin = server.client()
    # Like redis-py's default client (which retries on timeouts), made deterministic: a resend
    # goes out once the busy server has run the first attempt.
    retrying = server.client(
        socket_timeout=0.15,
        retry=Retry(ConstantBackoff(1.2), 1),
        retry_on_error=[redis.TimeoutError],  # redis-py 5 retries a timeout only when asked
    )
    retrying.ping()  # connected: the timeout below hits the command, not the handshake

    # What redis-py's retry does: the caller sees one successful call, Redis ran it twice.
    assert _with_busy_server(server, BUSY, lambda: retrying.hincrby("plain", "owner", 1)) == 2
    assert admin.hget("plain", "owner") == b"2"

    # The same resend of an acquire: one call, one hold, and one release frees the lock.
    keys = LockKeys.for_name("lock", "resent")
    admin.script_load(_scripts.ACQUIRE.source)
    evalsha_before = command_calls(admin).get("evalsha", 0)
    reply = _with_busy_server(
        server,
        BUSY,
        lambda: commands.acquire(retrying, keys, "worker-1", 30_000, "req-once"),
    )
    assert command_calls(admin)["evalsha"] - evalsha_before == 2  # it was run twice
    assert reply.acquired and reply.hold_count == 1
    assert hold_counts(admin, keys.lock) == {"worker-1": 1}

    # A resent release drops one hold, not two (and does not answer "not the owner").
    assert commands.acquire(admin, keys, "worker-1", 30_000, "req-twice").hold_count == 2
    admin.script_load(_scripts.RELEASE.source)
    evalsha_before = command_calls(admin)["evalsha"]
    left = _with_busy_server(server, BUSY, lambda: commands.release(retrying, keys, "worker-1"))
    assert command_calls(admin)["evalsha"] - evalsha_before == 2
    assert left == ReleaseReply(True, 1)
    assert hold_counts(admin, keys.lock) == {"worker-1": 1}
    assert commands.release(admin, keys, "worker-1").freed
    assert admin.exists(keys.lock) == 0


# -- bad input -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "error", "parameter"),
    [
        ({"name": ""}, TypeError, "name"),
        ({"name": None}, TypeError, "name"),
        ({"name": b"bytes"}, TypeError, "name"),
        ({"ttl": 0}, ValueError, "ttl"),
        ({"ttl": -1.0}, ValueError, "ttl"),
        ({"ttl": float("nan")}, ValueError, "ttl"),
        ({"ttl": float("inf")}, ValueError, "ttl"),
        ({"ttl": "30"}, TypeError, "ttl"),
        ({"ttl": True}, TypeError, "ttl"),
        ({"ttl": None}, TypeError, "ttl"),
        ({"owner": ""}, TypeError, "owner"),
        ({"owner": 7}, TypeError, "owner"),
        ({"renew": "yes"}, TypeError, "renew"),
        ({"prefix": "lo{c}k"}, ValueError, "prefix"),
        ({"prefix": "lock}"}, ValueError, "prefix"),
        ({"prefix": ""}, TypeError, "prefix"),
        ({"timeout": -1}, ValueError, "timeout"),
        ({"timeout": "1"}, TypeError, "timeout"),
        ({"info": 3}, TypeError, "info"),
    ],
)
def test_bad_constructor_arguments_name_the_parameter(
    redis_client: Any, kwargs: dict[str, Any], error: type[Exception], parameter: str
) -> None:
    arguments: dict[str, Any] = {"client": redis_client, "name": "ok", **kwargs}
    with pytest.raises(error, match=rf"\b{parameter}\b"):
        ReentrantLock(**arguments)


@pytest.mark.parametrize("client", ["redis://127.0.0.1:6379/0", None, object()])
def test_wrong_client_type_is_refused(client: Any) -> None:
    with pytest.raises(TypeError, match=r"\bclient\b"):
        ReentrantLock(client, "name")


def test_connection_pool_is_not_a_client(redis_server: Any) -> None:
    pool = redis.ConnectionPool(port=redis_server.port)
    with pytest.raises(TypeError, match=r"\bclient\b"):
        ReentrantLock(pool, "name")  # type: ignore[arg-type]  # the wrong type on purpose


@pytest.mark.parametrize(
    ("kwargs", "error", "parameter"),
    [
        ({"blocking": False, "timeout": 1.0}, ValueError, "timeout"),
        ({"timeout": -0.5}, ValueError, "timeout"),
        ({"timeout": "1"}, TypeError, "timeout"),
        ({"timeout": float("nan")}, ValueError, "timeout"),
        ({"blocking": 1}, TypeError, "blocking"),
    ],
)
def test_bad_acquire_arguments_name_the_parameter(
    redis_client: Any, kwargs: dict[str, Any], error: type[Exception], parameter: str
) -> None:
    lock = ReentrantLock(redis_client, "args", ttl=30)
    with pytest.raises(error, match=rf"\b{parameter}\b"):
        lock.acquire(**kwargs)
    assert lock.hold_count == 0
    assert redis_client.exists(lock.key) == 0


def test_ensure_held_trusts_the_lease_clock_without_a_round_trip(redis_client: Any) -> None:
    lock = ReentrantLock(redis_client, "unrenewed", ttl=0.3, renew=False)
    assert lock.acquire()
    lock.ensure_held()
    assert not lock.lost.is_set()
    # The lease runs out in Redis (nothing renews it); the lock's own clock started before
    # the acquire was sent, so it has run out there too.
    wait_until(lambda: not redis_client.exists(lock.key), 5, "the lease to run out", 0.01)
    with pytest.raises(LockLostError):
        lock.ensure_held()
    assert lock.lost.is_set()
    with pytest.raises(LockNotOwnedError):
        lock.release()


def test_ensure_held_when_not_held(redis_client: Any) -> None:
    lock = ReentrantLock(redis_client, "not-held", ttl=30)
    with pytest.raises(LockLostError):
        lock.ensure_held()
    with lock:
        lock.ensure_held()


# -- NOSCRIPT fallback ---------------------------------------------------------------------


def test_scripts_reload_after_script_flush(redis_client: Any) -> None:
    shas = [s.sha for s in (_scripts.ACQUIRE, _scripts.RELEASE)]
    lock = ReentrantLock(redis_client, "flushed", ttl=0.4)

    redis_client.script_flush()
    assert lock.acquire()
    redis_client.script_flush()
    # The heartbeat meets NOSCRIPT on its next renewal, reloads and carries on.
    deadline = time.monotonic() + 1.6
    while time.monotonic() < deadline:
        assert redis_client.hget(lock.key, lock.owner) == b"1"
        time.sleep(0.02)  # the watch's sampling interval: the span watched is the scenario
    assert not lock.lost.is_set()
    lock.ensure_held()
    assert redis_client.script_exists(_scripts.RENEW.sha) == [True]

    redis_client.script_flush()
    lock.release()
    assert redis_client.exists(lock.key) == 0
    assert lock.acquire() and lock.fence is not None
    lock.release()
    assert redis_client.script_exists(*shas) == [True, True]


def test_inspect_reads_one_lock_atomically(redis_client: Any) -> None:
    keys = LockKeys.for_name("lock", "inspected")
    free = commands.inspect(redis_client, keys)
    assert (free.held, free.holder, free.lease_left, free.fence, free.owners) == (
        False,
        None,
        None,
        None,
        {},
    )
    lock = ReentrantLock(redis_client, "inspected", ttl=30, owner="op", info="job 7")
    assert lock.acquire() and lock.acquire()
    state = commands.inspect(redis_client, keys)
    assert state.held and state.holder == "op" and state.owners == {"op": 1}
    assert state.lease_left is not None and 0 < state.lease_left <= 30
    assert state.fence == lock.fence and state.info == "job 7"
    assert state.since is not None and abs(state.since - time.time()) < 60
    lock.release()
    lock.release()
    after = commands.inspect(redis_client, keys)
    assert not after.held and after.fence == state.fence  # the token outlives the hold


def test_a_record_is_written_only_with_the_margin_of_lease_left(redis_client: Any) -> None:
    """record_if_held (what the beat leader records a send with) writes only while the owner
    holds the lock with at least ``min_lease`` of its lease left: below that margin it writes
    nothing and says how much was left; a lock held by another owner is not held."""
    space = LockSpace(redis_client)
    assert space.named("recorded").take("leader", 30).acquired
    key = space.keys("recorded").lock

    assert record_if_held(
        space, "recorded", "leader", "last_run", "tick", "1", min_lease=5, keep=60
    ).recorded
    assert records(space, "recorded", "last_run") == {"tick": "1"}

    # what a lease looks like whose renewals stalled: 2 s left, a margin of 5 s
    redis_client.pexpire(key, 2000)
    reply = record_if_held(
        space, "recorded", "leader", "last_run", "tick", "2", min_lease=5, keep=60
    )
    assert (reply.recorded, reply.held) == (False, True)
    assert 0 < reply.lease_left <= 2
    assert records(space, "recorded", "last_run") == {"tick": "1"}

    reply = record_if_held(
        space, "recorded", "other", "last_run", "tick", "3", min_lease=0, keep=60
    )
    assert (reply.recorded, reply.held) == (False, False)
    assert records(space, "recorded", "last_run") == {"tick": "1"}
