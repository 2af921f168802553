"""The wait records beside a lock (lua/wait_*.lua through ``LockSpace``), on a real server.

The queued copy of Celery's ``lock_at="queue"`` waits for a run with them
(``celery_singleton_lock/_celery/wake.py``); these tests check the scripts' rules alone:

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
from celery_singleton_lock._lock import CLAIMED, WAIT_OVER, WAIT_REPLACED
from celery_singleton_lock._lock.space import CLAIMED_ELSEWHERE, WAITERS


def _held(client: Any, name: str, owner: str = "run-1", ttl: float = 30) -> ReentrantLock:
    lock = ReentrantLock(client, name, ttl=ttl, owner=owner, renew=False)
    assert lock.acquire(blocking=False)
    return lock


def test_a_waiter_is_written_only_while_the_lock_is_held(redis_client: Any) -> None:
    space = LockSpace(redis_client)
    assert not space.named("job").add_waiter("q1", "t1\npayload", 60)  # free: nothing written
    assert space.named("job").waiters() == {}
    lock = _held(redis_client, "job", ttl=20)
    parked = space.named("job").add_waiter("q1", "t1\npayload", 60)
    assert parked and 19 < parked.lease_left <= 20
    assert space.named("job").waiters() == {"q1": "t1\npayload"}
    lock.release()
    forced = space.named("job").add_waiter("q1", "t2\npayload", 60, force=True)
    assert forced and forced.lease_left == 0  # written although free: its fallback comes at once
    assert space.named("job").waiters() == {
        "q1": "t2\npayload"
    }  # the newer wait replaced the older


def test_every_slot_must_be_held_and_the_soonest_lease_is_told(redis_client: Any) -> None:
    space = LockSpace(redis_client)
    first = space.semaphore("slots", 2, ttl=30, owner="run-1")
    assert first.acquire(blocking=False)
    assert not space.named("slots", 2).add_waiter("q1", "t\np", 60)  # slot 2 is free
    second = space.semaphore("slots", 2, ttl=10, owner="run-2")
    assert second.acquire(blocking=False)
    parked = space.named("slots", 2).add_waiter("q1", "t\np", 60)
    assert parked and 9 < parked.lease_left <= 10
    first.release()
    second.release()


def test_one_message_claims_a_wait(redis_client: Any) -> None:
    space = LockSpace(redis_client)
    lock = _held(redis_client, "job")
    assert space.named("job").add_waiter("q1", "t1\npayload", 60)
    assert space.named("job").claim_waiter("q1", "t1", "wake") == (CLAIMED, "")
    assert space.named("job").claim_waiter("q1", "t1", "wake") == (CLAIMED, "again")  # its resend
    assert space.named("job").claim_waiter("q1", "t1", "fallback") == (CLAIMED_ELSEWHERE, "")
    assert space.named("job").waiters() == {}  # claimed: no run's end wakes it again
    # the claimer waits again (the lock is still held): the older token claims nothing
    assert space.named("job").add_waiter("q1", "t2\npayload", 60)
    assert space.named("job").claim_waiter("q1", "t1", "fallback") == (CLAIMED_ELSEWHERE, "")
    assert space.named("job").claim_waiter("q1", "t2", "wake") == (CLAIMED, "")
    # its run ends: its claim goes with it, and its other messages find the wait over
    assert space.named("job").waiters(drop="q1", token="t2", claim="!t2 wake") == {}
    assert space.named("job").claim_waiter("q1", "t2", "fallback") == (WAIT_OVER, "")
    lock.release()


def test_a_dropped_record_is_only_the_wait_named(redis_client: Any) -> None:
    space = LockSpace(redis_client)
    lock = _held(redis_client, "job")
    assert space.named("job").add_waiter("q1", "t2\npayload", 60)
    space.named("job").waiters(drop="q1", token="t1", claim="!t1 m", listing=False)  # an older wait
    assert space.named("job").waiters() == {"q1": "t2\npayload"}
    space.named("job").waiters(drop="q1", token="t2", listing=False)  # revoked while it waits
    assert space.named("job").waiters() == {}
    lock.release()


def test_a_replaced_waiter_learns_who_replaced_it(redis_client: Any) -> None:
    space = LockSpace(redis_client)
    lock = _held(redis_client, "job")
    assert not space.named("job").replace_waiter("q1", "q2")  # not waiting (yet): nothing marked
    assert space.named("job").add_waiter("q1", "t1\npayload", 60)
    assert space.named("job").add_waiter("q2", "t9\npayload", 60)
    assert space.named("job").replace_waiter("q1", "q2")
    assert space.named("job").waiters() == {"q2": "t9\npayload"}  # the replaced one is not woken
    assert space.named("job").claim_waiter("q1", "t1", "wake") == (WAIT_REPLACED, "q2")
    assert space.named("job").claim_waiter("q1", "t1", "fallback") == (WAIT_OVER, "")
    lock.release()


def test_the_records_live_as_asked_in_the_lock_s_hash_tag(redis_client: Any) -> None:
    space = LockSpace(redis_client)
    lock = _held(redis_client, "job}x")  # a name with a brace: escaped in every key alike
    key = space.keys("job}x").records(WAITERS)
    assert key == lock.key + ":wait"
    assert space.named("job}x").add_waiter("q1", "t\np", 100)
    assert 99_000 < redis_client.pttl(key) <= 100_000
    assert space.named("job}x").add_waiter("q2", "t\np", 10)  # a shorter keep does not shorten it
    assert redis_client.pttl(key) > 99_000
    # every key the scripts touch is in one Redis Cluster slot
    tag = key[key.index("{") : key.index("}") + 1]
    assert lock.key.startswith(f"lock:{tag}")
    lock.release()
