"""What the page reads and changes in Redis: the locks, limiters and beat leaders under the
prefixes it covers (as ``celery locks list`` reads them), filtered, sorted and paged in Python
after one read (bounded as :mod:`.bounds` says); a lock's details; a release, a reset and a
purge."""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from .._celery.hold import HoldState
from .._celery.task import LockedTask
from .._lock import LockKeys, LockSpace, RateKeys, RateLimiter, RateState, inspect_rate
from .._ops import locks as ops
from .._ops.counts import RecentCounts, recent_counts
from .._ops.locks import LockView
from .bounds import LimiterScan, Shared, check_time, lock_keys, text_pattern

__all__ = ["DIGEST", "LIMITER", "STATES", "Listing", "Source", "digest"]

#: the ``state`` filter that shows the rate limiters only
LIMITER = "limiter"
#: what the ``state`` filter accepts
STATES = ("held", "running", "queued", "requeued", "cooldown", "debounced", LIMITER)
#: a beat leader lock's name starts with it (celery_singleton_lock.beat)
BEAT = "beat:"
#: a queued hold of a task with ``lock_debounce`` is a call waiting out its debounce
DEBOUNCED = "debounced"

#: the hold states (lua/force_release.lua) a purge filtered by a page state frees only in;
#: a run's hold ("running") records its run, which that check refuses: it is freed from the
#: holder the page read, as a plain lock ("held") is
_HOLD_STATES = {
    HoldState.QUEUED: (HoldState.QUEUED,),
    DEBOUNCED: (HoldState.QUEUED,),
    HoldState.REQUEUED: (HoldState.REQUEUED,),
    HoldState.COOLDOWN: (HoldState.COOLDOWN,),
}
#: hex digits of a key's digest
DIGEST = 24
#: locks inspected per round trip (a pipeline), the deadline checked between them
BATCH = 500


def digest(key: str) -> str:
    """A short name of ``key`` for its links (SHA-256, the first hex digits)."""
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()[:DIGEST]


@dataclass(frozen=True)
class Listing:
    """One read of the locks under the prefixes (and, for the list, the rest it shows)."""

    locks: list[LockView]
    leaders: list[LockView]
    #: (prefix, limiter) pairs
    limiters: list[tuple[str, RateState]]
    #: whether ``locks`` is every lock held (not cut at ``max_locks``)
    complete: bool = True
    counts: RecentCounts | None = None
    #: the rows of each (text, state, newest first) asked of this read, filtered and sorted
    #: once: a shared read serves many views of few filters
    picked: dict[tuple[str, str, bool], list[LockView]] = field(
        default_factory=dict, compare=False, repr=False
    )

    def pick(self, q: str, state: str, newest_first: bool) -> list[LockView]:
        """The locks the filter ``q`` and ``state`` lets through, sorted by age."""
        key = (q, state, newest_first)
        found = self.picked.get(key)
        if found is None:
            found = sort_views([v for v in self.locks if matches(v, q, state)], newest_first)
            if len(self.picked) < 32:  # (a crafted stream of filters keeps no more)
                self.picked[key] = found
        return found


def matches(view: LockView, q: str, state: str) -> bool:
    """Whether a lock row passes the filter (``q``: a substring of its task or key)."""
    if state and view.state != state:
        return False
    if q:
        q = q.lower()
        return q in view.key.lower() or q in (view.task or "").lower()
    return True


def sort_views(views: list[LockView], newest_first: bool) -> list[LockView]:
    """Oldest first (``newest_first``: the reverse); locks of no known age last, by key."""
    known = [v for v in views if v.age_s is not None]
    known.sort(key=lambda v: (v.age_s or 0.0, v.key), reverse=not newest_first)
    return known + [v for v in views if v.age_s is None]


