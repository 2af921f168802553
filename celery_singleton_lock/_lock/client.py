"""What the lock needs of a Redis client, as a type and as a check made before any use."""

from __future__ import annotations

from typing import Any, Protocol, cast

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
    """``client`` when it looks like a redis-py client, else a ``TypeError`` naming
    ``parameter``."""
    if not (hasattr(client, "evalsha") and hasattr(client, "pipeline")):
        raise TypeError(
            f"{parameter} must be a redis-py client (redis.Redis, redis.RedisCluster, or a "
            f"Sentinel master_for(...) client), got {type(client).__name__}"
        )
    return cast(RedisClient, client)
