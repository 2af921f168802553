"""The permits of one name in Redis: their keys, which one an owner holds, who holds them, and
the rule that picks the permit an acquire takes. A name of N permits is N locks (permit 1 is
the plain lock); :class:`~.semaphore.Semaphore` and :class:`~.space.NamedLock` both use this.
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Callable, Sequence
from typing import Any

from .._errors import LockBackendError
from . import commands
from .commands import NOT_OWNED, AcquireReply, ReleaseReply
from .keys import LockKeys


def check_permits(permits: object) -> int:
    """``permits`` when it is an int >= 1 (not a bool), else an error naming ``permits``."""
    if type(permits) is int and permits >= 1:  # (every lock of a job checks its permits)
        return permits
    message = f"permits must be an int >= 1 (how many may hold at once), got {permits!r}"
    if isinstance(permits, bool) or not isinstance(permits, int):
        raise TypeError(message)
    if permits < 1:
        raise ValueError(message)
    return permits


def permit_keys(prefix: str, name: str, permits: int) -> list[LockKeys]:
    """The keys of permits 1..``permits`` of ``name``, in order."""
    if permits == 1:  # a lock of one permit (most): no loop
        return [LockKeys.for_name(prefix, name)]
    return [LockKeys.for_name(prefix, name, k) for k in range(1, permits + 1)]


def owned_by(client: Any, keys: Sequence[LockKeys], owner: str) -> list[int]:
    """The permits (indexes into ``keys``) ``owner`` holds now: one pipeline of HEXISTS (one
    hash tag: one Cluster node). The owner's pending cancels run first: what looks for its
    permit must not find, or miss, the hold of a lost acquire."""
    subject = f"the permit of owner {owner!r} of semaphore {keys[0].name!r}"
    with commands.backend_errors("find", keys[0].name, subject):
        commands.settle(client, keys[0], owner)
        pipe = client.pipeline(transaction=False)
        for permit in keys:
            pipe.hexists(permit.lock, owner)
        found = pipe.execute()
    return [index for index, there in enumerate(found) if there]


def holders(client: Any, keys: Sequence[LockKeys]) -> dict[str, int]:
    """Owner -> hold count over every permit (one pipeline of HGETALL)."""
    with commands.backend_errors("read", keys[0].name, f"the holders of {keys[0].name!r}"):
        pipe = client.pipeline(transaction=False)
        for permit in keys:
            pipe.hgetall(permit.lock)
        hashes = pipe.execute()
    counts: dict[str, int] = {}
    for fields in hashes:
        for owner, count in fields.items():
            name = commands.text(owner)
            counts[name] = counts.get(name, 0) + int(count)
    return counts


def take(
    attempt: Callable[[int], AcquireReply], permits: int, owned: Sequence[int]
) -> AcquireReply:
    """The acquire rule (``attempt(i)`` tries permit ``i`` once). An owner that holds a permit
    (``owned``) re-enters that one only, whose run-token rule applies: one owner never takes
    two permits on purpose. Else the permits are tried from a random one (contenders spread
    over them), up to the first taken; when all refuse, the reply is the refusal of the
    permit that frees first."""
    for index in owned:
        reply = attempt(index)
        if reply.acquired or reply.other_run:
            return reply
        # its lease ended and another owner took it meanwhile: the owner may take any
    start = random.randrange(permits)
    refusals = []
    for step in range(permits):
        reply = attempt((start + step) % permits)
        if reply.acquired:
            return reply
        refusals.append(reply)
    return min(refusals, key=lambda reply: reply.lease_left)


def release_everywhere(
    client: Any,
    keys: Sequence[LockKeys],
    owner: str,
    holds: int,
    retry_for: float,
    retry_unless: Callable[[], bool] | None = None,
) -> None:
    """The release of ``owner`` sent to every permit (each sent again in the background while
    Redis fails), for when which one it holds could not be found; the others answer "not the
    owner", harmlessly."""
    for permit in keys:
        with contextlib.suppress(LockBackendError):  # it goes on in the background
            commands.release(
                client, permit, owner, holds, retry_for=retry_for, retry_unless=retry_unless
            )


def release_owned(
    client: Any, keys: Sequence[LockKeys], owner: str, holds: int, retry_for: float
) -> ReleaseReply:
    """Drop ``holds`` holds of ``owner`` on the permit it holds. When Redis fails while that
    permit is looked for, and ``retry_for`` > 0, the release goes to every permit before
    :class:`LockBackendError` is raised."""
    try:
        owned = owned_by(client, keys, owner)
    except LockBackendError:
        if retry_for > 0:
            release_everywhere(client, keys, owner, holds, retry_for)
        raise
    replies = [commands.release(client, keys[i], owner, holds, retry_for=retry_for) for i in owned]
    return next((reply for reply in replies if reply.owned), NOT_OWNED)
