"""What the lock needs of a Redis client, as a type and as a check made before any use."""

from __future__ import annotations

import inspect
from typing import Any, Protocol, cast

from redis.asyncio import Redis as AsyncRedis
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.client import Pipeline
from redis.cluster import ClusterPipeline

__all__ = ["RedisClient", "check_client"]


class RedisClient(Protocol):
    """A synchronous redis-py client: ``redis.Redis``, ``redis.cluster.RedisCluster`` or a
    Sentinel ``master_for(...)`` client. (Any signature: the lock calls these the way every
    one of those clients accepts.)"""

    def evalsha(self, *args: Any, **kwargs: Any) -> Any: ...

    def script_load(self, *args: Any, **kwargs: Any) -> Any: ...

    def pipeline(self, *args: Any, **kwargs: Any) -> Any: ...

    def execute_command(self, *args: Any, **kwargs: Any) -> Any: ...


def check_client(client: object, parameter: str = "client") -> RedisClient:
    """``client`` when it is a synchronous redis-py client, else a ``TypeError`` naming
    ``parameter`` and what to pass instead."""
    if type(client) in _checked_types and "evalsha" not in getattr(client, "__dict__", ()):
        return cast(RedisClient, client)
    # A pipeline has the client's methods but queues commands instead of running them, and an
    # asyncio client's return coroutines: both would fail later with an unrelated error.
    if isinstance(client, Pipeline | ClusterPipeline):
        raise TypeError(
            f"{parameter} must be a redis-py client, not a pipeline ({type(client).__name__}): "
            "the lock runs its own commands; pass the client the pipeline came from"
        )
    if inspect.iscoroutinefunction(getattr(client, "evalsha", None)) or isinstance(
        client, AsyncRedis | AsyncRedisCluster
    ):
        raise TypeError(
            f"{parameter} must be a synchronous redis-py client, got the asyncio client "
            f"{type(client).__module__}.{type(client).__name__}: the lock is synchronous (its "
            "heartbeat is a thread); pass redis.Redis(...) with the same connection options"
        )
    if not (hasattr(client, "evalsha") and hasattr(client, "pipeline")):
        raise TypeError(
            f"{parameter} must be a redis-py client (redis.Redis, redis.RedisCluster, or a "
            f"Sentinel master_for(...) client), got {type(client).__name__}"
        )
    bound = getattr(client, "evalsha", None)
    if getattr(bound, "__func__", None) is getattr(type(client), "evalsha", None):
        _checked_types.add(type(client))
    return cast(RedisClient, client)


#: client classes that passed: every lock checks its client, and a Celery worker makes a lock
#: per run (an instance with an evalsha of its own, not its class's, is checked every time)
_checked_types: set[type] = set()
