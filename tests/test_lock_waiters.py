"""The wait records beside a lock (lua/wait_*.lua, run by ``_celery/modes/wake.py`` on a
``NamedLock``'s keys), on a real server.

The queued copy of Celery's ``lock_at="queue"`` waits for a run with them
(``celery_singleton_lock/_celery/modes/wake.py``); these tests check the scripts' rules alone:

* a waiter's record is written only while every slot of the lock is held, checked in the same
  step (or when forced), and names the lease that frees first;
* a run's end lists the waiting records, and drops its own claim with it;
* only one message claims a wait (a resend of that same message claims it again), a newer
  wait of the same task replaces the older, a replaced waiter's first message learns who
  replaced it, and neither claimed nor replaced records are listed;
* the records hash lives at least as asked, never shortened, in the lock's hash tag.
"""

from __future__ import annotations

from typing import Any

from celery_singleton_lock import LockSpace, ReentrantLock
from celery_singleton_lock._celery.modes.wake import (
    CLAIMED,
    CLAIMED_ELSEWHERE,
    WAIT_OVER,
    WAIT_REPLACED,
    WAITERS,
    add_waiter,
    claim_waiter,
    replace_waiter,
    waiters,
)


def _held(client: Any, name: str, owner: str = "run-1", ttl: float = 30) -> ReentrantLock:
    lock = ReentrantLock(client, name, ttl=ttl, owner=owner, renew=False)
    assert lock.acquire(blocking=False)
    return lock


def test_a_waiter_is_written_only_while_the_lock_is_held(redis_client: Any) -> None:
    space = LockSpace(redis_client)
    assert not add_waiter(space.named("job"), "q1", "t1\npayload", 60)  # free: nothing written
    assert waiters(space.named("job")) == {}
    lock = _held(redis_client, "job", ttl=20)
    parked = add_waiter(space.named("job"), "q1", "t1\npayload", 60)
    assert parked and 19 < parked.lease_left <= 20
    assert waiters(space.named("job")) == {"q1": "t1\npayload"}
    lock.release()
    forced = add_waiter(space.named("job"), "q1", "t2\npayload", 60, force=True)
    assert forced and forced.lease_left == 0  # written although free: its fallback comes at once
    assert waiters(space.named("job")) == {"q1": "t2\npayload"}  # the newer wait replaced the older


def test_every_slot_must_be_held_and_the_soonest_lease_is_told(redis_client: Any) -> None:
    space = LockSpace(redis_client)
    first = space.semaphore("slots", 2, ttl=30, owner="run-1")
    assert first.acquire(blocking=False)
    assert not add_waiter(space.named("slots", 2), "q1", "t\np", 60)  # slot 2 is free
    second = space.semaphore("slots", 2, ttl=10, owner="run-2")
    assert second.acquire(blocking=False)
    parked = add_waiter(space.named("slots", 2), "q1", "t\np", 60)
    assert parked and 9 < parked.lease_left <= 10
    first.release()
    second.release()


def test_one_message_claims_a_wait(redis_client: Any) -> None:
    space = LockSpace(redis_client)
    lock = _held(redis_client, "job")
    assert add_waiter(space.named("job"), "q1", "t1\npayload", 60)
    assert claim_waiter(space.named("job"), "q1", "t1", "wake") == (CLAIMED, "")
    assert claim_waiter(space.named("job"), "q1", "t1", "wake") == (CLAIMED, "again")  # its resend
    assert claim_waiter(space.named("job"), "q1", "t1", "fallback") == (CLAIMED_ELSEWHERE, "")
    assert waiters(space.named("job")) == {}  # claimed: no run's end wakes it again
    # the claimer waits again (the lock is still held): the older token claims nothing
    assert add_waiter(space.named("job"), "q1", "t2\npayload", 60)
    assert claim_waiter(space.named("job"), "q1", "t1", "fallback") == (CLAIMED_ELSEWHERE, "")
    assert claim_waiter(space.named("job"), "q1", "t2", "wake") == (CLAIMED, "")
    # its run ends: its claim goes with it, and its other messages find the wait over
    assert waiters(space.named("job"), drop="q1", token="t2", claim="!t2 wake") == {}
    assert claim_waiter(space.named("job"), "q1", "t2", "fallback") == (WAIT_OVER, "")
    lock.release()


def test_a_dropped_record_is_only_the_wait_named(redis_client: Any) -> None:
    space = LockSpace(redis_client)
    lock = _held(redis_client, "job")
    assert add_waiter(space.named("job"), "q1", "t2\npayload", 60)
    waiters(
        space.named("job"), drop="q1", token="t1", claim="!t1 m", listing=False
    )  # an older wait
    assert waiters(space.named("job")) == {"q1": "t2\npayload"}
    waiters(space.named("job"), drop="q1", token="t2", listing=False)  # revoked while it waits
    assert waiters(space.named("job")) == {}
    lock.release()


def test_a_replaced_waiter_learns_who_replaced_it(redis_client: Any) -> None:
    space = LockSpace(redis_client)
    lock = _held(redis_client, "job")
    assert not replace_waiter(space.named("job"), "q1", "q2")  # not waiting (yet): nothing marked
    assert add_waiter(space.named("job"), "q1", "t1\npayload", 60)
    assert add_waiter(space.named("job"), "q2", "t9\npayload", 60)
    assert replace_waiter(space.named("job"), "q1", "q2")
    assert waiters(space.named("job")) == {"q2": "t9\npayload"}  # the replaced one is not woken
    assert claim_waiter(space.named("job"), "q1", "t1", "wake") == (WAIT_REPLACED, "q2")
    assert claim_waiter(space.named("job"), "q1", "t1", "fallback") == (WAIT_OVER, "")
    lock.release()


def test_the_records_live_as_asked_in_the_lock_s_hash_tag(redis_client: Any) -> None:
    space = LockSpace(redis_client)
    lock = _held(redis_client, "job}x")  # a name with a brace: escaped in every key alike
    key = space.keys("job}x").records(WAITERS)
    assert key == lock.key + ":wait"
    assert add_waiter(space.named("job}x"), "q1", "t\np", 100)
    assert 99_000 < redis_client.pttl(key) <= 100_000
    assert add_waiter(space.named("job}x"), "q2", "t\np", 10)  # a shorter keep does not shorten it
    assert redis_client.pttl(key) > 99_000
    # every key the scripts touch is in one Redis Cluster slot
    tag = key[key.index("{") : key.index("}") + 1]
    assert lock.key.startswith(f"lock:{tag}")
    lock.release()
