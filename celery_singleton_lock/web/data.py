"""What the page reads and changes in Redis, as ``celery locks list`` reads it, and its bounds
(a hung Redis, a big keyspace or many open tabs cost little): one deadline per request, a
client of its own with short waits, a SCAN cut at ``max_locks``, one read for every viewer."""

from __future__ import annotations

import hashlib
import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from .._celery.lifecycle import HoldState
from .._celery.task import LockedTask
from .._errors import LockBackendError
from .._lock import (
    LockKeys,
    LockSpace,
    RateKeys,
    RateLimiter,
    RateState,
    backend_errors,
    glob_escape,
    inspect_rate,
    is_cluster,
    text,
    time_left,
)
from .._ops import locks as ops
from .._ops.counts import RecentCounts, recent_counts
from .._ops.locks import LockView

__all__ = ["DIGEST", "LIMITER", "STATES", "Listing", "Source", "digest"]

#: seconds a request may spend on Redis, all its commands together
REQUEST_SECONDS = 2.0
#: seconds one wait on the page's own client may last (a request ends within the sum)
SOCKET_SECONDS = 0.8
#: requests served at once; more are answered 503
MAX_AT_ONCE = 8
SCAN_COUNT = 1000
#: SCAN calls one read of the limiters makes at most
LIMITER_CALLS = 20
#: locks inspected per round trip, the deadline checked between them
BATCH = 500
DIGEST = 24

#: the ``state`` filter of the rate limiters
LIMITER = "limiter"
STATES = ("held", "running", "queued", "requeued", "cooldown", "debounced", LIMITER)
#: a beat leader lock's name starts with it (celery_singleton_lock.beat)
BEAT = "beat:"
#: a queued hold of a task with ``lock_debounce`` is a call waiting out its debounce
DEBOUNCED = "debounced"


def check_time(doing: str) -> None:
    """Raise :class:`LockBackendError` (a 503) once the request's deadline has passed."""
    left = time_left()
    if left is not None and left <= 0:
        raise LockBackendError(
            f"Redis did not answer within {REQUEST_SECONDS:g} s while the page {doing}: it is "
            "slow or hung. The page tries again at its next load."
        )


def own_client(client: Any) -> Any:
    """A client of the app's Redis (or a URL's) with its own connections, whose waits are
    short and never resent (the app's may be, for a task's sake). A Sentinel or Cluster
    client is used as it is: the deadline bounds it."""
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


