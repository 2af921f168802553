"""Per-task lock options (SPEC §4): names, defaults and validation at decoration time."""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["OPTION_NAMES", "LockOptions", "validate_options"]

LOCK_AT = ("run", "publish")
ON_DUPLICATE = ("return", "raise")
ON_LOCKED = ("skip", "retry", "raise", "wait")

OPTION_NAMES = (
    "lock_at",
    "lock_release_on_start",
    "lock_unique_on",
    "lock_key",
    "lock_ttl",
    "lock_queue_ttl",
    "lock_on_duplicate",
    "lock_on_locked",
    "lock_wait_timeout",
    "lock_retry_countdown",
)


def _choice(task: str, name: str, value: object, choices: Sequence[str]) -> str:
    if value not in choices:
        raise ValueError(
            f"task {task!r}: {name} must be one of {', '.join(map(repr, choices))}, got {value!r}"
        )
    return str(value)


def _seconds(task: str, name: str, value: object, *, allow_none: bool = True) -> float | None:
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise TypeError(f"task {task!r}: {name} must be a number of seconds, got {value!r}")
    if value <= 0:
        raise ValueError(f"task {task!r}: {name} must be > 0 seconds, got {value!r}")
    return float(value)


@dataclass(frozen=True)
class LockOptions:
    """One task's validated options; ``None`` for a lease means "the app setting"."""

    lock_at: str = "run"
    lock_release_on_start: bool = False
    lock_unique_on: tuple[str, ...] | None = None
    lock_key: Callable[..., str] | None = None
    lock_ttl: float | None = None
    lock_queue_ttl: float | None = None
    lock_on_duplicate: str = "return"
    lock_on_locked: str = "skip"
    lock_wait_timeout: float = 10.0
    lock_retry_countdown: float | None = None


def validate_options(
    task: str, raw: Mapping[str, Any], signature: inspect.Signature | None = None
) -> LockOptions:
    """Check every option and return them; the error names the task and the option."""
    unknown = sorted(set(raw) - set(OPTION_NAMES))
    if unknown:
        raise TypeError(
            f"task {task!r}: unknown lock option(s) {', '.join(unknown)}; "
            f"the options are {', '.join(OPTION_NAMES)}"
        )
    opts: dict[str, Any] = {}
    if "lock_at" in raw:
        opts["lock_at"] = _choice(task, "lock_at", raw["lock_at"], LOCK_AT)
    if "lock_release_on_start" in raw:
        value = raw["lock_release_on_start"]
        if not isinstance(value, bool):
            raise TypeError(f"task {task!r}: lock_release_on_start must be True or False")
        opts["lock_release_on_start"] = value
    if raw.get("lock_unique_on") is not None:
        names = raw["lock_unique_on"]
        if (
            isinstance(names, str)
            or not isinstance(names, (list, tuple))
            or not all(isinstance(n, str) for n in names)
        ):
            raise TypeError(
                f"task {task!r}: lock_unique_on must be a list of parameter names, got {names!r}"
            )
        if signature is not None:
            params = signature.parameters
            has_var_kw = any(p.kind is p.VAR_KEYWORD for p in params.values())
            missing = [n for n in names if n not in params and not has_var_kw]
            if missing:
                raise ValueError(
                    f"task {task!r}: lock_unique_on names {missing} that are not parameters "
                    f"of the task; its parameters are {list(params)}"
                )
        opts["lock_unique_on"] = tuple(names)
    if raw.get("lock_key") is not None:
        if not callable(raw["lock_key"]):
            raise TypeError(
                f"task {task!r}: lock_key must be a callable(*args, **kwargs) -> str, "
                f"got {raw['lock_key']!r}"
            )
        opts["lock_key"] = raw["lock_key"]
    for name in ("lock_ttl", "lock_queue_ttl", "lock_retry_countdown"):
        if name in raw:
            opts[name] = _seconds(task, name, raw[name])
    if "lock_wait_timeout" in raw:
        opts["lock_wait_timeout"] = _seconds(
            task, "lock_wait_timeout", raw["lock_wait_timeout"], allow_none=False
        )
    if "lock_on_duplicate" in raw:
        opts["lock_on_duplicate"] = _choice(
            task, "lock_on_duplicate", raw["lock_on_duplicate"], ON_DUPLICATE
        )
    if "lock_on_locked" in raw:
        opts["lock_on_locked"] = _choice(task, "lock_on_locked", raw["lock_on_locked"], ON_LOCKED)
    result = LockOptions(**opts)
    if result.lock_release_on_start and result.lock_at != "publish":
        raise ValueError(
            f"task {task!r}: lock_release_on_start=True only makes sense with lock_at='publish'"
        )
    return result
