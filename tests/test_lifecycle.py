"""The job's lifecycle table: complete, and the one the code takes its states from."""

from __future__ import annotations

from celery_singleton_lock._celery import lifecycle
from celery_singleton_lock._celery.lifecycle import (
    FREE,
    STATES,
    TABLE,
    Event,
    HoldState,
    lifecycle_table,
)


def test_every_event_has_a_row_and_every_row_names_the_table_s_states() -> None:
    assert {s.event for s in TABLE} == set(Event)
    for step in TABLE:
        assert step.before and set(step.before) <= set(STATES), step
        assert step.after in STATES or step.after == "unchanged", step
    # every state is reached by some event, and left by some event
    assert {s.after for s in TABLE} >= set(STATES)
    assert {b for s in TABLE for b in s.before} >= set(STATES)


def test_the_states_the_code_writes_are_the_table_s() -> None:
    assert lifecycle.AT_PUBLISH == HoldState.QUEUED
    assert lifecycle.AT_RUN == HoldState.RUNNING
    assert lifecycle.AT_RETRY == lifecycle.AT_COMEBACK == HoldState.REQUEUED
    assert lifecycle.AT_REDELIVERY == HoldState.REQUEUED
    assert lifecycle.AT_COOLDOWN == HoldState.COOLDOWN
    assert lifecycle.REPLACEABLE == lifecycle.PURGEABLE == (HoldState.QUEUED,)
    assert lifecycle.DROPPABLE == lifecycle.REVOCABLE == (HoldState.QUEUED, HoldState.REQUEUED)
    assert "" not in STATES and FREE not in HoldState.__members__.values()


def test_the_rendered_table_has_a_row_per_step() -> None:
    lines = lifecycle_table().splitlines()
    assert len(lines) == 2 + len(TABLE)
    assert all(line.count(" | ") == 5 for line in lines if not line.startswith("| ---"))
