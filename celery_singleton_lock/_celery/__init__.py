"""The Celery layer (``LockedTask``, ``install()``, the worker's hooks) on the lock layer's API
only. Importing it connects no signal receiver (:mod:`.wiring` says who does). ``install()``
lives in ``installer``: a module named as a public function would replace it in the API docs.
"""

from __future__ import annotations

from .installer import install
from .task import LockedTask

__all__ = ["LockedTask", "install"]
