"""Options that are each valid but cannot work together: refused when the task class is made,
with a message that says what to use instead (docs/combinations.md lists every pair)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, NoReturn

if TYPE_CHECKING:
    from .options import LockOptions


def check_combination(task: str, options: LockOptions, raw: Mapping[str, Any]) -> None:
    """Options that are each valid but make no sense together: a ``ValueError`` that says
    which and what to do."""

    def refuse(message: str) -> NoReturn:
        raise ValueError(f"task {task!r}: {message}")

    if options.lock_release_on_start and options.lock_at != "publish":
        refuse(
            "lock_release_on_start=True only makes sense with lock_at='publish' (for one "
            "queued and one running, use lock_at='queue')"
        )
    if options.lock_at == "queue" and options.lock_on_locked == "raise":
        refuse(
            "lock_at='queue' never drops its queued copy, so lock_on_locked='raise' cannot "
            "apply; use 'retry' or 'wait' (the default 'skip' retries in this mode)"
        )
    if options.lock_cooldown is not None and options.lock_release_on_start:
        refuse(
            "lock_cooldown needs a lock held to the end of the run; lock_release_on_start=True "
            "releases it when the run starts"
        )
    if options.lock_cooldown is None and "lock_cooldown_on_failure" in raw:
        refuse("lock_cooldown_on_failure is set but lock_cooldown is not")
    for name in ("lock_rate_key", "lock_rate_max_delay"):
        if options.lock_rate is None and name in raw:
            refuse(f"{name} is set but lock_rate is not")
    if options.lock_limit is None and (
        options.lock_rate is None or options.lock_at != "run" or options.lock_cooldown is not None
    ):
        refuse(
            "lock_limit=None (no limit on runs at once) holds no lock: it needs lock_rate, and "
            "lock_at='publish', 'queue' and lock_cooldown need a lock; set lock_limit=1 (one at "
            "a time) or more, or use a plain Task"
        )
    if options.lock_rate is not None and options.lock_release_on_start:
        refuse(
            "lock_rate counts starts, and lock_release_on_start=True releases the job's lock as "
            "the run starts; use lock_at='publish' without it, or lock_at='run'"
        )
    if options.lock_debounce is not None:
        if options.lock_at not in ("publish", "queue"):
            refuse(
                "lock_debounce delays and replaces queued calls, so it needs "
                "lock_at='publish' or lock_at='queue'"
            )
        if options.lock_limit != 1:
            refuse(
                "lock_debounce keeps one call waiting per key, so it needs lock_limit=1, got "
                f"lock_limit={options.lock_limit}"
            )
        if options.lock_on_locked == "wait":
            # The run of a replaced message would block on the lock its replacement holds (or
            # runs under) and run after it, with the older arguments.
            refuse(
                "lock_debounce with lock_on_locked='wait' would run a replaced call after the "
                "call that replaced it (its run blocks on the lock before it learns it was "
                "replaced); use lock_at='queue' with the default lock_on_locked='skip' (a call "
                "made while the job runs waits as the queued copy, without a pool process, and "
                "runs after it)"
            )
    # An option set (by the task or a class below LockedTask) that the others leave nothing to
    # act on: refused, rather than ignored in silence.
    if "lock_key" in raw and "lock_unique_on" in raw and options.lock_key is not None:
        refuse(
            "lock_key and lock_unique_on both choose the job's key, and lock_key would win: "
            "set lock_unique_on=[...] (named parameters) or lock_key=callable, not both"
        )
    if "lock_on_duplicate" in raw and options.lock_at == "run":
        refuse(
            "lock_on_duplicate says what a duplicate publish does, and lock_at='run' takes no "
            "lock at publish; use lock_at='publish' (or 'queue') for it, or lock_on_locked for "
            "a duplicate met at run time"
        )
    if options.lock_release_on_start and options.lock_on_locked != "skip":
        refuse(
            f"lock_on_locked={options.lock_on_locked!r} never applies with "
            "lock_release_on_start=True: the run holds no lock (it lets its publish's go as it "
            "starts), so it never meets a duplicate; drop one of them (lock_at='queue' runs a "
            "call made during a run after it)"
        )
    if "lock_wait_timeout" in raw and options.lock_on_locked != "wait":
        refuse(
            "lock_wait_timeout is set but lock_on_locked is not 'wait' (the only choice that "
            "waits for the lock); set lock_on_locked='wait' or drop lock_wait_timeout"
        )
    if (
        "lock_retry_countdown" in raw
        and options.lock_on_locked != "retry"
        and options.lock_at != "queue"
    ):
        refuse(
            "lock_retry_countdown is set but lock_on_locked is not 'retry' (nor lock_at "
            "'queue', whose waiting copy's fallback it times); set lock_on_locked='retry' or "
            "drop lock_retry_countdown"
        )
    if "lock_ttl" in raw and options.lock_release_on_start:
        refuse(
            "lock_ttl is the lease of the run's lock, and with lock_release_on_start=True the "
            "run holds none (lock_queue_ttl leases the publish's); drop lock_ttl"
        )
    if options.lock_limit is None:
        for name in ("lock_ttl", "lock_queue_ttl"):
            if name in raw:
                refuse(
                    f"{name} is the lease of a lock, and lock_rate alone (lock_limit=None) holds "
                    f"none; drop {name}, or set lock_limit=1 (one at a time) to hold one"
                )
