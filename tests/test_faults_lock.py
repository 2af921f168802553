"""The lock under injected faults, with real processes and a real server.

Each test states its expectation in its docstring. Run the whole fault suite alone with
``pytest -m faults``.
"""

from __future__ import annotations

import collections
import multiprocessing
import os
import select
import signal
import socket
import threading
import time
from functools import partial
from typing import Any

import pytest
import redis
from lock_helpers import (
    debug_command_args,
    fenced_write,
    hold_counts,
    paused_holder_worker,
    renewed_here,
    server_stalled,
    settled,
    wait_until,
)
from redis.backoff import NoBackoff
from redis.retry import Retry

from celery_singleton_lock import LockBackendError, LockLostError, LockSpace, ReentrantLock
from celery_singleton_lock._lock import scripts
from celery_singleton_lock._lock.runtime import LockRuntime
from celery_singleton_lock.testing import RedisServer

pytestmark = [
    pytest.mark.faults,
    pytest.mark.timeout(90),
]

FORK = multiprocessing.get_context("fork")


class FreezableProxy:
    """A TCP proxy on loopback between a client and Redis. ``freeze()`` stops forwarding in
    both directions and keeps every socket open (a stalled path: no reset, no error, silence);
    ``thaw()`` forwards what was held back, in order.

    ``hold_sending(*markers)``: a connection on which the client sends one of ``markers`` (a
    script's SHA1, say) stalls from that request on, while every other connection forwards.
    It forwards what it held once its marker is no longer held (``hold_sending`` without it,
    or ``thaw()``), or never if the proxy closes first."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.frozen = threading.Event()
        #: only the replies are held back: requests still reach Redis
        self.replies_frozen = threading.Event()
        self.closed = threading.Event()
        #: see hold_sending
        self.markers: tuple[bytes, ...] = ()
        #: marker -> how many connections it stalled
        self.stalled: collections.Counter[bytes] = collections.Counter()
        self._count = threading.Lock()
        #: bumped by :meth:`drained_since`'s callers (:meth:`mark`); each connection notes the
        #: mark it saw when it last found nothing to forward
        self._mark = 0
        self._idle: dict[int, int] = {}
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.closed.is_set():
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target_port))
            except OSError:
                client.close()  # the server is gone: the client sees the path close
                continue
            threading.Thread(target=self._pump, args=(client, upstream), daemon=True).start()

    def _pump(self, a: socket.socket, b: socket.socket) -> None:
        peers = {a: b, b: a}
        # What this connection holds back since the client sent a marker (``caught``), and
        # the last bytes the client sent (a marker split over two reads is still found).
        held, caught, tail = b"", b"", b""
        me = id(a)
        self._idle[me] = -1
        try:
            while not self.closed.is_set():
                if held and caught in self.markers:
                    time.sleep(0.01)  # the stalled path's silence (polls for the release)
                    continue
                if held:
                    b.sendall(held)
                    held = b""
                if self.frozen.is_set():
                    time.sleep(0.01)  # the frozen path's silence (polls for the thaw)
                    continue
                # Unread data stays in the kernel's buffers until the thaw.
                readable = [a] if self.replies_frozen.is_set() else [a, b]
                mark = self._mark
                ready, _, _ = select.select(readable, [], [], 0.05)
                if not ready and not self.replies_frozen.is_set():
                    self._idle[me] = mark  # all it was sent before `mark` is forwarded
                for sock in ready:
                    if self.frozen.is_set() or (sock is b and self.replies_frozen.is_set()):
                        break
                    data = sock.recv(65536)
                    if not data:
                        return
                    if sock is a and self.markers:
                        seen, tail = tail + data, (tail + data)[-64:]
                        caught = next((m for m in self.markers if m in seen), b"")
                        if caught:
                            held = data
                            with self._count:
                                self.stalled[caught] += 1
                            break
                    peers[sock].sendall(data)
        except OSError:
            return
        finally:
            self._idle.pop(me, None)
            a.close()
            b.close()

    def freeze(self) -> None:
        self.frozen.set()

    def hold_replies(self) -> None:
        self.replies_frozen.set()

    def hold_sending(self, *markers: bytes) -> None:
        self.markers = markers

    def thaw(self) -> None:
        self.markers = ()
        self.frozen.clear()
        self.replies_frozen.clear()

    def mark(self) -> int:
        """A mark for :meth:`drained_since`."""
        self._mark += 1
        return self._mark

    def drained_since(self, mark: int) -> bool:
        """Whether every open connection has forwarded, both ways, all that reached the proxy
        before :meth:`mark` returned ``mark`` (it found nothing more to read since)."""
        return all(seen >= mark for seen in list(self._idle.values()))

    def close(self) -> None:
        self.closed.set()
        self.listener.close()


@pytest.fixture
def debug_server(make_redis_server: Any) -> RedisServer:
    made: RedisServer = make_redis_server(*debug_command_args())
    return made


def test_a_holder_paused_past_its_lease_is_taken_over_and_fenced_out(
    redis_server: RedisServer,
) -> None:
    """SIGSTOP a holder process for longer than its lease: a contender takes the lock after
    the lease with a larger fence; the holder, continued, finds ``lost`` set, and the fenced
    store refuses its late write while keeping the contender's."""
    report, go_on = FORK.Queue(), FORK.Event()
    holder = FORK.Process(
        target=paused_holder_worker, args=(redis_server.port, "paused", 1.0, report, go_on)
    )
    holder.start()
    try:
        kind, old_fence = report.get(timeout=20)
        assert kind == "held"
        assert holder.pid is not None
        os.kill(holder.pid, signal.SIGSTOP)
        client = redis_server.client()
        contender = ReentrantLock(client, "paused", ttl=5, renew=False)
        started = time.monotonic()
        assert contender.acquire(timeout=10)
        waited = time.monotonic() - started
        assert 0.5 < waited < 3.0  # after the holder's lease, not before, not much later
        assert contender.fence is not None and contender.fence > old_fence
        assert fenced_write(client, contender.fence, "the contender's write")
        os.kill(holder.pid, signal.SIGCONT)
        go_on.set()
        kind, lost, late_write_taken = report.get(timeout=20)
        assert kind == "woke" and lost is True and late_write_taken is False
        assert client.get("store:value") == b"the contender's write"
        contender.release()
    finally:
        if holder.pid is not None:
            os.kill(holder.pid, signal.SIGCONT)
        holder.join(10)
        if holder.is_alive():
            holder.kill()


