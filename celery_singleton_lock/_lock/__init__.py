"""The lock layer: a reentrant, renewed, fenced Redis hash lock. It never imports Celery; the
rest of the package uses only what this module exports. A feature built on a lock (waiting
copies, beat's send records) declares its own :class:`Script` of lua/ and runs it on the lock's
keys in :meth:`NamedLock.operation`. Modules, bottom up: keys, owner, checks, deadline, scripts,
observe, hold, renewal, wakeup, runtime (all of those for one client), commands, reentrant,
semaphore, rate, space.
"""

from __future__ import annotations

from .checks import MAX_LEASE_SECONDS, check_duration, check_lease_ms, is_cluster
from .commands import AcquireReply, LockState, ReleaseReply, backend_errors, text
from .commands import seconds as lease_seconds  # (what a script's milliseconds left are)
from .deadline import DeadlineRetry, time_left
from .deadline import deadline as operation_deadline  # (the module has the same name)
from .keys import LockKeys, RateKeys, check_prefix, glob_escape
from .observe import set_observer
from .owner import new_run_token
from .rate import Rate, RateLimiter, RateReply, RateState, inspect_rate
from .reentrant import ReentrantLock
from .scripts import Script
from .semaphore import Semaphore
from .space import LockSpace, NamedLock

__all__ = [
    "MAX_LEASE_SECONDS",
    "AcquireReply",
    "DeadlineRetry",
    "LockKeys",
    "LockSpace",
    "LockState",
    "NamedLock",
    "Rate",
    "RateKeys",
    "RateLimiter",
    "RateReply",
    "RateState",
    "ReentrantLock",
    "ReleaseReply",
    "Script",
    "Semaphore",
    "backend_errors",
    "check_duration",
    "check_lease_ms",
    "check_prefix",
    "glob_escape",
    "inspect_rate",
    "is_cluster",
    "lease_seconds",
    "new_run_token",
    "operation_deadline",
    "set_observer",
    "text",
    "time_left",
]
