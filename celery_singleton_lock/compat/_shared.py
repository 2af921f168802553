"""What the two shims share: a task class's locking whose queued-lock lease follows the peer's
settings, the peer's settings read and checked, and the peer's Redis URL taken as the default
of ours.

Both shims are ``lock_at="publish"`` :class:`~celery_singleton_lock.LockedTask` subclasses: the
peers lock at publish for the task id, and so do we. What differs is where the lease of the
queued lock comes from (a class option, an app setting of the peer's, or, for celery-once, one
``apply_async`` call), which :class:`ShimLocking` resolves.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from .._celery.config import reload_settings
from .._celery.locking import TaskLocking
from .._celery.settings import REDIS_SCHEMES, check_seconds, given

__all__ = [
    "ShimLocking",
    "adopt_defaults",
    "check_seconds",
    "peer_option_errors",
    "queue_ttl_for_call",
]

#: the queued-lock lease asked for by the apply_async call in progress (celery-once's
#: ``apply_async(once={"timeout": ...})``); None outside such a call
_call_queue_ttl: contextvars.ContextVar[float | None] = contextvars.ContextVar(
    "celery_singleton_lock_call_queue_ttl", default=None
)


@contextlib.contextmanager
def queue_ttl_for_call(seconds: float | None) -> Iterator[None]:
    """Within the block, the queued lock of the task published is held ``seconds``."""
    token = _call_queue_ttl.set(seconds)
    try:
        yield
    finally:
        _call_queue_ttl.reset(token)


@contextlib.contextmanager
def peer_option_errors(renamed: Mapping[str, str]) -> Iterator[None]:
    """Errors of our option checks in the block name the peer's option the user wrote
    (``renamed``: our option name -> the peer's spelling of it)."""
    try:
        yield
    except (TypeError, ValueError) as exc:
        message = str(exc)
        for ours, theirs in renamed.items():
            message = message.replace(ours, f"{theirs} ({ours})")
        if message == str(exc):
            raise
        raise type(exc)(message) from exc


class ShimLocking(TaskLocking):
    """A shim task class's locking: the queued lock's lease is, first to last, the one asked
    for by the ``apply_async`` call, the task's option (``lock_queue_ttl``, which the shim sets
    from the peer's option), the peer's app setting (``peer_queue_ttl(app)``), and ours
    (``singleton_lock_queue_ttl``)."""

    __slots__ = ("peer_queue_ttl",)

    def __init__(self, base: TaskLocking, peer_queue_ttl: Callable[[Any], float | None]) -> None:
        super().__init__(base.options, base.signature, base.strict)
        self.peer_queue_ttl = peer_queue_ttl

    def queue_ttl(self, app: Any) -> float:
        asked = _call_queue_ttl.get()
        if asked is not None:
            return asked
        if self.options.lock_queue_ttl is not None:
            return self.options.lock_queue_ttl
        peer = self.peer_queue_ttl(app)
        return peer if peer is not None else super().queue_ttl(app)


def adopt_defaults(app: Any, defaults: Mapping[str, Any]) -> None:
    """Make each of ``defaults`` (our setting name -> the value the peer's settings give) the
    default of our setting, where the user did not set ours: code configured for the peer
    keeps its Redis and prefix. A URL that is not Redis is left out (our own error then says
    which setting to set)."""
    adopted = {}
    for name, value in defaults.items():
        if value is None or value == {} or given(app.conf, name) is not None:
            continue
        if name == "singleton_lock_redis_url" and (
            not isinstance(value, str) or value.split(":", 1)[0].lower() not in REDIS_SCHEMES
        ):
            continue
        adopted[name] = value
    if adopted:
        # Celery's own way for an extension to give settings defaults: the user's values, and
        # a later config_from_object, still win.
        app.add_defaults(adopted)
        reload_settings(app)
