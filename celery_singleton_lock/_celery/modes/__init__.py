"""One object per ``lock_at`` mode, chosen once per task class: it owns the job's life in its mode
(what a publish takes, what a run takes and gives back, what the worker's main process frees)."""

from __future__ import annotations

from ..options import LockOptions
from .base import RunMode
from .publish import PublishMode
from .queue import QueueMode

__all__ = ["PublishMode", "RunMode", "mode_for"]


def mode_for(options: LockOptions) -> RunMode:
    """The mode of a task class with these (validated) options."""
    modes = {"run": RunMode, "publish": PublishMode, "queue": QueueMode}
    return modes[options.lock_at](options)
