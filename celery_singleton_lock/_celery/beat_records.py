"""Beat's send records beside its leader lock (:mod:`celery_singleton_lock.beat`): written only
while the leader holds the lock with lease to spare, checked in the same step
(lua/record_if_held.lua), and read by the next leader.

Each call is one operation on the lock's keys in :meth:`NamedLock.operation` (the lock space's
deadline, a Redis error a ``LockBackendError``); the records are a hash in the lock's hash tag.
"""

from __future__ import annotations

from typing import NamedTuple

from .._lock import LockSpace, Script, check_lease_ms, lease_seconds, text

__all__ = ["RecordReply", "record_if_held", "records"]

# Safe to resend: a second run writes the same field again.
RECORD_IF_HELD = Script("record_if_held.lua")


class RecordReply(NamedTuple):
    """What :func:`record_if_held` did."""

    #: the record was written: the owner held the lock with enough lease left
    recorded: bool
    #: the owner still held the lock
    held: bool
    #: seconds left on the lock's lease when held (-1.0: no lease)
    lease_left: float = 0.0

    def __bool__(self) -> bool:
        return self.recorded


def record_if_held(
    space: LockSpace,
    name: str,
    owner: str,
    kind: str,
    field: str,
    value: str,
    *,
    min_lease: float,
    keep: float,
) -> RecordReply:
    """Write ``field = value`` into the ``kind`` records beside lock ``name`` of ``space``, only
    while ``owner`` holds it with at least ``min_lease`` seconds of lease left (one step). The
    records live ``keep`` seconds after this write."""
    keys, keep_ms = space.keys(name), check_lease_ms(keep)
    args = (owner, field, value, round(max(min_lease, 0.0) * 1000), keep_ms)
    with space.named(name).operation("record") as client:
        code, pttl = RECORD_IF_HELD(client, (keys.lock, keys.records(kind)), args)
    return RecordReply(int(code) == 1, int(code) != 0, lease_seconds(pttl))


def records(space: LockSpace, name: str, kind: str) -> dict[str, str]:
    """The ``kind`` records beside lock ``name`` of ``space`` (see :func:`record_if_held`)."""
    with space.named(name).operation("read the records of") as client:
        raw = client.hgetall(space.keys(name).records(kind))
    return {text(field): text(value) for field, value in raw.items()}
