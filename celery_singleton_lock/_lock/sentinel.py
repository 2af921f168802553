"""Following a Sentinel master across a failover, for connections that are already open.

redis-py's Sentinel pool asks Sentinel for the master only when a connection is made; an open
connection keeps talking to the old master until that server is demoted, which Sentinel does
only some seconds after it promoted a replica. Meanwhile the old master still takes writes: a
holder renewing there keeps a lease that no longer counts, while the new master's copy runs
out and a contender takes it. The lock asks Sentinel before each renewal batch, and at most
once a second before an acquire, and when the master moved closes the pool's idle connections
(redis-py's own reaction to a new address), so the next command goes to the new master.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from redis.exceptions import RedisError
from redis.sentinel import SentinelConnectionPool

log = logging.getLogger("celery_singleton_lock.sentinel")

#: the longest an acquire trusts the master address it last checked, in seconds
ACQUIRE_CHECK_INTERVAL = 1.0


def master_pool(client: Any) -> Any:
    """The client's Sentinel master pool, or ``None`` for any other client."""
    pool = getattr(client, "connection_pool", None)
    if isinstance(pool, SentinelConnectionPool) and pool.is_master:
        return pool
    return None


class MasterFollower:
    """Follows the master of one Sentinel master client (its client's runtime has one)."""

    __slots__ = ("_checked_at", "_mutex", "_pool")

    def __init__(self, pool: Any) -> None:
        self._pool = pool
        self._mutex = threading.Lock()
        #: monotonic time Sentinel was last asked (None: never)
        self._checked_at: float | None = None

    def follow(self, max_age: float = 0.0) -> None:
        """Ask Sentinel where the master is (unless asked within ``max_age`` seconds), and
        move the client's idle connections there if it moved. A Sentinel that cannot answer
        is logged, never raised: the commands go on to the master known so far."""
        pool = self._pool  # redis-py's Sentinel module is not annotated
        now = time.monotonic()
        with self._mutex:
            if max_age and self._checked_at is not None and now - self._checked_at < max_age:
                return
            self._checked_at = now
        before = pool.master_address
        try:
            after = pool.get_master_address()
        except RedisError as exc:
            log.warning("could not ask Sentinel for the master of %s: %s", pool.service_name, exc)
            return
        if before is not None and after != before:
            log.warning(
                "Sentinel master of %s moved from %s to %s: the lock's connections follow it",
                pool.service_name,
                before,
                after,
            )