@pytest.mark.parametrize("how", ["CLIENT PAUSE", "DEBUG SLEEP"])
def test_a_server_paused_shorter_than_the_lease_keeps_the_locks(
    debug_server: RedisServer, how: str
) -> None:
    """Redis stops answering for 0.6 s under held locks with a 3 s lease: every lock is still
    held and renewed afterwards, none is reported lost."""
    client = debug_server.client(socket_timeout=5)
    locks = [ReentrantLock(client, f"short-{i}", ttl=3) for i in range(5)]
    assert all(lock.acquire() for lock in locks)
    _pause(debug_server, how, 0.6)
    deadline = time.monotonic() + 4
    while time.monotonic() < deadline:
        for lock in locks:
            lock.ensure_held()
        time.sleep(0.1)  # the watch's sampling interval: the span watched is the scenario
    direct = debug_server.client()
    assert all(direct.hexists(lock.key, lock.owner) for lock in locks)
    for lock in locks:
        lock.release()


@pytest.mark.parametrize("how", ["CLIENT PAUSE", "DEBUG SLEEP"])
def test_a_server_paused_longer_than_the_lease_loses_them_for_good(
    debug_server: RedisServer, how: str
) -> None:
    """Redis stops answering for 2.5 s under a lock with a 1 s lease: ``lost`` is set by the
    end of the lease, the holder never passes ``ensure_held()`` again, and once Redis answers
    a contender takes the lock; the holder's late renewal does not take it back."""
    client = debug_server.client(socket_timeout=5)
    lock = ReentrantLock(client, "long", ttl=1)
    assert lock.acquire()
    paused = time.monotonic()
    pauser = threading.Thread(target=_pause, args=(debug_server, how, 2.5))
    pauser.start()
    assert lock.lost.wait(3)
    assert time.monotonic() - paused < 1.5
    pauser.join(10)
    contender = ReentrantLock(debug_server.client(), "long", ttl=5, owner="contender")
    assert contender.acquire(timeout=5)
    # The holder's lane gives the lost hold up (it renews it no more), and Redis has run
    # whatever it sent before.
    wait_until(lambda: not renewed_here(lock), 5, "the holder's lane to give the hold up")
    settled(debug_server.client())
    with pytest.raises(LockLostError):
        lock.ensure_held()
    assert debug_server.client().hkeys(lock.key) == [b"contender"]
    contender.release()


def _pause(server: RedisServer, how: str, seconds: float) -> None:
    pauser: Any = redis.Redis(port=server.port)
    if how == "CLIENT PAUSE":
        pauser.execute_command("CLIENT", "PAUSE", int(seconds * 1000), "WRITE")
        time.sleep(seconds)  # the pause's length (the scenario), as DEBUG SLEEP blocks for it
    else:
        pauser.execute_command("DEBUG", "SLEEP", seconds)
    pauser.close()


