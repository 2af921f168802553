"""The page's bounds, so that a hung or slow Redis, a big keyspace or a crowd of open tabs
costs little:

- one deadline per request (:data:`REQUEST_SECONDS`): no command is sent once it has passed,
  and the page answers 503 (:func:`check_time` between the steps of a long read);
- the page's own Redis client (:func:`own_client`), whose waits are short
  (:data:`SOCKET_SECONDS`) and never resent: the app's client may wait and resend for a
  task's sake, which would hold a page for tens of seconds;
- a bounded number of requests at once (:data:`MAX_AT_ONCE`), the others answered 503 at
  once instead of piling up threads behind a slow Redis;
- keys found by SCAN, cut at ``most`` locks (:func:`lock_keys`; the page then says "more than
  N: filter", and a filter by text scans for the keys that contain it);
- the rate limiters found by a SCAN that goes on where the last read left it, a bounded
  number of keys per read (:class:`LimiterScan`): a limiter appears within a few reads on a
  big keyspace, and no read pays for the whole keyspace;
- one read for every viewer (:class:`Shared`), so that twenty open tabs cost what one does.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from .._errors import LockBackendError
from .._lock import (
    LockKeys,
    RateKeys,
    backend_errors,
    escape_name,
    glob_escape,
    is_cluster,
    text,
    time_left,
)

__all__ = ["MAX_AT_ONCE", "REQUEST_SECONDS", "LimiterScan", "Shared", "check_time", "own_client"]

T = TypeVar("T")

#: seconds a request may spend on Redis, all its commands together
REQUEST_SECONDS = 2.0
#: seconds one wait on the page's own client may last (connect, or a reply); with the
#: deadline, a request ends within about REQUEST_SECONDS + SOCKET_SECONDS
SOCKET_SECONDS = 0.8
#: requests served at once; more are answered 503 at once
MAX_AT_ONCE = 8
#: keys one SCAN call looks at
SCAN_COUNT = 1000
#: SCAN calls one read of the limiters makes at most
LIMITER_CALLS = 20


def check_time(doing: str) -> None:
    """Raise :class:`LockBackendError` (a 503) once the request's deadline has passed."""
    left = time_left()
    if left is not None and left <= 0:
        raise LockBackendError(
            f"Redis did not answer within {REQUEST_SECONDS:g} s while the page {doing}: it is "
            "slow or hung. The page tries again at its next load."
        )


def own_client(client: Any) -> Any:
    """A client of the same Redis as the app's ``client`` (or of a URL), with connections of
    its own. A Sentinel, Cluster or other client the page cannot copy is used as it is: then
    only the deadline bounds a request."""
    import redis
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    if isinstance(client, str):
        client = redis.Redis.from_url(client)
    pool = getattr(client, "connection_pool", None)
    if type(client) is not redis.Redis or type(pool) is not redis.ConnectionPool:
        return client
    options = {**pool.connection_kwargs, "retry": Retry(NoBackoff(), 0)}
    options.update(socket_timeout=SOCKET_SECONDS, socket_connect_timeout=SOCKET_SECONDS)
    own = redis.ConnectionPool(
        connection_class=pool.connection_class, max_connections=4 * MAX_AT_ONCE, **options
    )
    return redis.Redis(connection_pool=own)


def text_pattern(q: str) -> str:
    """A SCAN pattern matching a lock name that contains ``q`` in any case."""
    out = []
    for c in escape_name(q):
        low, up = c.lower(), c.upper()
        out.append(f"[{low}{up}]" if low != up and len(low) == len(up) == 1 else glob_escape(c))
    return "*" + "".join(out) + "*"


def lock_keys(
    client: Any, prefix: str, most: int, name_pattern: str = "*"
) -> tuple[list[LockKeys], bool]:
    """The keys of the locks (each permit) under ``prefix`` whose name matches
    ``name_pattern`` (a SCAN glob), at most ``most`` of them; and whether that is all."""
    match = f"{glob_escape(prefix)}:{{{name_pattern}}}*"
    found: dict[str, LockKeys] = {}
    with backend_errors("scan", "", f"for the locks under prefix {prefix!r}"):
        for n, raw in enumerate(client.scan_iter(match=match, count=SCAN_COUNT)):
            if n % SCAN_COUNT == 0:
                check_time("looked for the locks")
            try:
                keys = LockKeys.from_lock_key(text(raw))
            except ValueError:  # a lock's meta hash or records: not a lock
                continue
            if keys.prefix != prefix:
                continue
            found[keys.lock] = keys
            if len(found) > most:
                return list(found.values())[:most], False
    return list(found.values()), True


class LimiterScan:
    """The names of the rate limiters under ``prefix``: those a whole pass of the SCAN found,
    and those the pass under way found so far."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self._cursor = 0
        self._known: set[str] = set()
        self._pass: set[str] = set()
        self._lock = threading.Lock()

    def names(self, client: Any) -> set[str]:
        """Go on with the SCAN (at most :data:`LIMITER_CALLS` calls); the names known now."""
        match = f"{glob_escape(self.prefix)}:rate:{{*"
        with self._lock, backend_errors("scan", "", f"for the rate limiters of {self.prefix!r}"):
            if is_cluster(client):  # a cluster's SCAN goes node by node: one whole pass
                self._known = self._parse(client.scan_iter(match=match, count=SCAN_COUNT))
                return set(self._known)
            for _ in range(LIMITER_CALLS):
                check_time("looked for the rate limiters")
                cursor, raws = client.scan(self._cursor, match=match, count=SCAN_COUNT)
                self._pass.update(self._parse(raws))
                self._cursor = int(cursor)
                if self._cursor == 0:  # a whole pass: what it found is what there is
                    self._known, self._pass = self._pass, set()
                    break
            return self._known | self._pass

    def _parse(self, raws: Any) -> set[str]:
        parsed = (RateKeys.from_key(self.prefix, text(raw)) for raw in raws)
        return {keys.name for keys in parsed if keys is not None}


class Shared(Generic[T]):
    """``read()``'s answer shared by every request: read by one request at a time (the others
    wait for it, within their deadline), kept until the end of the clock's current period
    (``fresh`` seconds, doubled until at least twice what the read took), not the viewers':
    however many look, Redis is read once a period at most. An error is not kept."""

    def __init__(self, read: Callable[[], T], fresh: float = 1.0) -> None:
        self._read, self.fresh = read, fresh
        self._lock = threading.Lock()
        self._value: T | None = None
        self._until = 0.0
        #: seconds the last read took
        self.took = 0.0

    def forget(self) -> None:
        """The next request reads again (after a change: its viewer sees what it did)."""
        self._until = 0.0

    def get(self) -> T:
        value = self._value
        if value is not None and time.monotonic() < self._until:
            return value
        left = time_left()
        if not self._lock.acquire(timeout=-1 if left is None else max(left, 0.0)):
            raise LockBackendError(
                "another request's read of Redis did not end in time: Redis is slow or hung"
            )
        try:
            if self._value is not None and time.monotonic() < self._until:
                return self._value  # read by the request this one waited for
            started = time.monotonic()
            value = self._read()
            self.took = time.monotonic() - started
            self._value = value
            period = self.fresh
            while period < 2 * self.took:
                period *= 2
            self._until = (math.floor(time.monotonic() / period) + 1) * period
            return value
        finally:
            self._lock.release()
