"""What one row or field of the page shows: durations, dashes for the unknown, links."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

from .._lock import Rate, RateKeys, RateState
from .._ops.locks import LockView
from .data import BEAT, digest

__all__ = [
    "digest",
    "duration",
    "fields",
    "key_query",
    "leader",
    "limiter",
    "limiter_key",
    "lock",
    "message",
]

#: a key longer than this is linked by its digest (a URL must stay short enough to send)
LONG_KEY = 256


def key_query(key: str) -> dict[str, str]:
    """How a link names ``key``: itself, or when long, its digest (``d``)."""
    return {"key": key} if len(key) <= LONG_KEY else {"d": digest(key)}


#: what a finished action says above the list (its outcome cookie's code and detail, see
#: :mod:`.outcome`); only these texts are shown
_MESSAGES = {
    "released": "Released {}.",
    "not-held": "{} was not held: nothing released.",
    "reset": "Reset the rate limiter {}.",
    "not-in-use": "The rate limiter {} was not in use: nothing reset.",
    "purged": "Released {} lock(s).",
}


def duration(seconds: float | None) -> str:
    """``seconds`` for a person: "42.0 s", "3 m 05 s", "2 h 03 m"; "-" when unknown, "none"
    for no lease (-1)."""
    if seconds is None:
        return "-"
    if seconds < 0:
        return "none"
    if seconds < 60:
        return f"{seconds:.1f} s"
    whole = int(seconds)
    if whole < 3600:
        return f"{whole // 60} m {whole % 60:02d} s"
    return f"{whole // 3600} h {whole % 3600 // 60:02d} m"


def _text(value: Any) -> str:
    return "-" if value is None or value == "" else str(value)


def lock(view: LockView) -> dict[str, Any]:
    """A row of ``#locks`` (and of a lock's other permits)."""
    return {
        "key": view.key,
        "state": view.state or "held",
        "task": _text(view.task),
        "holder": _text(view.holder),
        "host": _text(view.host),
        "pid": _text(view.pid),
        "age": duration(view.age_s),
        "age_s": "" if view.age_s is None else f"{view.age_s:.3f}",
        "lease": duration(view.lease_s),
        "slots": _text(view.slots),
        "detail_href": "lock?" + urlencode(key_query(view.key)),
        "release_href": "release?" + urlencode(key_query(view.key)),
    }


def limiter_key(prefix: str, state: RateState) -> str:
    return RateKeys.for_name(prefix, state.name).log


def limiter(prefix: str, state: RateState) -> dict[str, Any]:
    """A row of ``#limiters``, as ``celery locks list`` shows it."""
    key = limiter_key(prefix, state)
    return {
        "key": key,
        "used": f"{state.used}/{state.limit}" if state.limit else str(state.used),
        "rule": str(Rate(state.limit, state.period)) if state.limit else "-",
        "waiting": str(state.waiting),
        "next_free": duration(state.next_free),
        "paused": duration(state.paused) if state.paused else "-",
        "release_href": "release?" + urlencode(key_query(key)),
    }


def leader(view: LockView) -> dict[str, Any]:
    """A row of ``#beat``: a beat leader lock (``<prefix>:{beat:<app>}``)."""
    return {
        "key": view.key,
        "app": view.name[len(BEAT) :],
        "holder": _text(view.holder),
        "host": _text(view.host),
        "pid": _text(view.pid),
        "since": duration(view.age_s),
        "lease": duration(view.lease_s),
        "detail_href": "lock?" + urlencode(key_query(view.key)),
    }


def fields(view: LockView, result: str | None) -> list[tuple[str, str, str]]:
    """The ``(field, title, text)`` of a lock's page."""
    return [
        ("task", "Task", _text(view.task)),
        ("key", "Key", view.key),
        ("state", "State", view.state or "held"),
        ("holder", "Holder", _text(view.holder)),
        ("host", "Host", _text(view.host)),
        ("pid", "PID", _text(view.pid)),
        ("fence", "Fence", _text(view.fence)),
        ("holds", "Holds", str(view.hold_count)),
        ("age", "Age", duration(view.age_s)),
        ("lease", "Lease left", duration(view.lease_s)),
        ("slots", "Slots", _text(view.slots)),
        ("result", "Result state", _text(result)),
    ]


def message(done: tuple[str, str] | None) -> str | None:
    """The banner of a change's outcome ``(code, detail)``, or ``None``."""
    if done is None:
        return None
    code, detail = done
    if code not in _MESSAGES or not detail:
        return None
    if code == "purged" and not detail.isdecimal():
        return None
    return _MESSAGES[code].format(detail)