def test_a_restart_under_held_locks_sets_lost_and_a_new_holder_gets_a_larger_fence(
    redis_server: RedisServer,
) -> None:
    """Redis restarts (without persistence) under a held lock: the holder's ``lost`` is set
    at its next renewal, and a new holder gets a fence larger than the lost one's."""
    client = redis_server.client(socket_timeout=5)
    lock = ReentrantLock(client, "restarted", ttl=1.5)
    assert lock.acquire()
    old_fence = lock.fence
    assert old_fence is not None
    redis_server.restart()
    assert lock.lost.wait(5)
    other = ReentrantLock(redis_server.client(), "restarted", ttl=5, owner="other")
    assert other.acquire(blocking=False)
    assert other.fence is not None and other.fence > old_fence
    other.release()


def test_a_frozen_path_costs_the_lease_and_a_thawed_holder_does_not_revive_it(
    redis_server: RedisServer,
) -> None:
    """The path between a holder and Redis stalls (a freezable proxy: no error, silence): by
    the end of the lease ``lost`` is set; a contender on a working path takes the lock after
    the lease; after the thaw, the holder's late renewals do not take it back."""
    proxy = FreezableProxy(redis_server.port)
    try:
        through_proxy = redis.Redis(port=proxy.port, socket_timeout=0.5)
        lock = ReentrantLock(through_proxy, "frozen", ttl=1)
        assert lock.acquire()
        proxy.freeze()
        frozen = time.monotonic()
        assert lock.lost.wait(3)
        assert time.monotonic() - frozen < 1.5
        contender = ReentrantLock(redis_server.client(), "frozen", ttl=5, owner="contender")
        assert contender.acquire(timeout=5)
        time.sleep(1.5)  # the path stays frozen a while longer (the scenario)
        proxy.thaw()
        # The holder's lane gives the lost hold up (it renews it no more); what it sent
        # before goes through the proxy, and Redis runs it.
        wait_until(lambda: not renewed_here(lock), 5, "the holder's lane to give the hold up")
        mark = proxy.mark()
        wait_until(lambda: proxy.drained_since(mark), 5, "the proxy to forward what it held")
        settled(redis_server.client())
        assert redis_server.client().hkeys(lock.key) == [b"contender"]
        with pytest.raises(LockLostError):
            lock.ensure_held()
        contender.release()
    finally:
        proxy.close()


def test_an_acquire_whose_reply_is_held_back_leaves_no_hold(redis_server: RedisServer) -> None:
    """The acquire reaches Redis through a path that then freezes, so its reply never comes
    back in time: ``acquire()`` raises ``LockBackendError``; once the path thaws, no hold of
    that owner is left in Redis, and another owner takes the lock at once."""
    proxy = FreezableProxy(redis_server.port)
    try:
        client = redis.Redis(port=proxy.port, socket_timeout=0.5, retry=Retry(NoBackoff(), 0))
        warm = ReentrantLock(client, "warm-up", ttl=5)
        assert warm.acquire()  # connected and scripts loaded before the fault
        warm.release()
        lock = ReentrantLock(client, "held-back", ttl=30)
        direct = redis_server.client()
        proxy.hold_replies()  # the acquire reaches Redis and runs; its reply does not come back
        with pytest.raises(LockBackendError):
            lock.acquire(blocking=False)
        proxy.thaw()
        assert wait_until(lambda: direct.exists(lock.key) == 0, 10), direct.hgetall(lock.key)
        other = ReentrantLock(direct, "held-back", ttl=5, owner="other")
        assert other.acquire(blocking=False)
        other.release()
    finally:
        proxy.close()


#: how many times the stalled-acquire scenario runs
LATE_ACQUIRE_RUNS = 50


def _take(lock: ReentrantLock) -> bool:
    """One try at ``lock``; ``False`` also when Redis did not answer in time (a slow moment
    of a loaded machine: the caller tries again, which settles what this try left open)."""
    try:
        return lock.acquire(blocking=False)
    except LockBackendError:
        return False


