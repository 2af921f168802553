"""The Celery layer: ``LockedTask``, ``install()`` and the worker's hooks, on the lock layer's
API (:mod:`celery_singleton_lock._lock`) only. Importing it connects no signal receiver
(:mod:`.wiring` says who does).

Modules: ``settings`` and ``config`` (the settings, one config per app), ``client`` (its Redis
client), ``options`` (the task options), ``taskkey`` (a call's lock name), ``locking`` (a task
class's locking), ``hold`` (a hold's state, the message's lock headers), ``modes`` (one object
per ``lock_at``), ``parts`` (cooldown, debounce), ``conflict`` (``lock_on_locked``), ``run`` (a
run's lock), ``worker`` (the main process's releases), ``canvas``, ``wiring``, ``task``
(``LockedTask``), ``installer`` (``install()``: no module is named as a public function, which
the API reference's builder would document in its place).
"""

from __future__ import annotations

from .installer import install
from .task import LockedTask

__all__ = ["LockedTask", "install"]
