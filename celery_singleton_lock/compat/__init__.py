"""Drop-in replacements for the two most used peers, on this package's lock: change one import.

* :mod:`celery_singleton_lock.compat.singleton`: celery-singleton 0.3.1's ``Singleton``,
  ``DuplicateTaskError``, ``clear_locks`` and its ``singleton_*`` settings.
* :mod:`celery_singleton_lock.compat.once`: celery-once 3.0.1's ``QueueOnce``,
  ``AlreadyQueued`` and its ``ONCE`` setting.

Both are thin :class:`~celery_singleton_lock.LockedTask` subclasses (``lock_at="publish"``):
renewed while the task runs, released on every way a run ends, a crashed worker's lock freed
within one lease. ``docs/migration.md`` lists what behaves differently, and why.
"""
