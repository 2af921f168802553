"""Checks of the lock's arguments before anything is sent: a ``TypeError`` or ``ValueError``
naming the parameter and what it takes. :func:`check_duration` is the package's one check of
seconds."""

from __future__ import annotations

import inspect
import math
from collections.abc import Sequence
from typing import Any, Protocol, cast

from redis.asyncio import Redis as AsyncRedis
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.client import Pipeline
from redis.cluster import ClusterPipeline

#: The longest lease: ten years, far below what the scripts write exactly (< 2**53 ms).
MAX_LEASE_SECONDS = 10 * 365 * 24 * 3600


def _shown(seconds: float) -> str:
    return str(int(seconds)) if float(seconds).is_integer() else repr(float(seconds))


def check_duration(
    value: object,
    parameter: str,
    *,
    minimum: float = 0.0,
    include_minimum: bool = False,
    maximum: float | None = MAX_LEASE_SECONDS,
    none_means: str = "",
    example: str = "30",
    too_long: str = "",
) -> float:
    """``value`` as float seconds: a finite real number (not a bool) above ``minimum`` (or equal
    with ``include_minimum``), at most ``maximum`` (``None``: unbounded). ``none_means``: what
    ``None`` means to a caller that takes it (and checks it first), for the message;
    ``too_long`` is appended above ``maximum``."""
    or_none = f", or None ({none_means})" if none_means else ""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(
            f"{parameter} must be a number of seconds such as {example}{or_none}, got {value!r}"
        )
    low_ok = math.isfinite(value) and (value >= minimum if include_minimum else value > minimum)
    if low_ok and (maximum is None or value <= maximum):
        return float(value)  # (the message is made for an error only)
    low = f">= {_shown(minimum)}" if include_minimum else f"> {_shown(minimum)}"
    if maximum is None:
        bounds = f"a finite number of seconds {low}"
    else:
        ten_years = " (ten years)" if maximum == MAX_LEASE_SECONDS else ""
        bounds = f"{low} and at most {_shown(maximum)} seconds{ten_years}"
    advice = too_long if low_ok else ""  # (low_ok: above the maximum)
    raise ValueError(f"{parameter} must be {bounds}{or_none}, got {value!r}{advice}")


def check_wait(value: object, parameter: str = "timeout") -> float | None:
    """A wait in seconds: ``None`` (no bound) or a number >= 0."""
    if type(value) in (int, float) and 0 <= value < math.inf:  # type: ignore[operator]
        return float(value)  # type: ignore[arg-type]  # the common case (a try per job)
    if value is None:
        return None
    return check_duration(
        value, parameter, include_minimum=True, maximum=None, none_means="no bound", example="10"
    )


def wait_of(blocking: object, timeout: float | None, default: float | None) -> float | None:
    """The wait of ``acquire(blocking, timeout)`` (``default`` when ``timeout`` is None)."""
    if not isinstance(blocking, bool):
        raise TypeError(f"blocking must be True or False, got {blocking!r}")
    if not blocking and timeout is not None:
        raise ValueError("timeout cannot be given with blocking=False")
    return 0.0 if not blocking else default if timeout is None else check_wait(timeout)


def check_backend_timeout(value: object, parameter: str = "backend_timeout") -> float | None:
    """``None`` (the client's own bounds only) or seconds > 0."""
    if value is None:
        return None
    return check_duration(
        value, parameter, maximum=None, none_means="no bound beyond the client's own", example="5"
    )


def check_lease_ms(value: object, parameter: str = "lease") -> int:
    """A lease in seconds, at least a millisecond, as whole milliseconds."""
    # The common case without check_duration's keywords (a lease is checked per job).
    if type(value) in (int, float) and 0.001 <= value <= MAX_LEASE_SECONDS:  # type: ignore[operator]
        return round(value * 1000)  # type: ignore[operator]
    advice = (
        ": a lease is how long a lock outlives a holder that died; keep it short and let the "
        "heartbeat renew it"
    )
    seconds = check_duration(value, parameter, minimum=0.001, include_minimum=True, too_long=advice)
    return round(seconds * 1000)


class RedisClient(Protocol):
    """A synchronous redis-py client: ``redis.Redis``, ``redis.cluster.RedisCluster`` or a
    Sentinel ``master_for(...)`` client."""

    def evalsha(self, *args: Any, **kwargs: Any) -> Any: ...
    def script_load(self, *args: Any, **kwargs: Any) -> Any: ...
    def pipeline(self, *args: Any, **kwargs: Any) -> Any: ...
    def execute_command(self, *args: Any, **kwargs: Any) -> Any: ...


def check_client(client: object, parameter: str = "client") -> RedisClient:
    """``client`` when it is a synchronous redis-py client, else a ``TypeError``."""
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


#: client classes that passed (an instance with an evalsha of its own is checked every time)
_checked_types: set[type] = set()


def is_cluster(client: object) -> bool:
    """Whether ``client`` is redis-py's cluster client (a pipeline of scripts goes by node)."""
    return hasattr(client, "keyslot") and hasattr(client, "get_nodes")


def by_node(client: Any, keys: Sequence[str]) -> list[tuple[Any, list[int]]]:
    """The indexes of ``keys`` by the node of a cluster ``client`` that serves each, with its
    own client (redis-py refuses EVALSHA in a cluster pipeline, a node's does not); all with
    ``client`` itself for any other client."""
    if not is_cluster(client):
        return [(client, list(range(len(keys))))]
    nodes: dict[str, tuple[Any, list[int]]] = {}
    for index, key in enumerate(keys):
        node = client.get_node_from_key(key)
        nodes.setdefault(node.name, (node.redis_connection, []))[1].append(index)
    return list(nodes.values())
