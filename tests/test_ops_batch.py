"""``find_locks`` reads the locks in pipelined batches (``LockSpace.inspect_many``): the same
views as one inspect per lock, across several batches, after a server lost its scripts, with a
Redis error named, and on a real three-node Redis Cluster (each node's calls through its own
client, since redis-py refuses EVALSHA in a cluster pipeline)."""

from __future__ import annotations

from typing import Any

import pytest
import redis
from cluster_helpers import redis_cluster
from lock_helpers import server_time
from redis.backoff import NoBackoff
from redis.cluster import RedisCluster
from redis.retry import Retry

from celery_singleton_lock import LockBackendError
from celery_singleton_lock._celery.hold import holder_info
from celery_singleton_lock._lock import LockSpace
from celery_singleton_lock._lock.space import INSPECT_BATCH
from celery_singleton_lock._ops.locks import LockView, find_locks, views_of
from celery_singleton_lock.testing import free_port


def _take(client: Any, n: int) -> None:
    """``n`` held locks; every fifth and the next are two slots of a job of three."""
    space = LockSpace(client)
    for i in range(n):
        limit = 3 if i % 5 < 2 else 1
        name = f"t.batch:{i - i % 5}" if limit > 1 else f"t.batch:{i}"
        info = holder_info("t.batch", f"id-{i}", limit)
        assert space.named(name, limit).take(f"owner-{i}", 600.0, info=info).acquired


def _one_by_one(client: Any) -> list[LockView]:
    space = LockSpace(client)
    return views_of((space.inspect(k.lock) for k in space.find()), server_time(client))


def _same(views: list[LockView]) -> list[tuple[Any, ...]]:
    return [
        (v.key, v.task, v.holder, v.pid, v.state, v.fence, v.hold_count, v.slots) for v in views
    ]


def test_batches_read_what_one_by_one_reads(redis_client: Any) -> None:
    n = INSPECT_BATCH * 2 + 7  # three batches, the last one short
    _take(redis_client, n)
    redis_client.hset("lock:{t.batch:1}:wait", "x", "not a lock")  # a record hash: left out
    views = find_locks(redis_client)
    assert len(views) == n
    assert _same(views) == _same(_one_by_one(redis_client))
    assert {v.slots for v in views if v.key.startswith("lock:{t.batch:0}")} == {"2/3"}
    assert len(find_locks(redis_client, pattern="t.batch:1*")) == len(
        [v for v in views if v.name.startswith("t.batch:1")]
    )
    redis_client.script_flush()  # a restarted server: the script is loaded again
    assert _same(find_locks(redis_client)) == _same(views)


def test_a_redis_error_is_named() -> None:
    dead = redis.Redis(port=free_port(), socket_connect_timeout=0.5, retry=Retry(NoBackoff(), 0))
    keys = [LockSpace(dead).keys("gone")]
    with pytest.raises(LockBackendError, match="the locks under prefix 'lock'"):
        LockSpace(dead).inspect_many(keys)


@pytest.mark.cluster
@pytest.mark.slow  # a cluster of three redis-servers
@pytest.mark.timeout(120)
def test_on_a_cluster_each_node_is_read() -> None:
    with redis_cluster(3) as servers:
        client = RedisCluster(host="127.0.0.1", port=servers[0].port, socket_timeout=5)
        try:
            _take(client, 300)
            views = find_locks(client)
            assert len(views) == 300
            assert _same(views) == _same(_one_by_one(client))
            assert all(server.client().dbsize() > 0 for server in servers)  # every node has some
        finally:
            client.close()