@pytest.mark.slow
def test_a_late_acquire_leaves_no_hold_behind_the_owners_next_release(
    redis_server: RedisServer,
) -> None:
    """The path stalls during an acquire for longer than the socket timeout: its reply is lost
    and its cancel cannot be sent. The path comes back, and the same owner at once acquires
    and releases: after ``release()`` returns the lock is free in Redis and another owner
    takes it, whether the late acquire or its cancel reached Redis first, every time."""
    proxy = FreezableProxy(redis_server.port)
    direct = redis_server.client()
    try:
        client = redis.Redis(port=proxy.port, socket_timeout=0.2, retry=Retry(NoBackoff(), 0))
        warm = ReentrantLock(client, "warm-up", ttl=5)
        assert warm.acquire()  # connected and scripts loaded before the fault
        warm.release()
        ghosts = []
        for run in range(LATE_ACQUIRE_RUNS):
            lock = ReentrantLock(client, f"late-{run}", ttl=5, owner="owner")
            proxy.freeze()
            with pytest.raises(LockBackendError):
                lock.acquire(blocking=False)
            proxy.thaw()  # the late acquire and the cancels go through, in any order
            assert wait_until(partial(_take, lock), 10, "the owner's acquire")
            lock.release()
            left = hold_counts(direct, lock.key)
            other = ReentrantLock(direct, lock.name, ttl=5, owner="other")
            if left or not other.acquire(blocking=False):
                ghosts.append((run, left, direct.pttl(lock.key)))
            else:
                other.release()
        assert ghosts == [], f"{len(ghosts)} of {LATE_ACQUIRE_RUNS} runs left a hold behind"
        assert not LockRuntime.of(client).cancels  # each was settled by its owner
    finally:
        proxy.thaw()
        proxy.close()


@pytest.mark.parametrize("api", ["ReentrantLock", "LockSpace", "LockSpace, 2 permits"])
def test_a_pending_cancel_is_settled_before_the_owners_next_acquire(
    redis_server: RedisServer, api: str
) -> None:
    """The late-acquire ordering, forced: the acquire is held on the stalled path until after
    its cancel was tried, then reaches Redis and takes the lock, while every cancel stays
    stalled. The owner's next acquire does not run on top of that hold: it raises
    ``LockBackendError`` (its pending cancel cannot be sent). Once the cancels can be sent,
    the owner acquires and releases, and the lock is free in Redis. (A lock object, a lock
    space as the publish path uses it, and a lock space on a semaphore's permits.)"""
    proxy = FreezableProxy(redis_server.port)
    direct = LockSpace(redis_server.client())
    name = f"forced-late-{api}"
    permits = 2 if "permits" in api else 1
    try:
        client = redis.Redis(port=proxy.port, socket_timeout=0.2, retry=Retry(NoBackoff(), 0))
        space = LockSpace(client)
        lock = ReentrantLock(client, name, ttl=5, owner="owner")

        def acquire() -> bool:
            if api == "ReentrantLock":
                return lock.acquire(blocking=False)
            # the publish path: a hold of a task id, in Redis only
            return space.named(name, permits).take("owner", 5).acquired

        def release() -> None:
            if api == "ReentrantLock":
                lock.release()
            else:
                assert space.named(name, permits).release("owner", holds=1).owned

        def holds() -> dict[str, int]:
            """Owner -> hold count over every permit, as Redis has them."""
            counts: dict[str, int] = {}
            for state in direct.named(name, permits).inspect():
                for owner, count in state.owners.items():
                    counts[owner] = counts.get(owner, 0) + count
            return counts

        warm = ReentrantLock(client, "warm-up", ttl=5)
        assert warm.acquire()  # connected and scripts loaded before the fault
        warm.release()
        acquires, cancels = scripts.ACQUIRE.sha.encode(), scripts.CANCEL.sha.encode()
        proxy.hold_sending(acquires, cancels)
        with pytest.raises(LockBackendError):
            acquire()
        wait_until(lambda: proxy.stalled[cancels], 5, "the cancel to be tried (and stalled)")
        proxy.hold_sending(cancels)  # the acquire goes through, the cancels stay stalled
        wait_until(lambda: holds() == {"owner": 1}, 5, "the late acquire")
        try:
            acquired = acquire()
        except LockBackendError:
            # the pending cancel could not be sent: nothing ran on top of the late hold
            assert holds() == {"owner": 1}
        else:
            assert acquired
            release()
            assert holds() == {}, "release() returned, and the lock is held"
        proxy.thaw()

        def acquired_once_clear() -> bool:
            # the client's 0.2 s socket timeout may still run out on a loaded machine while
            # the thawed path drains: a try that raises is tried again
            try:
                return acquire()
            except LockBackendError:
                return False

        assert wait_until(acquired_once_clear, 10, "the owner's acquire once the path is clear")
        release()
        assert holds() == {}
        assert not LockRuntime.of(client).cancels  # nothing left pending
        assert direct.named(name, permits).take("other", 5).acquired
        assert direct.named(name, permits).release("other").freed
    finally:
        proxy.thaw()
        proxy.close()


