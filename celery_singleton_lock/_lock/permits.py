"""The permits of a semaphore in Redis: their keys, which one an owner holds, who holds them, and
the rule that picks the permit an acquire takes.

A semaphore of N permits is N locks of one name (see :class:`~.keys.LockKeys`: permit 1 is the
plain lock). Both users of a semaphore go through here: :class:`~.semaphore.Semaphore` (holds
this process keeps and renews) and :class:`~.space.LockSpace` (holds that live elsewhere).
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Callable, Sequence
from typing import Any

from .._errors import LockBackendError
from . import commands
from .commands import AcquireReply, ReleaseReply
from .keys import LockKeys

__all__ = [
    "check_permits",
    "holders",
    "owned_by",
    "permit_keys",
    "release_everywhere",
    "release_owned",
    "soonest",
    "take",
]


def check_permits(permits: object) -> int:
    """``permits`` when it is an int >= 1 (not a bool), else an error naming ``permits``."""
    if isinstance(permits, bool) or not isinstance(permits, int):
        raise TypeError(f"permits must be an int >= 1 (how many may hold at once), got {permits!r}")
    if permits < 1:
        raise ValueError(
            f"permits must be an int >= 1 (how many may hold at once), got {permits!r}"
        )
    return permits


def permit_keys(prefix: str, name: str, permits: int) -> list[LockKeys]:
    """The keys of permits 1..``permits`` of ``name``, in order."""
    return [LockKeys.for_name(prefix, name, k) for k in range(1, permits + 1)]


def owned_by(client: Any, keys: Sequence[LockKeys], owner: str) -> list[int]:
    """The permits (indexes into ``keys``) that ``owner`` holds in Redis now: one pipeline of
    HEXISTS (all in one hash tag, so one Cluster node answers it). A cancel of the owner's
    still pending on a permit runs first (:func:`.commands.settle`): the operation that looks
    for the owner's permit must not find, or miss, the hold of a lost acquire."""
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


def soonest(refusals: Sequence[AcquireReply]) -> AcquireReply:
    """The refusal of the permit that frees first (the least ``lease_left``): what a waiter
    waits for, and what the caller is told."""
    return min(refusals, key=lambda reply: reply.lease_left)


def take(
    attempt: Callable[[int], AcquireReply], permits: int, owned: Sequence[int]
) -> AcquireReply:
    """The acquire rule of a semaphore, in Redis (``attempt(i)`` tries permit ``i`` once).

    An owner that holds a permit (``owned``: found by :func:`owned_by`) re-enters that permit
    only, whose run-token rule applies: one owner never takes two permits on purpose. Else the
    permits are tried one by one from a random one (so that contenders spread over them rather
    than all queueing on permit 1), up to the first taken; when every one is refused, the reply
    is the refusal of the permit that frees first."""
    for index in owned:
        reply = attempt(index)
        if reply.acquired or reply.other_run:
            return reply
        # Its lease ended and another owner took it between the look and the take: the owner
        # holds no permit now, and may take any.
    start = random.randrange(permits)
    refusals = []
    for step in range(permits):
        reply = attempt((start + step) % permits)
        if reply.acquired:
            return reply
        refusals.append(reply)
    return soonest(refusals)


def release_everywhere(
    client: Any,
    keys: Sequence[LockKeys],
    owner: str,
    holds: int,
    retry_for: float,
    retry_unless: Callable[[], bool] | None = None,
) -> None:
    """Send the release of ``owner`` to every permit, each sent again in the background while
    Redis fails (``retry_for`` and ``retry_unless``: see :func:`.commands.release`), for when
    which permit it holds could not be found. The permits it does not hold answer "not the
    owner", harmlessly."""
    for permit in keys:
        with contextlib.suppress(LockBackendError):  # its release goes on in the background
            commands.release(
                client, permit, owner, holds, retry_for=retry_for, retry_unless=retry_unless
            )


def release_owned(
    client: Any, keys: Sequence[LockKeys], owner: str, holds: int, retry_for: float
) -> ReleaseReply:
    """Drop ``holds`` holds of ``owner`` on the permit it holds (:func:`.commands.release`,
    ``retry_for`` included). When Redis fails while that permit is looked for, and
    ``retry_for`` > 0, the release goes to every permit (:func:`release_everywhere`) before
    :class:`LockBackendError` is raised."""
    try:
        owned = owned_by(client, keys, owner)
    except LockBackendError:
        if retry_for > 0:
            release_everywhere(client, keys, owner, holds, retry_for)
        raise
    replies = [commands.release(client, keys[i], owner, holds, retry_for=retry_for) for i in owned]
    return next((reply for reply in replies if reply.owned), NOT_OWNED)


#: the reply of a release by an owner that holds no permit
NOT_OWNED = ReleaseReply(False)
