"""A lock whose Redis Cluster slot is being resharded (CLUSTER SETSLOT ... MIGRATING /
IMPORTING, MIGRATE, SETSLOT ... NODE), on a real two-node cluster.

During a migration, a command whose keys are all on the source node runs there; a command
whose keys are all gone from it is redirected (ASK) to the target, which runs it only when all
its keys are there; a command with some of its keys present and some missing gets TRYAGAIN, on
either node, until the migration ends. The scripts therefore declare as keys only the lock and
its meta hash (the wake-up channel, which never exists as a key, is built inside the scripts):
a release of a held lock runs on whichever node has both keys, and one that meets TRYAGAIN is
sent again from the background until it goes through.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest
import redis
from cluster_helpers import Migration, redis_cluster, text
from lock_helpers import server_version, wait_until
from redis.cluster import RedisCluster

from celery_singleton_lock import LockBackendError, ReentrantLock
from celery_singleton_lock._lock import commands, scripts
from celery_singleton_lock._lock.keys import LockKeys
from celery_singleton_lock.testing import RedisServer

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.slow,
    pytest.mark.timeout(180),
]


@contextlib.contextmanager
def two_node_cluster() -> Iterator[tuple[RedisServer, RedisServer]]:
    """A Redis Cluster of two primaries on free ports: slots 0-8191 and 8192-16383."""
    with redis_cluster(2) as (source, target):
        yield source, target


def _asked(error: BaseException) -> bool:
    """Whether a reply was an ASK redirection (an AskError, or a plain error from older
    redis-py)."""
    return isinstance(error, redis.exceptions.AskError) or str(error).startswith("ASK")


def _keys_on(node: RedisServer, slot: int) -> set[str]:
    """The keys of ``slot`` that ``node`` has (a plain command on a key it lacks would be
    redirected during a migration)."""
    keys = node.client().execute_command("CLUSTER", "GETKEYSINSLOT", slot, 1000)
    return {text(key) for key in keys}


def _name_on(client: RedisCluster, low: int, high: int, prefix: str) -> str:
    """A lock name whose slot is in [low, high]."""
    for i in range(100_000):
        name = f"{prefix}-{i}"
        if low <= client.keyslot(LockKeys.for_name("lock", name).lock) <= high:  # type: ignore[no-untyped-call]  # redis-py: unannotated
            return name
    raise AssertionError("no name found")


def _name_in_slot(client: RedisCluster, slot: int, prefix: str) -> str:
    for i in range(1_000_000):
        name = f"{prefix}-{i}"
        if client.keyslot(LockKeys.for_name("lock", name).lock) == slot:  # type: ignore[no-untyped-call]  # redis-py: unannotated
            return name
    raise AssertionError("no name found")


@pytest.fixture
def cluster() -> Iterator[tuple[RedisServer, RedisServer, RedisCluster]]:
    with two_node_cluster() as (source, target):
        client = RedisCluster(host="127.0.0.1", port=source.port, socket_timeout=5)
        try:
            yield source, target, client
        finally:
            client.close()


def test_a_script_with_a_missing_key_gets_tryagain_during_a_migration(
    cluster: tuple[RedisServer, RedisServer, RedisCluster],
) -> None:
    """Why the scripts declare no channel as a key: Redis's own answers, node by node."""
    source, target, client = cluster
    keys = LockKeys.for_name("lock", _name_on(client, 0, 8191, "why"))
    slot = client.keyslot(keys.lock)  # type: ignore[no-untyped-call]  # redis-py: unannotated
    assert commands.acquire(client, keys, "holder", 30_000, "r1").acquired
    migration = Migration(source, target, slot)
    migration.begin()
    direct = source.client()
    # both keys on the source: it runs the script
    assert direct.eval("return 1", 2, keys.lock, keys.meta) == 1
    # a third key that never exists (the wake-up channel, as release.lua declared it): TRYAGAIN
    # (a TryAgainError from a newer redis-py, a plain ResponseError from 5.0); Redis 6.2
    # sends it to the target instead (ASK), where the two keys it has are missing
    if server_version() >= (7, 0):
        with pytest.raises(redis.exceptions.ResponseError, match=r"TRYAGAIN|rehashing"):
            direct.eval("return 1", 3, keys.lock, keys.meta, keys.channel)
    else:
        with pytest.raises(redis.exceptions.ResponseError) as partial:
            direct.eval("return 1", 3, keys.lock, keys.meta, keys.channel)
        assert _asked(partial.value)
    # keys all gone from the source: ASK to the target, which runs a script only when every
    # key it declares is there
    fresh = LockKeys.for_name("lock", _name_in_slot(client, slot, "fresh"))
    with pytest.raises(redis.exceptions.ResponseError) as asked:
        direct.eval("return 1", 2, fresh.lock, fresh.meta)
    assert _asked(asked.value)
    asking = target.client()
    pipe = asking.pipeline(transaction=False)
    pipe.execute_command("ASKING")
    pipe.eval("return 1", 2, fresh.lock, fresh.meta)
    with pytest.raises(redis.exceptions.ResponseError, match=r"TRYAGAIN|rehashing"):
        pipe.execute()
    migration.end()


