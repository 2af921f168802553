"""The lock layer: a reentrant, renewed, fenced Redis hash lock. It never imports Celery.

The rest of the package uses only what this module exports: :class:`ReentrantLock` for a hold
this process keeps and renews, :class:`LockSpace` and its :class:`NamedLock` for operations on
a hold kept elsewhere (another process's, a dead one's, an operator's view), and their typed
replies.

Modules, bottom up: ``keys`` (key names), ``owner`` (owner, request and run tokens), ``checks``
(argument checks), ``client`` (what a client must be), ``deadline`` (one deadline per operation,
resends included), ``scripts`` (the Lua files, run by redis-py's EVALSHA), ``hold`` (a process's
hold and a client's registry of them), ``renewal`` (a client's renewal lane), ``renew_batch`` (its
batches of renewals), ``wakeup`` and ``hub`` (push wake-ups), ``sentinel`` (following a Sentinel
master), ``runtime`` (all of those for one client: one runtime per client and process),
``commands`` (one script call each, typed replies, Redis errors mapped), ``heartbeat`` (the
process's renewal, added up), ``reentrant`` (:class:`ReentrantLock`), ``permits`` (a
semaphore's permits in Redis), ``semaphore`` (:class:`Semaphore`: N permits, each a
:class:`ReentrantLock`), ``space`` (:class:`LockSpace`,
:class:`NamedLock`), ``observe`` (what it reports, for metrics).
"""

from __future__ import annotations

from .checks import MAX_LEASE_SECONDS, check_duration
from .client import RedisClient
from .commands import (
    CLAIMED,
    WAIT_OVER,
    WAIT_REPLACED,
    AcquireReply,
    LockState,
    RecordReply,
    ReleaseReply,
    WaitReply,
    text,
)
from .deadline import DeadlineRetry
from .keys import LockKeys, check_prefix
from .observe import LockObserver, get_observer, set_observer
from .owner import new_run_token
from .reentrant import ReentrantLock
from .semaphore import Semaphore
from .space import LockSpace, NamedLock

__all__ = [
    "CLAIMED",
    "MAX_LEASE_SECONDS",
    "WAIT_OVER",
    "WAIT_REPLACED",
    "AcquireReply",
    "DeadlineRetry",
    "LockKeys",
    "LockObserver",
    "LockSpace",
    "LockState",
    "NamedLock",
    "RecordReply",
    "RedisClient",
    "ReentrantLock",
    "ReleaseReply",
    "Semaphore",
    "WaitReply",
    "check_duration",
    "check_prefix",
    "get_observer",
    "new_run_token",
    "set_observer",
    "text",
]
