"""What operators see of the locks under a prefix: found by SCAN (never KEYS), each read
atomically; and a purge of them."""

from __future__ import annotations

import fnmatch
import json
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import asdict, dataclass, replace
from typing import Any

from .._celery.lifecycle import PURGEABLE
from .._lock import LockSpace, LockState, Rate, RateKeys, RateState, backend_errors, is_cluster

#: keys per SCAN call of :func:`find_locks`: a lock is two keys (its hash and its meta hash)
SCAN_COUNT = 5000


@dataclass(frozen=True)
class LockView:
    """One held lock (permit), as ``locks list`` shows it."""

    key: str
    name: str
    task: str | None
    holder: str | None
    host: str | None
    pid: int | None
    state: str | None
    age_s: float | None
    lease_s: float | None
    fence: int | None
    hold_count: int
    #: with a ``lock_limit`` above 1: the job's slots held now, out of its limit ("2/3")
    slots: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"kind": "lock", **asdict(self)}


def _info(state: LockState) -> dict[str, Any]:
    """The hold's operator info (empty when there is none, or it is not a JSON object)."""
    try:
        info = json.loads(state.info) if state.info else {}
    except ValueError:
        return {}
    return info if isinstance(info, dict) else {}


def _limit_of(info: dict[str, Any]) -> int:
    limit = info.get("limit")
    return limit if type(limit) is int and limit > 1 else 1


def job_limit(state: LockState) -> int:
    """The ``lock_limit`` of the job whose permit ``state`` is, as its holder's info says."""
    return _limit_of(_info(state))


def _view(state: LockState, info: dict[str, Any], now: float) -> LockView:
    holder = state.holder
    name = state.keys.name
    return LockView(
        key=state.keys.lock,
        name=name,
        task=info.get("task") or (name.rsplit(":", 1)[0] if ":" in name else None),
        holder=holder,
        host=info.get("host"),
        pid=info.get("pid"),
        state=state.state or ("held" if holder else None),
        age_s=None if state.since is None else max(0.0, now - state.since),
        lease_s=state.lease_left,
        fence=state.fence,
        hold_count=state.owners.get(holder, 0) if holder else 0,
    )


def server_clock(client: Any, subject: str = "the server's clock (TIME)") -> float:
    """The server's clock in Unix seconds (local on a Cluster). Unlike
    :meth:`LockSpace.server_time`, a failing Redis raises :class:`LockBackendError` (about
    ``subject``) at once, rather than an operator's read waiting again on each of its next
    commands."""
    if is_cluster(client):  # its nodes answer one by one
        return time.time()
    with backend_errors("read", "", subject):
        unix, micros = client.time()
    return float(unix) + float(micros) / 1e6


def find_locks(client: Any, prefix: str = "lock", pattern: str = "*") -> list[LockView]:
    """Every held lock under ``prefix`` whose name matches the glob ``pattern``, by key."""
    space = LockSpace(client, prefix)
    now = server_clock(client)
    # A key SCAN returned twice (a rehash) is read once.
    found = list({keys.lock: keys for keys in space.find(pattern, count=SCAN_COUNT)}.values())
    return views_of(space.inspect_many(found), now)


def views_of(states: Iterable[LockState], now: float) -> list[LockView]:
    """The held ones of ``states`` by key (``now``: the server's clock), with the slots held
    of each job of several among them."""
    views: dict[str, LockView] = {}
    limits: dict[str, int] = {}
    for state in states:
        if state.held:
            info = _info(state)
            views[state.keys.lock] = _view(state, info, now)
            if _limit_of(info) > 1:
                limits[state.keys.name] = _limit_of(info)
    in_use = Counter(view.name for view in views.values())
    return [
        replace(v, slots=f"{in_use[v.name]}/{limits[v.name]}") if v.name in limits else v
        for _, v in sorted(views.items())
    ]


def find_limiters(client: Any, prefix: str = "lock", pattern: str = "*") -> list[RateState]:
    """Every ``lock_rate`` limiter under ``prefix`` in use now whose name matches ``pattern``."""
    found = LockSpace(client, prefix).rate_limiters()
    return sorted((r for r in found if fnmatch.fnmatchcase(r.name, pattern)), key=lambda r: r.name)


def limiter_row(state: RateState, prefix: str) -> dict[str, Any]:
    """A limiter as ``locks list`` shows it (``--json``; the page shows these too)."""
    rule = str(Rate(state.limit, state.period)) if state.limit else None
    return {
        "kind": "limiter",
        "key": RateKeys.for_name(prefix, state.name).log,
        "name": state.name,
        "used": f"{state.used}/{state.limit}" if state.limit else str(state.used),
        "rule": rule,
        "limit": state.limit,
        "period_s": state.period,
        "waiting": state.waiting,
        "next_free": state.next_free,
        "paused": state.paused or None,
    }


def show(client: Any, key_or_name: str, prefix: str = "lock") -> LockView | None:
    """One lock, by its Redis key or its name; ``None`` when it is not held."""
    state = LockSpace(client, prefix).inspect(key_or_name)
    return _view(state, _info(state), server_clock(client)) if state.held else None


def purge(client: Any, prefix: str = "lock", pattern: str = "*", queued_only: bool = False) -> int:
    """Force-release every lock under ``prefix`` matching ``pattern``; with ``queued_only``,
    only those held for a message no run has entered (checked in Redis with the release)."""
    space = LockSpace(client, prefix)
    states = PURGEABLE if queued_only else ()
    return sum(space.force_release(keys.lock, states=states) for keys in list(space.find(pattern)))
