"""A deduplicated task inside a canvas (chord header, group, chain) against a real worker and a
real Redis result backend: every canvas ends, with an error that names the holder, instead of
waiting for a member that was never sent or never reports.

Each ``.get()`` is bounded: before these rules, each of these canvases waited forever (the
member's id stayed PENDING, or the chord's counter never completed), so every test below timed
out there.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from celery import chain, chord, group
from celery.exceptions import ChordError
from celery_fixtures import CeleryEnv, Gates, app_task, new_app
from lock_helpers import wait_until

from celery_singleton_lock import (
    AlreadyQueuedError,
    ChordDuplicateError,
    LockedTask,
    TaskLockedError,
)

gates = Gates()
app = new_app("csl_canvas")


def _key() -> str:
    return uuid.uuid4().hex


@app_task(app, base=LockedTask, name="canvas.pub_block", lock_at="publish", lock_ttl=30)
def pub_block(key: str) -> str:
    gates.enter(key)
    return key


@app_task(
    app,
    base=LockedTask,
    name="canvas.pub_block_raise",
    lock_at="publish",
    lock_on_duplicate="raise",
    lock_ttl=30,
)
def pub_block_raise(key: str) -> str:
    gates.enter(key)
    return key


@app_task(app, base=LockedTask, name="canvas.pub_quick", lock_at="publish")
def pub_quick(key: str) -> str:
    gates.mark(key)
    return key


@app_task(app, base=LockedTask, name="canvas.run_block", lock_ttl=30)
def run_block(key: str) -> str:
    gates.enter(key)
    return key


@app_task(app, base=LockedTask, name="canvas.run_quick")
def run_quick(key: str) -> str:
    gates.mark(key)
    return key


@app_task(app, name="canvas.plain")
def plain(key: str) -> str:
    gates.mark(key)
    return key


@app_task(app, name="canvas.collect")
def collect(results: list[Any], key: str) -> list[Any]:
    gates.mark(key, results)
    return results


#: the in-process worker and the settings of the conftest ``env`` fixture
CELERY_ENV = {"concurrency": 10}


def _holder(task: Any, key: str) -> Any:
    """A first job of ``task(key)`` that runs (and holds its lock) until ``gates.open(key)``."""
    holder = task.delay(key)
    gates.wait_started(key)
    return holder


def _finish(task: Any, holder: Any, key: str) -> None:
    """Let the holder end; it ran once, and nothing else of that job did."""
    gates.open(key)
    assert holder.get(timeout=10) == key
    assert gates.runs[key] == 1
    wait_until(lambda: not task.is_locked(key), 5)


# -- chord header ----------------------------------------------------------------------------


def test_a_publish_time_duplicate_in_a_chord_header_refuses_the_chord(env: CeleryEnv) -> None:
    # The testers' case: the same job twice in a header. It used to return at once, run two
    # members and never call the callback (.get() timed out). Now the chord is refused at
    # publish, whatever lock_on_duplicate says, and the member sent before the duplicate is
    # revoked with its lock freed, so the chord, deduplicated, can be sent again at once.
    k1, k2, kc = _key(), _key(), _key()
    first = str(uuid.uuid4())
    # the countdown keeps the member sent before the duplicate waiting in the worker, so its
    # revoke is what stops it (not a race with its run); set on the member itself, since
    # Celery before 5.7 does not pass a chord's countdown on to its header
    header = [pub_quick.s(k1).set(task_id=first, countdown=2), pub_quick.s(k1), pub_quick.s(k2)]
    with pytest.raises(ChordDuplicateError) as caught:
        chord(header, collect.s(kc)).apply_async()
    exc = caught.value
    assert isinstance(exc, AlreadyQueuedError)  # caught by code that catches duplicates
    assert exc.task_id == first and exc.in_header and exc.revoked == (first,)
    assert "chord" in str(exc) and "never reports" in str(exc) and 'lock_at="run"' in str(exc)
    assert not pub_quick.is_locked(k1)  # the revoked member's lock was freed at once
    assert not pub_quick.is_locked(k2)  # the member after the duplicate was never sent

    res = chord([pub_quick.s(k1), pub_quick.s(k2)], collect.s(kc))()
    assert res.get(timeout=10) == [k1, k2]
    env.wait_state(first, "REVOKED", timeout=10)
    assert gates.runs[k1] == 1 and gates.runs[k2] == 1 and gates.runs[kc] == 1


def test_a_publish_time_duplicate_of_a_running_job_refuses_the_chord(env: CeleryEnv) -> None:
    k, k2, kc = _key(), _key(), _key()
    holder = _holder(pub_block, k)
    try:
        with pytest.raises(ChordDuplicateError) as caught:
            chord([pub_quick.s(k2), pub_block.s(k)], collect.s(kc))()
        assert caught.value.task_id == holder.id and not caught.value.in_header
        assert len(caught.value.revoked) == 1
        assert pub_block.lock_holder(k) == holder.id  # the holder is untouched
    finally:
        _finish(pub_block, holder, k)
    assert gates.runs[kc] == 0


def test_a_run_time_duplicate_in_a_chord_header_fails_the_chord(env: CeleryEnv) -> None:
    # lock_at="run": the worker refuses the member. A skip (Ignore) never reached the chord's
    # counter and the callback waited forever; the member now fails with TaskLockedError and
    # the callback's result ends with ChordError.
    k, k2, kc = _key(), _key(), _key()
    holder = _holder(run_block, k)
    try:
        res = chord([run_block.s(k), run_quick.s(k2)], collect.s(kc))()
        # .get() on a chord's result raises its header's failure first (Celery's own rule)
        with pytest.raises(TaskLockedError) as caught:
            res.get(timeout=10)
        assert caught.value.task_id == holder.id
        env.wait_state(res.id, "FAILURE", timeout=10)
        assert isinstance(res.result, ChordError) and "TaskLockedError" in str(res.result)
        member = res.parent.results[0]
        assert member.state == "FAILURE"
        assert run_block.lock_holder(k) == holder.id
    finally:
        _finish(run_block, holder, k)
    assert gates.runs[k2] == 1 and gates.runs[kc] == 0


# -- group -----------------------------------------------------------------------------------


def test_a_publish_time_duplicate_in_a_group_fails_its_slot(env: CeleryEnv) -> None:
    # The GroupResult holds the member's own id (Celery drops what apply_async returns), so the
    # holder's result cannot stand in for it: the slot fails with AlreadyQueuedError naming the
    # holder, and the other members run.
    k, k2 = _key(), _key()
    holder = _holder(pub_block, k)
    try:
        res = group(pub_block.s(k), pub_quick.s(k2)).apply_async()
        with pytest.raises(AlreadyQueuedError) as caught:
            res.get(timeout=10)
        assert caught.value.task_id == holder.id
        dup, value = res.get(timeout=10, propagate=False)
        assert isinstance(dup, AlreadyQueuedError) and value == k2
        assert pub_block.lock_holder(k) == holder.id
    finally:
        _finish(pub_block, holder, k)


def test_a_raise_mode_duplicate_in_a_group_raises_at_publish(env: CeleryEnv) -> None:
    k = _key()
    holder = _holder(pub_block_raise, k)
    try:
        with pytest.raises(AlreadyQueuedError) as caught:
            group(pub_block_raise.s(k), plain.s(_key())).apply_async()
        assert caught.value.task_id == holder.id
    finally:
        _finish(pub_block_raise, holder, k)


# -- chain -----------------------------------------------------------------------------------


def test_a_publish_time_duplicate_at_the_head_of_a_chain_fails_the_chain(env: CeleryEnv) -> None:
    # The chain's result is its last member's id: with the head deduplicated (and the rest not
    # sent) it stayed PENDING. Now the head and the rest are failed with AlreadyQueuedError.
    k, k2 = _key(), _key()
    holder = _holder(pub_block, k)
    try:
        res = chain(pub_block.si(k), plain.si(k2)).apply_async()
        with pytest.raises(AlreadyQueuedError) as caught:
            res.get(timeout=10)
        assert caught.value.task_id == holder.id
        assert res.parent.state == "FAILURE"
        assert pub_block.lock_holder(k) == holder.id
    finally:
        _finish(pub_block, holder, k)
    assert gates.runs[k2] == 0  # the rest of the chain was not sent


@pytest.mark.parametrize("task", [pub_block, pub_block_raise], ids=["return", "raise"])
def test_a_publish_time_duplicate_in_the_middle_of_a_chain_fails_the_rest(
    env: CeleryEnv, task: Any
) -> None:
    # The member is sent by the worker that ran the step before it. It is recorded as failed
    # (never raised there, even with lock_on_duplicate="raise": Celery would record that as
    # the failure of the step before it, whose body succeeded); the rest of the chain fails.
    k0, k, k2 = _key(), _key(), _key()
    holder = _holder(task, k)
    try:
        res = chain(plain.si(k0), task.si(k), plain.si(k2)).apply_async()
        with pytest.raises(AlreadyQueuedError) as caught:
            res.get(timeout=10)
        assert caught.value.task_id == holder.id
        member, first = res.parent, res.parent.parent
        assert member.state == "FAILURE"
        # Polled from the backend: Celery stores this step only after it sent the next one,
        # and first.get(timeout=5) once timed out on the oldest Celery although the step ran
        # (its result consumer did not see the message; why was not found)
        assert wait_until(lambda: first.state == "SUCCESS", 10), first.state
        assert first.result == k0
        assert task.lock_holder(k) == holder.id
    finally:
        _finish(task, holder, k)
    assert gates.runs[k0] == 1 and gates.runs[k2] == 0


def test_a_publish_time_duplicate_in_a_chord_sent_by_a_worker_fails_the_chord(
    env: CeleryEnv,
) -> None:
    # A chord as a chain's next step is sent by the worker that ran the step before it: no
    # caller could catch a raise there, so the member is recorded as a failed part instead,
    # and the chord's callback ends with ChordError once the other members have reported.
    k0, k, k2, kc = _key(), _key(), _key(), _key()
    holder = _holder(pub_block, k)
    try:
        res = chain(plain.si(k0), chord([pub_block.si(k), pub_quick.si(k2)], collect.s(kc)))()
        env.wait_state(res.id, "FAILURE", timeout=10)
        assert isinstance(res.result, ChordError) and "AlreadyQueuedError" in str(res.result)
        assert pub_block.lock_holder(k) == holder.id
    finally:
        _finish(pub_block, holder, k)
    assert gates.runs[k0] == 1 and gates.runs[k2] == 1 and gates.runs[kc] == 0


def test_a_publish_time_duplicate_at_the_end_of_a_chain_fails_the_chain(env: CeleryEnv) -> None:
    # the last step is sent with an empty chain: still a canvas member, whose id is the chain's
    k0, k = _key(), _key()
    holder = _holder(pub_block, k)
    try:
        res = chain(plain.si(k0), pub_block.si(k)).apply_async()
        with pytest.raises(AlreadyQueuedError) as caught:
            res.get(timeout=10)
        assert caught.value.task_id == holder.id
        # Celery sends a chain's next step before it stores the step that ran: the failure
        # of the last step can be seen before the first one's SUCCESS
        assert wait_until(lambda: res.parent.state == "SUCCESS", 10), res.parent.state
    finally:
        _finish(pub_block, holder, k)
