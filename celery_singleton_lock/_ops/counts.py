"""Duplicates, refusals and lost locks under a prefix lately, as the Celery layer counts them
per minute in Redis (:mod:`celery_singleton_lock._celery.counts`, ``singleton_lock_counts``)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from .._celery.counts import LOST, RETENTION_S, counts_key
from .._lock import backend_errors, check_prefix, text
from .locks import server_clock

#: what was done with a duplicate: at run time, at publish, or a debounce's replacement
DUPLICATE_ACTIONS = ("skipped", "retried", "raised", "returned", "replaced")
#: why a call was refused: every slot taken, the job's cooldown, its rate limit
REFUSAL_REASONS = ("limit", "cooldown", "rate")
#: the longest window that can be read: the counts' hashes expire after it
MAX_MINUTES = RETENTION_S // 60


@dataclass(frozen=True)
class RecentCounts:
    """The counts of the last :attr:`minutes` minutes (the current one included)."""

    #: the window read
    minutes: int
    #: duplicates by what was done with them (every action of :data:`DUPLICATE_ACTIONS`)
    duplicates: dict[str, int] = field(default_factory=dict)
    #: refusals by reason (every reason of :data:`REFUSAL_REASONS`)
    refusals: dict[str, int] = field(default_factory=dict)
    #: locks a run held and lost (its lease expired, or it was force-released)
    lost: int = 0

    def total_duplicates(self) -> int:
        """Every duplicate, whatever was done with it."""
        return sum(self.duplicates.values())


def recent_counts(client: Any, prefix: str = "lock", minutes: int = 60) -> RecentCounts:
    """The counts under ``prefix`` of the last ``minutes`` minutes, by the server's clock (the
    local one on a Cluster): one pipeline of ``HGETALL``, one key per minute."""
    check_prefix(prefix)
    if type(minutes) is not int or not 1 <= minutes <= MAX_MINUTES:
        raise ValueError(
            f"minutes must be an int from 1 to {MAX_MINUTES} (the counts are kept "
            f"{MAX_MINUTES} minutes), got {minutes!r}"
        )
    subject = f"the counts under prefix {prefix!r}"
    now = int(server_clock(client, subject) // 60)
    with backend_errors("read", "", subject):
        pipe = client.pipeline(transaction=False)
        for minute in range(now - minutes + 1, now + 1):
            pipe.hgetall(counts_key(prefix, minute))
        hashes = pipe.execute()
    total: Counter[str] = Counter()
    for fields in hashes:
        for name, value in fields.items():
            total[text(name)] += int(value)
    return RecentCounts(
        minutes=minutes,
        duplicates={action: total[f"duplicates:{action}"] for action in DUPLICATE_ACTIONS},
        refusals={reason: total[f"refusals:{reason}"] for reason in REFUSAL_REASONS},
        lost=total[LOST],
    )
