"""The page's bounds, so that a hung or slow Redis, or a crowd of open tabs, costs little:

- one deadline per request (:data:`REQUEST_SECONDS`): no command is sent once it has passed,
  and the page answers 503 (:func:`check_time` between the steps of a long read);
- the page's own Redis client (:func:`own_client`), whose waits are short
  (:data:`SOCKET_SECONDS`) and never resent: the app's client may wait and resend for a
  task's sake, which would hold a page for tens of seconds;
- a bounded number of requests at once (:data:`MAX_AT_ONCE`), the others answered 503 at
  once instead of piling up threads behind a slow Redis.
"""

from __future__ import annotations

from typing import Any

from .._errors import LockBackendError
from .._lock import time_left

__all__ = ["MAX_AT_ONCE", "REQUEST_SECONDS", "SOCKET_SECONDS", "check_time", "own_client"]

#: seconds a request may spend on Redis, all its commands together
REQUEST_SECONDS = 2.0
#: seconds one wait on the page's own client may last (connect, or a reply); with the
#: deadline, a request ends within about REQUEST_SECONDS + SOCKET_SECONDS
SOCKET_SECONDS = 0.8
#: requests served at once; more are answered 503 at once
MAX_AT_ONCE = 8


def check_time(doing: str) -> None:
    """Raise :class:`LockBackendError` (a 503) once the request's deadline has passed."""
    left = time_left()
    if left is not None and left <= 0:
        raise LockBackendError(
            f"Redis did not answer within {REQUEST_SECONDS:g} s while the page {doing}: it is "
            "slow or hung. The page tries again at its next load."
        )


def _no_resend() -> Any:
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    return Retry(NoBackoff(), 0)


def url_client(url: str) -> Any:
    """The page's client of the Redis at ``url``: short waits, no resend."""
    import redis

    return redis.Redis.from_url(
        url,
        socket_timeout=SOCKET_SECONDS,
        socket_connect_timeout=SOCKET_SECONDS,
        retry=_no_resend(),
        max_connections=4 * MAX_AT_ONCE,
    )


def own_client(client: Any) -> Any:
    """A client of the same Redis as the app's ``client`` with the page's short waits and no
    resend (its own connections). A Sentinel, Cluster or other client the page cannot copy
    is used as it is: then only the deadline bounds a request."""
    import redis

    pool = getattr(client, "connection_pool", None)
    if type(client) is not redis.Redis or type(pool) is not redis.ConnectionPool:
        return client
    options = {**pool.connection_kwargs}
    options.update(
        socket_timeout=SOCKET_SECONDS,
        socket_connect_timeout=SOCKET_SECONDS,
        retry=_no_resend(),
    )
    own = redis.ConnectionPool(
        connection_class=pool.connection_class, max_connections=4 * MAX_AT_ONCE, **options
    )
    return redis.Redis(connection_pool=own)
