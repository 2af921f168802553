"""One object per ``lock_at`` mode, chosen once per task class: :class:`RunMode` (``"run"``),
:class:`PublishMode` (``"publish"``) and :class:`QueueMode` (``"queue"``). A mode owns the
job's life in its mode: what a publish takes, what a run takes and gives back, what the
worker's main process does for a run whose pool process cannot; the job's limit, cooldown and
debounce are parts it was made with."""

from __future__ import annotations

from ..options import LockOptions
from .base import RunMode
from .publish import PublishMode
from .queue import QUEUED, QueueMode

__all__ = ["QUEUED", "PublishMode", "QueueMode", "RunMode", "mode_for"]

_MODES: dict[str, type[RunMode]] = {"run": RunMode, "publish": PublishMode, "queue": QueueMode}


def mode_for(options: LockOptions) -> RunMode:
    """The mode of a task class with these (validated) options."""
    return _MODES[options.lock_at](options)
