"""How many duplicates, refusals and lost leases the last minutes saw, under a prefix.

A placeholder of the contract only: every count reads zero until the counts are written."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["RecentCounts", "recent_counts"]


@dataclass(frozen=True)
class RecentCounts:
    """The counts of the last ``minutes``."""

    #: the window read, in minutes
    minutes: int
    #: duplicates by action: skipped, retried, raised, returned, replaced
    duplicates: dict[str, int] = field(default_factory=dict)
    #: refusals by reason: limit, cooldown, rate
    refusals: dict[str, int] = field(default_factory=dict)
    #: leases lost while held (a run's lock lost)
    lost: int = 0

    def total_duplicates(self) -> int:
        return sum(self.duplicates.values())


def recent_counts(client: Any, prefix: str = "lock", minutes: int = 60) -> RecentCounts:
    """The counts of the last ``minutes`` under ``prefix`` (all zero here)."""
    return RecentCounts(minutes)
