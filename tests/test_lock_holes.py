"""The holes found in the lock from outside, each reproduced as it was reported.

Every test here failed before its fix: an acquire whose reply was lost left a hold nobody owns
(and, through Celery, a job dropped for the whole queue lease); a lease too large for the script
left a lock with no expiry; a nested release of a lost hold returned normally; a name starting
with '}' split a lock's keys over two Cluster slots; an asyncio client or a pipeline failed with
an unrelated error.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
import redis
import redis.asyncio
from celery import Celery
from celery_fixtures import app_task, configure, lock_space
from kombu.exceptions import OperationalError
from lock_helpers import debug_command_args, server_stalled, settled, wait_until
from redis.backoff import NoBackoff
from redis.retry import Retry

from celery_singleton_lock import (
    LockBackendError,
    LockedTask,
    LockNotOwnedError,
    ReentrantLock,
)
from celery_singleton_lock._lock import LockSpace, commands, scripts
from celery_singleton_lock._lock.keys import LockKeys
from celery_singleton_lock.testing import RedisServer

pytestmark = pytest.mark.faults

#: short enough to give up on a reply while the server sleeps, with one resend (as redis-py's
#: default retry does) so a late run can meet a resent one
TIMEOUT = 0.3


def _impatient_client(port: int) -> Any:
    return redis.Redis(port=port, socket_timeout=TIMEOUT, retry=Retry(NoBackoff(), 1))


def _stall(port: int, seconds: float) -> threading.Thread:
    """Make the server busy for ``seconds`` (DEBUG SLEEP blocks its one thread), from now."""
    started = threading.Event()

    def sleep() -> None:
        sleeper: Any = redis.Redis(port=port)
        started.set()
        sleeper.execute_command("DEBUG", "SLEEP", seconds)
        sleeper.close()

    thread = threading.Thread(target=sleep, daemon=True)
    thread.start()
    started.wait(5)
    wait_until(lambda: server_stalled(port), 5, "the DEBUG SLEEP to start")
    return thread


@pytest.fixture
def server(make_redis_server: Any) -> RedisServer:
    made: RedisServer = make_redis_server(*debug_command_args())
    return made


def _no_holder(client: Any, key: str) -> bool:
    return bool(client.exists(key) == 0)


def test_an_acquire_whose_reply_is_lost_leaves_no_hold(server: RedisServer) -> None:
    """The acquire reaches the server, which runs it only after the client gave up (a stall
    longer than socket_timeout). The caller gets LockBackendError; the late acquire (and its
    resend) must not leave a hold behind: the lock is free once the server answers again."""
    client = _impatient_client(server.port)
    direct = redis.Redis(port=server.port)
    lock = ReentrantLock(client, "late", ttl=30)
    # Connected before the stall: a connection made during it times out in its handshake,
    # before the acquire is ever sent.
    assert lock.acquire() and lock.owned()
    lock.release()
    sleeper = _stall(server.port, 1.5)
    with pytest.raises(LockBackendError):
        lock.acquire(blocking=False)
    sleeper.join(10)
    settled(direct)  # the late acquire and its resend, sent during the stall, have run
    # The cancel ran (now, or from the client's renewal lane once the server woke), whatever
    # the order in which the late acquires and it reached the server; nothing sent before
    # is left to take it back.
    assert wait_until(lambda: _no_holder(direct, lock.key), 5), direct.hgetall(lock.key)
    other = ReentrantLock(direct, "late", ttl=30, owner="someone-else")
    assert other.acquire(blocking=False)
    other.release()


def test_a_cancelled_acquire_that_runs_later_is_refused(server: RedisServer) -> None:
    """The cancel reaches the server before the acquire it cancels: that acquire, when it
    finally runs, takes nothing."""
    client = redis.Redis(port=server.port)
    keys = LockKeys.for_name("lock", "voided")
    args = ("owner-1", "request-1", "publish", scripts.META_RETENTION_MS, 30_000)
    assert scripts.CANCEL(client, keys.pair, args) == 0
    reply = commands.acquire(client, keys, "owner-1", 30_000, "request-1")
    assert not reply.acquired
    assert client.exists(keys.lock) == 0
    assert client.pttl(keys.meta) > 0  # the void mark expires too
    # Another acquire of the same owner (a new request) is not affected.
    assert commands.acquire(client, keys, "owner-1", 30_000, "request-2").acquired


def test_a_cancel_only_drops_the_hold_its_acquire_added(server: RedisServer) -> None:
    """The same owner re-entered through Redis (a publisher's hold, then a run's): cancelling
    the second acquire leaves the first hold, and a resent cancel drops nothing more."""
    client = redis.Redis(port=server.port)
    keys = LockKeys.for_name("lock", "twice")
    assert commands.acquire(client, keys, "task-1", 30_000, "publish").acquired
    assert commands.acquire(client, keys, "task-1", 30_000, "run").hold_count == 2
    args = ("task-1", "run", "publish", scripts.META_RETENTION_MS, 30_000)
    assert scripts.CANCEL(client, keys.pair, args) == 1
    assert scripts.CANCEL(client, keys.pair, args) == 0
    assert client.hgetall(keys.lock) == {b"task-1": b"1"}


def test_a_cancel_after_the_meta_hash_was_lost_keeps_it_past_the_lock(
    server: RedisServer,
) -> None:
    """A holder with a long lease, its meta hash evicted, then a short-leased acquire by
    another owner cancelled: the cancel's void mark recreates the meta hash, which must not
    expire before the hold (found by the model test)."""
    client = redis.Redis(port=server.port)
    keys = LockKeys.for_name("lock", "evicted")
    assert commands.acquire(client, keys, "holder", 600_000, "long").acquired
    client.delete(keys.meta)
    args = ("other", "short", "publish", scripts.META_RETENTION_MS, 1_000)
    assert scripts.CANCEL(client, keys.pair, args) == 0
    assert client.pttl(keys.meta) > client.pttl(keys.lock) > 500_000


@pytest.fixture
def publish_app(make_redis_server: Any, server: RedisServer) -> Iterator[Celery]:
    broker = make_redis_server()  # the broker stays up while the lock's server stalls
    app = Celery("holes", set_as_current=False)
    configure(
        app,
        broker,
        singleton_lock_redis_url=f"redis://127.0.0.1:{server.port}/0",
        singleton_lock_redis_options={
            "socket_timeout": TIMEOUT,
            "retry": Retry(NoBackoff(), 1),
        },
    )
    yield app
    app.close()


def test_a_publish_whose_lock_reply_is_lost_does_not_drop_the_job(
    publish_app: Celery, server: RedisServer
) -> None:
    """lock_at="publish": the publish raises and sends nothing, and no lock is left behind for
    the unsent task id, so the next .delay() publishes instead of returning a job that never
    existed (the report: silently dropped for singleton_lock_queue_ttl)."""

    @app_task(publish_app, base=LockedTask, name="holes.report", lock_at="publish", shared=False)
    def report(day: str) -> str:
        return day

    direct = redis.Redis(port=server.port)
    # Connected, and the script loaded, before the stall (see above; a NOSCRIPT reply would
    # make the acquire fail before it ran).
    lock_space(publish_app).client.script_load(scripts.ACQUIRE.source)
    sleeper = _stall(server.port, 1.5)
    with pytest.raises(LockBackendError):
        report.delay("monday")
    sleeper.join(10)
    assert wait_until(lambda: not list(direct.scan_iter(match="lock:{*}")), 5)
    first = report.delay("monday")
    # A new message, holding the lock under its own id: the job is not dropped.
    holders = [LockSpace(direct).inspect(k.lock).holder for k in LockSpace(direct).find()]
    assert holders == [first.id]


def test_a_lease_the_script_cannot_represent_writes_nothing(server: RedisServer) -> None:
    """A lease past what Lua can pass to PEXPIRE as a whole number used to be written by HSET
    first, then refused by PEXPIRE: an immortal lock. The script now checks it first."""
    client = redis.Redis(port=server.port)
    keys = LockKeys.for_name("lock", "forever")
    for lease_ms in (10**17, 0, -5, 1.5):
        with pytest.raises(LockBackendError, match="lease must be a whole number"):
            commands.acquire(client, keys, "owner", lease_ms, f"request-{lease_ms}")  # type: ignore[arg-type]
        assert client.exists(keys.lock) == 0
    # The largest lease the scripts take is written exactly (no exponent notation).
    biggest = 2**53 - 1 - scripts.META_RETENTION_MS
    assert commands.acquire(client, keys, "owner", biggest, "request-big").acquired
    assert client.pttl(keys.lock) > 2**52
    assert not commands.park(client, keys, "nobody", 1000)
    with pytest.raises(LockBackendError, match="lease must be a whole number"):
        commands.park(client, keys, "owner", 10**17)
    assert client.pttl(keys.lock) > 2**52


def test_releasing_a_nested_hold_whose_lease_was_lost_raises(server: RedisServer) -> None:
    client = redis.Redis(port=server.port)
    lock = ReentrantLock(client, "nested", ttl=5)
    assert lock.acquire() and lock.acquire()
    client.delete(lock.key)  # the lease is lost behind the holder's back
    assert lock.lost.wait(10)
    with pytest.raises(LockNotOwnedError, match="lost its lease"):
        lock.release()  # the nested one
    with pytest.raises(LockNotOwnedError):
        lock.release()  # the last one
    assert lock.hold_count == 0


@pytest.mark.parametrize("name", ["}x", "}", "a}b", "%7D", "{x}", "%", "x}:meta", "{"])
def test_every_key_of_a_lock_shares_one_cluster_slot(name: str) -> None:
    """Redis Cluster hashes the part between the first '{' and the next '}', and the whole key
    when that part is empty: names with braces must still keep a lock's keys in one slot, and
    two names never share keys."""
    from redis.crc import key_slot

    keys = LockKeys.for_name("lock", name)
    assert key_slot(keys.lock.encode()) == key_slot(keys.meta.encode())
    assert LockKeys.from_lock_key(keys.lock) == keys
    names = ["}x", "}", "a}b", "%7D", "{x}", "%", "x}:meta", "{", "x", "a%7Db"]
    assert len({LockKeys.for_name("lock", n).lock for n in names}) == len(names)


def test_braced_names_lock_and_are_found(server: RedisServer) -> None:
    client = redis.Redis(port=server.port)
    space = LockSpace(client)
    lock = ReentrantLock(client, "}weird%name{", ttl=5)
    assert lock.acquire()
    assert [k.name for k in space.find()] == ["}weird%name{"]
    assert [k.name for k in space.find("}weird*")] == ["}weird%name{"]
    assert space.inspect(lock.key).holder == lock.owner
    lock.release()


def test_an_asyncio_client_or_a_pipeline_is_refused_clearly(server: RedisServer) -> None:
    client = redis.Redis(port=server.port)
    with pytest.raises(TypeError, match=r"synchronous redis-py client.*asyncio"):
        ReentrantLock(redis.asyncio.Redis(port=server.port), "x")
    with pytest.raises(TypeError, match="not a pipeline"):
        ReentrantLock(client.pipeline(), "x")
    with pytest.raises(TypeError, match="not a pipeline"):
        LockSpace(client.pipeline(transaction=False))
    # The check remembers a client class that passed (a worker makes a lock per run); an
    # instance of that class whose evalsha was replaced by a coroutine is still refused.
    ReentrantLock(client, "x")
    patched = redis.Redis(port=server.port)

    async def evalsha(*args: Any) -> Any:
        return None

    patched.evalsha = evalsha  # type: ignore[method-assign,assignment]
    with pytest.raises(TypeError, match=r"synchronous redis-py client.*asyncio"):
        ReentrantLock(patched, "x")
    assert client.dbsize() == 0


def test_a_publish_that_raised_leaves_no_lock_even_when_its_undo_fails(
    make_redis_server: Any,
) -> None:
    """The send fails (the broker refuses it) while the lock's Redis is down for a restart
    (it keeps its data: AOF): the undo of the publish lock cannot go through then. It is sent
    again in the background, so once Redis is back the job is not locked out for the queue
    lease by a message that was never sent."""
    server = make_redis_server("--appendonly", "yes", "--appendfsync", "always")
    broker = make_redis_server()
    app = Celery("holes", set_as_current=False)
    configure(
        app,
        broker,
        singleton_lock_redis_url=f"redis://127.0.0.1:{server.port}/0",
        singleton_lock_redis_options={"socket_timeout": TIMEOUT, "retry": Retry(NoBackoff(), 1)},
    )

    @app_task(app, base=LockedTask, name="holes.sync", lock_at="publish", shared=False)
    def sync(day: str) -> str:
        return day

    def refuse(*args: Any, **kwargs: Any) -> None:
        server.stop()  # the undo that follows finds no server
        raise OperationalError("the broker refused the message")

    real_send = app.amqp.send_task_message
    app.amqp.send_task_message = refuse
    try:
        with pytest.raises(OperationalError):
            sync.delay("monday")
    finally:
        app.amqp.send_task_message = real_send
    server.start()
    direct = redis.Redis(port=server.port)
    # The lock was taken before the send, and survived the restart: only the undo frees it.
    assert wait_until(lambda: not list(LockSpace(direct).find()), 10)
    sent = sync.delay("monday")
    assert [LockSpace(direct).inspect(k.lock).holder for k in LockSpace(direct).find()] == [sent.id]
    app.close()
