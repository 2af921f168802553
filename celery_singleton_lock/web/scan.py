"""How the page finds keys without reading the whole keyspace per view.

- :func:`lock_keys`: the lock keys under a prefix, by SCAN, cut at ``most`` (the page then says
  "more than N: filter"); with a text, only keys that contain it (a SCAN pattern, any case).
- :class:`LimiterScan`: the rate limiters under a prefix, by a SCAN that goes on where the last
  read left it, a bounded number of keys per read: a limiter appears within a few reads on a
  big keyspace, at the first one on a small one, and no read pays for the whole keyspace.
- :class:`Shared`: one read for every viewer (single flight), fresh for a second or so (longer
  after a slow read), so that twenty open tabs cost Redis what one does.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from typing import Generic, TypeVar

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
from .bounds import check_time

__all__ = ["LimiterScan", "Shared", "lock_keys", "text_pattern"]

T = TypeVar("T")

#: keys one SCAN call looks at
SCAN_COUNT = 1000
#: SCAN calls one read of the limiters makes at most (SCAN_COUNT keys each)
LIMITER_CALLS = 20


def text_pattern(q: str) -> str:
    """A SCAN pattern matching a lock name that contains ``q`` in any case."""
    out = []
    for c in escape_name(q):
        low, up = c.lower(), c.upper()
        out.append(f"[{low}{up}]" if low != up and len(low) == len(up) == 1 else glob_escape(c))
    return "*" + "".join(out) + "*"


def lock_keys(
    client: object, prefix: str, most: int, name_pattern: str = "*"
) -> tuple[list[LockKeys], bool]:
    """The keys of the locks (each permit) under ``prefix`` whose name matches
    ``name_pattern`` (a SCAN glob, see :func:`text_pattern`), at most ``most`` of them; and
    whether that is all of them."""
    match = f"{glob_escape(prefix)}:{{{name_pattern}}}*"
    found: dict[str, LockKeys] = {}
    with backend_errors("scan", "", f"for the locks under prefix {prefix!r}"):
        for n, raw in enumerate(client.scan_iter(match=match, count=SCAN_COUNT)):  # type: ignore[attr-defined]
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

    def names(self, client: object) -> set[str]:
        """Go on with the SCAN (at most :data:`LIMITER_CALLS` calls); the names known now."""
        match = f"{glob_escape(self.prefix)}:rate:{{*"
        with self._lock, backend_errors("scan", "", f"for the rate limiters of {self.prefix!r}"):
            if is_cluster(client):  # a cluster's SCAN goes node by node: one whole pass
                found = client.scan_iter(match=match, count=SCAN_COUNT)  # type: ignore[attr-defined]
                self._known = {k.name for k in self._parse(found)}
                return set(self._known)
            for _ in range(LIMITER_CALLS):
                check_time("looked for the rate limiters")
                cursor, raws = client.scan(self._cursor, match=match, count=SCAN_COUNT)  # type: ignore[attr-defined]
                self._pass.update(k.name for k in self._parse(raws))
                self._cursor = int(cursor)
                if self._cursor == 0:  # a whole pass: what it found is what there is
                    self._known, self._pass = self._pass, set()
                    break
            return self._known | self._pass

    def _parse(self, raws: object) -> list[RateKeys]:
        parsed = (RateKeys.from_key(self.prefix, text(raw)) for raw in raws)  # type: ignore[attr-defined]
        return [keys for keys in parsed if keys is not None]


class Shared(Generic[T]):
    """``read()``'s answer shared by every request: read by one request at a time (the others
    wait for it, within their deadline), kept until the end of the clock's current period:
    ``fresh`` seconds, doubled until it is at least twice as long as the read took. The
    periods are the clock's, not the viewers': however many look, Redis is read once a
    period at most, as it is for one viewer who reloads as fast as the page answers. An
    error is not kept: the next request reads again."""

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