def test_a_release_settles_the_owners_pending_cancel_before_it_drops_a_hold(
    redis_server: RedisServer,
) -> None:
    """The owner holds the lock once; its second take (a re-entry, as a retry takes its parked
    hold) loses its reply, and the cancel of it stalls, while that take reaches Redis late: two
    holds in Redis, one the owner knows of. ``release(holds=1)`` must not drop a hold on top of
    the late one: it raises (its pending cancel cannot be sent, nothing ran), or it returns
    with the lock free. It never returns with a hold of that owner left in Redis, which nothing
    would release before the cancel runs. Once the path is clear, the owner's releases leave
    the lock free."""
    proxy = FreezableProxy(redis_server.port)
    direct = LockSpace(redis_server.client())
    name = "release-after-a-late-take"
    try:
        client = redis.Redis(port=proxy.port, socket_timeout=0.2, retry=Retry(NoBackoff(), 0))
        warm = ReentrantLock(client, "warm-up", ttl=5)
        assert warm.acquire()  # connected and scripts loaded before the fault
        warm.release()
        job = LockSpace(client).named(name)

        def holds() -> dict[str, int]:
            (state,) = direct.named(name).inspect()
            return state.owners

        assert job.take("owner", 5).acquired
        acquires, cancels = scripts.ACQUIRE.sha.encode(), scripts.CANCEL.sha.encode()
        proxy.hold_sending(acquires, cancels)
        with pytest.raises(LockBackendError):
            job.take("owner", 5)
        wait_until(lambda: proxy.stalled[cancels], 5, "the cancel to be tried (and stalled)")
        proxy.hold_sending(cancels)  # the take goes through, the cancels stay stalled
        wait_until(lambda: holds() == {"owner": 2}, 5, "the late take")
        try:
            reply = job.release("owner", holds=1)
        except LockBackendError:
            raised = True
            assert holds() == {"owner": 2}  # nothing ran on top of the late hold
        else:
            raised = False
            assert reply.freed and holds() == {}, f"release() returned {reply}: {holds()} left"
        proxy.thaw()
        runtime = LockRuntime.of(client)
        wait_until(lambda: not runtime.cancels, 10, "the cancel to be settled")
        if raised:
            assert holds() == {"owner": 1}  # the hold the owner knows of
            assert job.release("owner", holds=1).freed
        assert holds() == {}
        assert direct.named(name).take("other", 5).acquired
    finally:
        proxy.thaw()
        proxy.close()


def test_a_release_whose_reply_is_lost_still_frees_the_lock(debug_server: RedisServer) -> None:
    """The release reaches a server that stalls past the client's socket timeout: the caller
    gets ``LockBackendError``, and the lock is not left held: once the server answers, another
    owner takes it at once (the release ran, or is sent again in the background)."""
    client = redis.Redis(port=debug_server.port, socket_timeout=0.3, retry=Retry(NoBackoff(), 1))
    lock = ReentrantLock(client, "release-lost", ttl=30)
    assert lock.acquire()
    sleeper = threading.Thread(target=_pause, args=(debug_server, "DEBUG SLEEP", 1.5))
    sleeper.start()
    wait_until(lambda: server_stalled(debug_server.port), 5, "the DEBUG SLEEP to start")
    with pytest.raises(LockBackendError):
        lock.release()
    sleeper.join(10)
    other = ReentrantLock(debug_server.client(), "release-lost", ttl=5, owner="other")
    assert other.acquire(timeout=2)
    other.release()


def test_one_stalled_server_does_not_cost_the_locks_on_a_healthy_one(
    make_redis_server: Any,
) -> None:
    """Two clients to two servers in one process, each with a socket timeout and redis-py's
    default retry: the path to one freezes for several leases. The lock on the healthy server
    is renewed throughout; the other's ``lost`` is set."""
    stalled_server, healthy_server = make_redis_server(), make_redis_server()
    proxy = FreezableProxy(stalled_server.port)
    try:
        stalled = ReentrantLock(redis.Redis(port=proxy.port, socket_timeout=0.5), "s", ttl=1)
        healthy_client = healthy_server.client(socket_timeout=0.5)
        healthy = ReentrantLock(healthy_client, "h", ttl=1)
        assert stalled.acquire() and healthy.acquire()
        proxy.freeze()
        deadline = time.monotonic() + 4
        while time.monotonic() < deadline:
            healthy.ensure_held()
            assert healthy_client.hexists(healthy.key, healthy.owner)
            time.sleep(0.05)  # the watch's sampling interval: the span watched is the scenario
        assert stalled.lost.is_set()
        healthy.release()
    finally:
        proxy.thaw()
        proxy.close()
