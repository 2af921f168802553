"""``LockSpace.inspect_many`` reads the locks in pipelined batches (what ``locks list`` reads
them with): the same states as one inspect per lock, across several batches, after a server
lost its scripts, with a Redis error named, and on a real three-node Redis Cluster (each
node's calls through its own client, since redis-py refuses EVALSHA in a cluster pipeline)."""

from __future__ import annotations

import io
import json
from contextlib import redirect_stdout
from typing import Any

import pytest
import redis
from celery_fixtures import cli_main
from cluster_helpers import redis_cluster
from redis.backoff import NoBackoff
from redis.cluster import RedisCluster
from redis.retry import Retry

from celery_singleton_lock import LockBackendError, LockSpace
from celery_singleton_lock.lock import LockState
from celery_singleton_lock.testing import free_port

#: well past two of the space's batches (500 locks each): three, the last one short
MANY = 500 * 2 + 7


def _take(client: Any, n: int) -> None:
    """``n`` held locks; every fifth and the next are two slots of a job of three."""
    space = LockSpace(client)
    for i in range(n):
        limit = 3 if i % 5 < 2 else 1
        name = f"t.batch:{i - i % 5}" if limit > 1 else f"t.batch:{i}"
        # the operator info a task's hold carries (docs/upgrading.md), "limit" with slots
        info = {"task": "t.batch", "id": f"id-{i}", "host": "h", "pid": 1}
        info.update({"limit": limit} if limit > 1 else {})
        assert space.named(name, limit).take(f"owner-{i}", 600.0, info=json.dumps(info)).acquired


def _same(states: list[LockState]) -> list[LockState]:
    """``states`` but their leases left (which run down between two reads)."""
    return [state._replace(lease_left=None) for state in states]


def _batched_and_one_by_one(client: Any) -> tuple[list[LockState], list[LockState]]:
    space = LockSpace(client)
    found = list({keys.lock: keys for keys in space.find()}.values())  # a rehash: once each
    return space.inspect_many(found), [space.inspect(keys.lock) for keys in found]


def _listed(client: Any, *args: str) -> list[dict[str, Any]]:
    """``locks list --json`` of the client's server and database."""
    where = client.connection_pool.connection_kwargs
    out = io.StringIO()
    with redirect_stdout(out), pytest.raises(SystemExit):
        cli_main(
            ["list", "--url", f"redis://127.0.0.1:{where['port']}/{where['db']}", "--json", *args]
        )
    return [row for row in json.loads(out.getvalue()) if row["kind"] == "lock"]


def test_batches_read_what_one_by_one_reads(redis_client: Any) -> None:
    _take(redis_client, MANY)
    redis_client.hset("lock:{t.batch:1}:wait", "x", "not a lock")  # a record hash: left out
    batched, one_by_one = _batched_and_one_by_one(redis_client)
    assert len(batched) == MANY and all(state.held for state in batched)
    assert _same(batched) == _same(one_by_one)
    listed = _listed(redis_client)
    assert len(listed) == MANY
    assert {row["slots"] for row in listed if row["key"].startswith("lock:{t.batch:0}")} == {"2/3"}
    assert len(_listed(redis_client, "--match", "t.batch:1*")) == len(
        [row for row in listed if row["name"].startswith("t.batch:1")]
    )
    redis_client.script_flush()  # a restarted server: the script is loaded again
    assert _same(_batched_and_one_by_one(redis_client)[0]) == _same(batched)


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
            batched, one_by_one = _batched_and_one_by_one(client)
            assert len(batched) == 300
            assert _same(batched) == _same(one_by_one)
            assert all(server.client().dbsize() > 0 for server in servers)  # every node has some
        finally:
            client.close()