class LimiterScan:
    """The rate limiters under ``prefix``: a SCAN that goes on where the last read left it,
    a few calls per read; those of the last whole pass and those the one under way found."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self._cursor = 0
        self._known: set[str] = set()
        self._pass: set[str] = set()
        self._lock = threading.Lock()

    def names(self, client: Any) -> set[str]:
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


class Shared:
    """``read()``'s answer shared by every request: read by one at a time (the others wait,
    within their deadline), kept until the end of the clock's current period (``fresh``
    seconds, doubled to twice the read's time at least): Redis is read once a period at most,
    however many look. An error is not kept."""

    _value: Listing  # set once _until is (it starts at 0.0: nothing kept)

    def __init__(self, read: Callable[[], Listing], fresh: float = 1.0) -> None:
        self._read, self.fresh = read, fresh
        self._lock = threading.Lock()
        self._until = 0.0
        self.took = 0.0  # seconds the last read took

    def forget(self) -> None:
        """The next request reads again (after a change: its viewer sees what it did)."""
        self._until = 0.0

    def get(self) -> Listing:
        if time.monotonic() < self._until:
            return self._value
        left = time_left()
        if not self._lock.acquire(timeout=-1 if left is None else max(left, 0.0)):
            raise LockBackendError(
                "another request's read of Redis did not end in time: Redis is slow or hung"
            )
        try:
            if time.monotonic() < self._until:
                return self._value  # read by the request this one waited for
            started = time.monotonic()
            self._value = self._read()
            self.took = time.monotonic() - started
            period = self.fresh
            while period < 2 * self.took:
                period *= 2
            self._until = (math.floor(time.monotonic() / period) + 1) * period
            return self._value
        finally:
            self._lock.release()


def digest(key: str) -> str:
    """A short name of ``key`` for its links (SHA-256, the first hex digits)."""
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()[:DIGEST]


def matches(view: LockView, q: str, state: str) -> bool:
    """Whether a lock passes the filter (``q``: a substring of its task or key)."""
    if state and view.state != state:
        return False
    if q:
        q = q.lower()
        return q in view.key.lower() or q in (view.task or "").lower()
    return True


@dataclass(frozen=True)
class Listing:
    """One read of the locks under the prefixes (and, for the list, the rest it shows)."""

    locks: list[LockView]
    leaders: list[LockView]
    limiters: list[tuple[str, RateState]]
    #: whether ``locks`` is every lock held (not cut at ``max_locks``)
    complete: bool = True
    counts: RecentCounts | None = None
    #: each filter's rows, picked once: a shared read serves many views of few filters
    picked: dict[tuple[str, str, bool], list[LockView]] = field(default_factory=dict)

    def pick(self, q: str, state: str, newest_first: bool) -> list[LockView]:
        """The locks the filter lets through, oldest (or newest) first, of no known age last."""
        key = (q, state, newest_first)
        found = self.picked.get(key)
        if found is None:
            views = [v for v in self.locks if matches(v, q, state)]
            found = [v for v in views if v.age_s is not None]
            found.sort(key=lambda v: (v.age_s or 0.0, v.key), reverse=not newest_first)
            found += [v for v in views if v.age_s is None]
            if len(self.picked) < 32:  # (a crafted stream of filters keeps no more)
                self.picked[key] = found
        return found


class Source:
    """The Redis client and prefixes the page covers, and the Celery app (or ``None``)."""

    def __init__(
        self, client: Any, prefixes: Sequence[str], celery_app: Any = None, max_locks: int = 2000
    ) -> None:
        self.client = client
        self.prefixes = list(prefixes)
        self.celery_app = celery_app
        self.max_locks = max_locks
        self._limiter_scans = {prefix: LimiterScan(prefix) for prefix in self.prefixes}
        self.shared = Shared(self._read_list)

    def _labelled(self, view: LockView) -> LockView:
        """``view``, "debounced" when queued for a task of the app with ``lock_debounce``."""
        if view.state != HoldState.QUEUED or view.task is None or self.celery_app is None:
            return view
        found = self.celery_app.tasks.get(view.task)
        if isinstance(found, LockedTask) and found.locking.options.lock_debounce is not None:
            return replace(view, state=DEBOUNCED)
        return view

    def _read_locks(self, name_pattern: str = "*") -> Listing:
        """At most ``max_locks`` locks whose names match ``name_pattern`` (a SCAN glob), beat
        leaders apart; ``complete`` unless more were found."""
        keys: dict[str, LockKeys] = {}
        complete = True
        for prefix in self.prefixes:
            scan = LockSpace(self.client, prefix).find(name_pattern, count=SCAN_COUNT)
            for n, found in enumerate(scan):
                if n % SCAN_COUNT == 0:
                    check_time("looked for the locks")
                if found.prefix == prefix:
                    keys[found.lock] = found
                if len(keys) > self.max_locks:
                    keys.popitem()
                    complete = False
                    break
        now = ops.server_clock(self.client)
        every, states = list(keys.values()), []
        for start in range(0, len(every), BATCH):
            check_time("read the locks")
            chunk = every[start : start + BATCH]
            states += LockSpace(self.client, chunk[0].prefix).inspect_many(chunk)
        held = ops.views_of(states, now)
        leaders = [v for v in held if v.name.startswith(BEAT)]  # in locks too, as the CLI shows
        return Listing([self._labelled(v) for v in held], leaders, [], complete)

    def _read_list(self) -> Listing:
        """The locks, the limiters in use and the last hour's counts, summed over prefixes."""
        listing = self._read_locks()
        limiters = []
        for prefix, scan in self._limiter_scans.items():
            for name in sorted(scan.names(self.client)):
                check_time("read the rate limiters")
                state = inspect_rate(self.client, RateKeys.for_name(prefix, name))
                if state.used or state.waiting or state.paused:
                    limiters.append((prefix, state))
        every = [recent_counts(self.client, prefix, 60) for prefix in self.prefixes]
        counts = RecentCounts(
            60,
            {k: sum(c.duplicates.get(k, 0) for c in every) for k in every[0].duplicates},
            {k: sum(c.refusals.get(k, 0) for c in every) for k in every[0].refusals},
            sum(c.lost for c in every),
        )
        return replace(listing, limiters=limiters, counts=counts)

    def read(self, q: str = "", fresh: bool = False) -> Listing:
        """The shared read (``fresh``: one of its own, as a change needs), or when it was cut
        at ``max_locks``, a read of the locks whose names contain ``q``."""
        listing = self._read_locks() if fresh else self.shared.get()
        if not q or listing.complete:
            return listing
        out = []  # a SCAN glob of the lock names that contain q in any case
        for c in q:
            low, up = c.lower(), c.upper()
            out.append(f"[{low}{up}]" if low != up and len(low) == len(up) == 1 else glob_escape(c))
        return self._read_locks("*" + "".join(out) + "*")

    def key_of_digest(self, short: str) -> str | None:
        """The key of a held lock or limiter in use whose :func:`digest` is ``short``."""
        for read in (self.shared.get, self._read_locks):  # a fresh read only if needed
            listing = read()
            keys = [v.key for v in (*listing.locks, *listing.leaders)]
            keys += [RateKeys.for_name(p, r.name).log for p, r in listing.limiters]
            found = next((k for k in keys if digest(k) == short), None)
            if found is not None:
                return found
        return None

    def prefix_of(self, key: str) -> str | None:
        return next((p for p in self.prefixes if key.startswith(f"{p}:{{")), None)

    def limiter_of(self, key: str) -> RateKeys | None:
        return next(filter(None, (RateKeys.from_key(p, key) for p in self.prefixes)), None)

    def lock(self, key: str) -> tuple[LockView, list[LockView]] | None:
        """One held lock by its key and the job's other held permits (``None``: not held)."""
        prefix = self.prefix_of(key)
        if prefix is None:
            return None
        space = LockSpace(self.client, prefix)
        state = space.inspect(key)
        if not state.held:
            return None
        limit = ops.job_limit(state)
        permits = space.named(state.keys.name, limit).keys if limit > 1 else [state.keys]
        held = [
            self._labelled(v)
            for v in ops.views_of(space.inspect_many(permits), ops.server_clock(self.client))
        ]
        view = next((v for v in held if v.key == state.keys.lock), None)
        if view is None:  # released between the two reads
            return None
        return view, [v for v in held if v.key != view.key]

    def result_state(self, view: LockView) -> str | None:
        """The Celery result state of the task holding ``view`` (``None``: not a task's)."""
        if self.celery_app is None or view.holder is None or view.task is None:
            return None
        try:
            return str(self.celery_app.AsyncResult(view.holder).state)
        except Exception as exc:  # a result backend down or absent: said on the page
            return f"unknown ({type(exc).__name__})"

    def release(self, key: str, holder: str | None) -> str:
        """Free one lock (only from ``holder`` when given) or reset one limiter: ``released``,
        ``reset``, ``not-held`` or ``not-in-use``."""
        self.shared.forget()
        limiter = self.limiter_of(key)
        if limiter is not None:
            done = RateLimiter(self.client, limiter.name, "1/s", prefix=limiter.prefix).reset()
            return "reset" if done else "not-in-use"
        prefix = self.prefix_of(key)
        if prefix is None:
            return "not-held"
        done = LockSpace(self.client, prefix).force_release(key, holder=holder or None)
        return "released" if done else "not-held"

    def purge(self, views: Sequence[LockView], state: str = "") -> int:
        """Free each of ``views`` from the holder it was read with; with the filter's
        ``state``, only while still in it, checked in Redis in the same step (a run started
        since keeps its lock; a running hold is freed from its holder). How many were freed."""
        held = HoldState.QUEUED if state == DEBOUNCED else state
        states = (HoldState(held),) if held in ("queued", "requeued", "cooldown") else ()
        self.shared.forget()
        freed = 0
        for view in views:
            prefix = self.prefix_of(view.key)
            if prefix is not None:
                check_time("purged the locks")
                space = LockSpace(self.client, prefix)
                freed += space.force_release(view.key, holder=view.holder or None, states=states)
        return freed