class Source:
    """The Redis client and prefixes the page covers, and the Celery app (or ``None``)."""

    def __init__(
        self, client: Any, prefixes: Sequence[str], celery_app: Any = None, max_locks: int = 2000
    ) -> None:
        self.client = client
        self.prefixes = list(prefixes)
        self.celery_app = celery_app
        self.max_locks = max_locks
        self._debounced: dict[str, bool] = {}
        self._limiter_scans = {prefix: LimiterScan(prefix) for prefix in self.prefixes}
        #: the list's read, shared by every viewer
        self.shared: Shared[Listing] = Shared(self._read_list)

    def _labelled(self, view: LockView) -> LockView:
        """``view``, "debounced" when queued for a task of the app with ``lock_debounce``."""
        task = view.task
        if view.state != HoldState.QUEUED or task is None or self.celery_app is None:
            return view
        if task not in self._debounced:
            found = self.celery_app.tasks.get(task)
            options = getattr(getattr(found, "locking", None), "options", None)
            self._debounced[task] = isinstance(found, LockedTask) and (
                getattr(options, "lock_debounce", None) is not None
            )
        return replace(view, state=DEBOUNCED) if self._debounced[task] else view

    def _read_locks(self, name_pattern: str = "*") -> Listing:
        """The held locks whose names match ``name_pattern`` (a SCAN glob), at most
        ``max_locks`` of them, and the beat leaders among them."""
        found: list[LockKeys] = []
        complete = True
        for prefix in self.prefixes:
            keys, whole = lock_keys(self.client, prefix, self.max_locks - len(found), name_pattern)
            found += keys
            complete = complete and whole
        now = ops.server_clock(self.client)
        states = []
        for start in range(0, len(found), BATCH):
            check_time("read the locks")
            chunk = found[start : start + BATCH]
            states += LockSpace(self.client, chunk[0].prefix).inspect_many(chunk)
        locks: list[LockView] = []
        leaders: list[LockView] = []
        for view in ops.views_of(states, now):
            if view.name.startswith(BEAT):  # held too, as `celery locks list` shows it
                leaders.append(view)
            locks.append(self._labelled(view))
        return Listing(locks, leaders, [], complete)

    def _read_list(self) -> Listing:
        """The list's read: the locks, the rate limiters in use (a start in the window, a
        turn reserved or a pause) and the recent counts."""
        listing = self._read_locks()
        limiters = []
        for prefix, scan in self._limiter_scans.items():
            for name in sorted(scan.names(self.client)):
                check_time("read the rate limiters")
                state = inspect_rate(self.client, RateKeys.for_name(prefix, name))
                if state.used or state.waiting or state.paused:
                    limiters.append((prefix, state))
        return replace(listing, limiters=limiters, counts=self.counts())

    def read(self, q: str = "", fresh: bool = False) -> Listing:
        """The locks a view of the text filter ``q`` is picked from: the shared read (or,
        ``fresh``, a read of its own, as a change needs), or when that read was cut at
        ``max_locks``, a read of the locks whose names contain ``q``."""
        listing = self._read_locks() if fresh else self.shared.get()
        if q and not listing.complete:
            return self._read_locks(text_pattern(q))
        return listing

    def key_of_digest(self, short: str) -> str | None:
        """The key of a held lock or limiter in use whose :func:`digest` is ``short``, among
        those the page lists (``None``: none is)."""
        for listing in (self.shared.get(), self._read_locks()):
            keys = [v.key for v in (*listing.locks, *listing.leaders)]
            keys += [RateKeys.for_name(p, r.name).log for p, r in listing.limiters]
            found = next((k for k in keys if digest(k) == short), None)
            if found is not None:
                return found
        return None

    def counts(self, minutes: int = 60) -> RecentCounts:
        """The last ``minutes``' counts, summed over the prefixes."""
        every = [recent_counts(self.client, prefix, minutes) for prefix in self.prefixes]
        duplicates: Counter[str] = Counter()
        refusals: Counter[str] = Counter()
        for counts in every:
            duplicates.update(counts.duplicates)
            refusals.update(counts.refusals)
        lost = sum(c.lost for c in every)
        return RecentCounts(minutes, dict(duplicates), dict(refusals), lost)

    def prefix_of(self, key: str) -> str | None:
        return next((p for p in self.prefixes if key.startswith(f"{p}:{{")), None)

    def limiter_of(self, key: str) -> RateKeys | None:
        return next(filter(None, (RateKeys.from_key(p, key) for p in self.prefixes)), None)

    def lock(self, key: str) -> tuple[LockView, list[LockView]] | None:
        """One held lock by its key, with the job's other held permits (a ``lock_limit``
        above 1: its slots then say how many are held); ``None`` when it is not held."""
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
        """Free each of ``views`` from the holder it was read with (a lock taken again since
        by another holder stays); with the filter's ``state``, only while the hold is still
        in it, checked in Redis in the same step (as ``celery locks purge --queued``): a run
        that started since the read keeps its lock. How many were freed."""
        states = _HOLD_STATES.get(state, ())
        self.shared.forget()
        freed = 0
        for view in views:
            prefix = self.prefix_of(view.key)
            if prefix is not None:
                check_time("purged the locks")
                space = LockSpace(self.client, prefix)
                freed += space.force_release(view.key, holder=view.holder or None, states=states)
        return freed
