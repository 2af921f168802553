"""What the two drop-ins share: checks that name the peer's option, the peer's settings as
the defaults of ours."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from .. import LockedTask, reload_settings
from ..lock import LockKeys


def seconds(name: str, value: Any) -> float:
    """``value`` as seconds > 0, or an error naming ``name`` (the peer's option or setting)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number of seconds such as 30, got {value!r}")
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be > 0 (seconds), got {value!r}")
    return float(value)


def dotted(path_or_class: Any) -> Any:
    """A setting that names a class, as its dotted path (a path as it is)."""
    if isinstance(path_or_class, type):
        return f"{path_or_class.__module__}.{path_or_class.__qualname__}"
    return path_or_class


@contextlib.contextmanager
def peer_option_errors(renamed: Mapping[str, str]) -> Iterator[None]:
    """``LockedTask``'s option errors in the block name the peer's option (``renamed``: ours ->
    the peer's)."""
    try:
        yield
    except (TypeError, ValueError) as exc:
        message = str(exc)
        for ours, theirs in renamed.items():
            message = message.replace(ours, f"{theirs} ({ours})")
        if message == str(exc):
            raise
        raise type(exc)(message) from exc


def adopt_defaults(app: Any, defaults: Mapping[str, Any]) -> None:
    """Make each of ``defaults`` (our setting -> the peer's value) the default of our unset
    setting; a URL that is not Redis (a broker's) is left out, for our fallback to take over."""
    adopted = {}
    for name, value in defaults.items():
        if value is None or value == {} or app.conf.get(name) is not None:
            continue
        if name.endswith("_url") and (
            not isinstance(value, str)
            or value.split(":", 1)[0].lower() not in ("redis", "rediss", "unix", "sentinel")
        ):
            continue
        adopted[name] = value
    if adopted:
        # Celery's way for an extension to give defaults: the user's values still win.
        app.add_defaults(adopted)
        reload_settings(app)


def lock_name(
    task: LockedTask, args: Sequence[Any] | None, kwargs: Mapping[str, Any] | None
) -> str:
    """The lock name of a call of ``task``: its key (``prefix:{name}``) without the prefix."""
    return LockKeys.from_lock_key(task.lock_key_for(*(args or ()), **(kwargs or {}))).name
