"""The lock layer: a reentrant, renewed, fenced Redis hash lock. It never imports Celery.

The rest of the package uses only what this module exports: :class:`ReentrantLock` for a hold
this process keeps and renews, :class:`LockSpace` for operations on a hold that lives elsewhere
(a queued message's, a dead pool child's, an operator's view), and their typed replies.

Modules, bottom up: ``keys`` (key names), ``owner`` (owner, request and run tokens), ``checks``
(argument checks), ``client`` (what a client must be), ``deadline`` (one deadline per operation,
resends included), ``scripts`` (the Lua files, run by redis-py's EVALSHA), ``hold`` (a process's
hold and a client's registry of them), ``renewal`` (a client's renewal lane), ``renew_batch`` (its
batches of renewals), ``wakeup`` and ``hub`` (push wake-ups), ``sentinel`` (following a Sentinel
master), ``runtime`` (all of those for one client: one runtime per client and process),
``commands`` (one script call each, typed replies, Redis errors mapped), ``heartbeat`` (the
process's renewal, added up), ``reentrant`` (:class:`ReentrantLock`), ``permits`` (a
semaphore's permits in Redis), ``semaphore`` (:class:`Semaphore`: N permits, each a
:class:`ReentrantLock`), ``space`` (:class:`LockSpace`), ``observe`` (what it reports, for
metrics).
"""

from __future__ import annotations

from .checks import MAX_LEASE_SECONDS, check_duration
from .client import RedisClient
from .commands import (
    ALL_HOLDS,
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
from .space import LockSpace

__all__ = [
    "ALL_HOLDS",
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
