"""The Celery layer: ``LockedTask``, ``install()`` and the worker's hooks, built on the lock
layer's API (:mod:`celery_singleton_lock._lock`) only.

Modules, along a task's life: ``options`` and ``settings`` (each defined once), ``client``
(the Redis client from the settings), ``taskkey`` (the lock name of a call), ``locking`` (a
task class's options and leases), ``info`` (what operators see of a hold), ``publish``,
``run`` (run and retry), ``canvas`` (a duplicate inside a group, chord or chain), ``checks``
(every setting checked at once), ``worker`` (the main process's side), ``revoked``, ``dropped``
(messages a worker drops unrun), ``startup`` (the settings checked and the setting's tasks
locked when a worker or beat starts), ``task``
(``LockedTask``, a thin class of hooks), ``install``.
"""

from __future__ import annotations

from .dropped import connect_dropped_receivers
from .install import install
from .metrics_server import connect_metrics_receivers
from .revoked import connect_revoke_receiver
from .startup import connect_startup_receivers
from .task import LockedTask

__all__ = ["LockedTask", "install"]

connect_revoke_receiver()
connect_dropped_receivers()
connect_metrics_receivers()
connect_startup_receivers()
