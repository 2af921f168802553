"""The wait records beside a job's lock that a queued copy waits with (:mod:`.wake`): written
while every slot is held, read by the run that ends, claimed by one wake-up (lua/wait_*.lua).

The records are a hash beside permit 1 (``<lock key>:wait``, in the lock's hash tag: one Redis
Cluster slot with every permit); each call is one script on the lock's keys, run in
:meth:`NamedLock.operation` (the lock space's deadline, a Redis error a ``LockBackendError``).
"""

from __future__ import annotations

from typing import Any, NamedTuple

from ..._lock import NamedLock, Script, check_lease_ms, lease_seconds, text

__all__ = [
    "CLAIMED",
    "CLAIMED_ELSEWHERE",
    "WAITERS",
    "WAIT_OVER",
    "WAIT_REPLACED",
    "WaitReply",
    "add_waiter",
    "claim_waiter",
    "replace_waiter",
    "waiters",
]

#: :func:`claim_waiter`'s answers: claimed; the waiter waits no more; another wake-up claimed
#: it (or it waits again with another token); the waiter was replaced
CLAIMED, WAIT_OVER, CLAIMED_ELSEWHERE, WAIT_REPLACED = 1, 0, 2, 3
#: the kind of records (:meth:`LockKeys.records`) a lock's waiters keep beside it
WAITERS = "wait"

# Each safe to resend: a second run changes nothing.
WAIT_PARK = Script("wait_park.lua")
WAIT_CLAIM = Script("wait_claim.lua")
WAIT_END = Script("wait_end.lua")
WAIT_MARK = Script("wait_mark.lua")


class WaitReply(NamedTuple):
    """What :func:`add_waiter` did."""

    #: the record was written: every permit was held (or the write was forced)
    waiting: bool
    #: when written: seconds left on the lease that frees first (0.0: a permit is free, -1.0:
    #: no lease)
    lease_left: float = 0.0

    def __bool__(self) -> bool:
        return self.waiting


def _run(job: NamedLock, script: Script, what: str, keys: tuple[str, ...], *args: Any) -> Any:
    with job.operation(what) as client:
        return script(client, (job.keys[0].records(WAITERS), *keys), args)


def add_waiter(
    job: NamedLock, waiter: str, record: str, keep: float, *, force: bool = False
) -> WaitReply:
    """Write ``waiter``'s ``record`` beside ``job``'s lock while every permit is held, checked
    in the same step (``force``: even when one is free); the records live at least ``keep``
    seconds from now. A holder that ends releases first and reads the records after
    (:func:`waiters`): either this call finds a permit free or that read finds the record."""
    keep_ms = check_lease_ms(keep)
    locks = tuple(keys.lock for keys in job.keys)
    flag = "1" if force else ""
    code, pttl = _run(job, WAIT_PARK, "write a waiter beside", locks, waiter, record, keep_ms, flag)
    return WaitReply(int(code) == 1, lease_seconds(pttl))


def claim_waiter(job: NamedLock, waiter: str, token: str, mark: str) -> tuple[int, str]:
    """Claim the wait ``token`` of ``waiter`` for the wake-up ``mark``: :data:`CLAIMED` (with
    ``"again"`` when this mark claimed it before), :data:`WAIT_OVER`,
    :data:`CLAIMED_ELSEWHERE`, or :data:`WAIT_REPLACED` and who replaced the waiter."""
    code, by = _run(job, WAIT_CLAIM, "claim a wait beside", (), waiter, token, mark)
    return int(code), text(by)


def replace_waiter(job: NamedLock, waiter: str, by: str) -> bool:
    """``waiter`` was replaced by ``by``: its next claim learns so, and no release wakes it.
    ``False``: it had no record."""
    return bool(int(_run(job, WAIT_MARK, "mark a waiter beside", (), waiter, by)))


def waiters(
    job: NamedLock, *, drop: str = "", token: str = "", claim: str = "", listing: bool = True
) -> dict[str, str]:
    """The records of the unclaimed waiters (with ``listing``), after dropping the record of
    ``drop`` if it is still the wait ``token`` or its ``claim``: one round trip."""
    flag = "1" if listing else ""
    reply = _run(job, WAIT_END, "read the waiters beside", (), drop, token, claim, flag)
    return {text(reply[i]): text(reply[i + 1]) for i in range(0, len(reply) - 1, 2)}