def test_a_release_during_a_migration_goes_through(
    cluster: tuple[RedisServer, RedisServer, RedisCluster],
) -> None:
    """MIGRATING/IMPORTING with the keys still on the source: the release runs there. After
    MIGRATE moved them: on the target (ASK). Wake-ups are published either way."""
    source, target, client = cluster
    name = _name_on(client, 0, 8191, "moving")
    keys = LockKeys.for_name("lock", name)
    slot = client.keyslot(keys.lock)  # type: ignore[no-untyped-call]  # redis-py: unannotated
    migration = Migration(source, target, slot)
    lock = ReentrantLock(client, name, ttl=30)

    assert lock.acquire()
    migration.begin()
    lock.release()  # both keys on the source
    assert _keys_on(source, slot) == {keys.meta}

    migration.end()  # back to a stable slot (now on the target), and again from the target
    back = Migration(target, source, slot)
    assert lock.acquire()
    assert _keys_on(target, slot) == {keys.lock, keys.meta}
    back.begin()
    back.move(keys.lock, keys.meta)  # both keys now on the new owner: ASK, then they run
    lock.release()
    assert _keys_on(target, slot) == set() and _keys_on(source, slot) == {keys.meta}
    back.end()
    assert lock.acquire() and lock.locked()
    lock.release()


def test_a_release_that_meets_tryagain_is_sent_again_until_the_migration_ends(
    cluster: tuple[RedisServer, RedisServer, RedisCluster],
) -> None:
    """The lock hash moved, its meta hash not yet (MIGRATE moves keys one command at a time):
    every node answers TRYAGAIN. The release raises, and is sent again from the background
    until the slot is stable, and then frees the lock."""
    source, target, client = cluster
    name = _name_on(client, 0, 8191, "split")
    keys = LockKeys.for_name("lock", name)
    slot = client.keyslot(keys.lock)  # type: ignore[no-untyped-call]  # redis-py: unannotated
    migration = Migration(source, target, slot)
    lock = ReentrantLock(client, name, ttl=30)
    assert lock.acquire()
    migration.begin()
    migration.move(keys.lock)
    with pytest.raises(LockBackendError):
        lock.release()
    migration.move(keys.meta)
    migration.end()
    assert wait_until(lambda: keys.lock not in _keys_on(target, slot), 20)
    assert keys.lock not in _keys_on(source, slot)
    # the hold was released, not lost: a new holder takes it at once
    other = ReentrantLock(client, name, ttl=30, owner="next")
    assert other.acquire(blocking=False)
    other.release()


def test_an_acquire_of_a_free_lock_in_a_migrating_slot_fails_until_the_migration_ends(
    cluster: tuple[RedisServer, RedisServer, RedisCluster],
) -> None:
    """What the docs' Cluster section says: a free lock is a missing lock hash, so its acquire
    in a migrating slot meets TRYAGAIN (its meta hash still on the source), or ASK and then
    TRYAGAIN on the target (no key of it on the source): LockBackendError, nothing taken;
    after SETSLOT ... NODE it is taken."""
    source, target, client = cluster
    used = _name_on(client, 0, 8191, "used")
    keys = LockKeys.for_name("lock", used)
    slot = client.keyslot(keys.lock)  # type: ignore[no-untyped-call]  # redis-py: unannotated
    lock = ReentrantLock(client, used, ttl=30)
    assert lock.acquire()
    lock.release()  # leaves its meta hash behind, on the source
    migration = Migration(source, target, slot)
    migration.begin()
    with pytest.raises(LockBackendError):
        lock.acquire(blocking=False)
    fresh = ReentrantLock(client, _name_in_slot(client, slot, "fresh"), ttl=30)
    with pytest.raises(LockBackendError):
        fresh.acquire(blocking=False)
    migration.move(keys.meta)
    migration.end()
    # the acquires whose replies were TRYAGAIN took nothing (their cancels go through too)
    assert keys.lock not in _keys_on(target, slot)
    assert lock.acquire(blocking=False) and fresh.acquire(blocking=False)
    lock.release()
    fresh.release()
    assert scripts.INSPECT(client, keys.pair, ())[0] == -2
