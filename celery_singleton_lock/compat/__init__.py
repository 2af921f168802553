"""Drop-ins for celery-singleton (:mod:`.singleton`) and celery-once (:mod:`.once`): change one
import. Both are ``lock_at="publish"`` :class:`~celery_singleton_lock.LockedTask` subclasses on
the public API only; ``docs/migration.md`` lists what behaves differently, and why."""
