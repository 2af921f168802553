"""Write the table of docs/combinations.md: every pair of task options, supported or refused.

Each pair's row gives the two settings, the options a row needs besides them to mean anything
(``lock_debounce`` needs a publish-time lock, ``lock_rate_key`` needs ``lock_rate``), and the
class check's verdict: refused with the check's own message, or supported with the tests that
prove it (the model test of every admitted combination, and a test of that pair where one
exists). tests/test_combinations.py checks the table against the class check.

    .venv/bin/python scripts/combinations.py      # rewrites the table between its markers
"""

from __future__ import annotations

import ast
import itertools
import re
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from celery_singleton_lock._celery.options import validate_options  # noqa: E402

PAGE = ROOT / "docs" / "combinations.md"
BEGIN, END = "<!-- the matrix: scripts/combinations.py -->", "<!-- end of the matrix -->"

#: every setting of one option the matrix pairs: its code, and the options it needs besides
SETTINGS: list[tuple[str, str]] = [
    ('lock_at="publish"', ""),
    ('lock_at="queue"', ""),
    ("lock_limit=3", ""),
    ("lock_limit=None", 'lock_rate="5/s"'),
    ('lock_rate="5/s"', ""),
    ('lock_rate_key="partner"', 'lock_rate="5/s"'),
    ("lock_rate_max_delay=0", 'lock_rate="5/s"'),
    ("lock_cooldown=5", ""),
    ("lock_cooldown_on_failure=False", "lock_cooldown=5"),
    ("lock_debounce=1", 'lock_at="publish"'),
    ("lock_release_on_start=True", 'lock_at="publish"'),
    ('lock_unique_on=["n"]', ""),
    ("lock_key=callable", ""),
    ("lock_ttl=60", ""),
    ("lock_queue_ttl=60", ""),
    ('lock_on_duplicate="raise"', 'lock_at="publish"'),
    ('lock_on_locked="retry"', ""),
    ('lock_on_locked="raise"', ""),
    ('lock_on_locked="wait"', ""),
    ("lock_wait_timeout=5", 'lock_on_locked="wait"'),
    ("lock_retry_countdown=5", 'lock_on_locked="retry"'),
]

#: the model-based test of every combination the class check admits
MODEL = "tests/test_job_model.py"

#: the test files the proofs name, by letter
FILES = {
    "L": "tests/test_celery_limits.py",
    "Q": "tests/test_celery_queue.py",
    "R": "tests/test_celery_rate.py",
    "O": "tests/test_celery_options.py",
    "F": "tests/test_celery_flow.py",
    "E": "tests/test_celery_eager.py",
    "S": "tests/test_celery_seams.py",
}

#: a test of one pair, beside the model test: the pair's two settings, then its tests as
#: ``<file letter>:<test name>``
PROOFS: list[tuple[str, ...]] = [
    (
        'lock_at="publish"',
        "lock_limit=3",
        "L:test_publish_slots_listed_and_refusals_counted",
    ),
    (
        'lock_at="queue"',
        "lock_limit=3",
        "Q:test_with_a_lock_limit_the_queued_copy_starts_when_a_slot_frees",
    ),
    (
        'lock_at="publish"',
        'lock_rate="5/s"',
        "R:test_a_publish_time_job_waiting_for_its_turn_is_still_deduplicated",
    ),
    (
        'lock_at="queue"',
        'lock_rate="5/s"',
        "R:test_a_queued_copy_waiting_for_its_turn_stays_the_queued_copy",
    ),
    (
        "lock_limit=3",
        'lock_rate="5/s"',
        "R:test_a_limit_of_two_at_once_and_four_a_second_compose",
    ),
    (
        "lock_limit=3",
        'lock_on_locked="wait"',
        "R:test_a_limit_of_two_at_once_and_four_a_second_compose",
    ),
    (
        'lock_rate="5/s"',
        'lock_on_locked="wait"',
        "R:test_a_limit_of_two_at_once_and_four_a_second_compose",
    ),
    (
        "lock_limit=None",
        'lock_rate="5/s"',
        "R:test_thirty_calls_of_one_key_start_at_most_five_a_second_and_all_run",
    ),
    (
        "lock_limit=None",
        'lock_rate_key="partner"',
        "R:test_a_named_limiter_limits_two_tasks_together",
    ),
    (
        'lock_rate="5/s"',
        'lock_rate_key="partner"',
        "R:test_a_named_limiter_limits_two_tasks_together",
    ),
    (
        'lock_rate="5/s"',
        "lock_rate_max_delay=0",
        "R:test_no_delay_allowed_hands_the_call_to_lock_on_locked_at_once",
    ),
    (
        "lock_rate_max_delay=0",
        'lock_on_locked="raise"',
        "R:test_no_delay_allowed_hands_the_call_to_lock_on_locked_at_once",
    ),
    (
        'lock_rate="5/s"',
        'lock_on_locked="raise"',
        "R:test_no_delay_allowed_hands_the_call_to_lock_on_locked_at_once",
    ),
    (
        'lock_rate="5/s"',
        'lock_on_locked="retry"',
        "E:test_an_eager_call_refused_its_rate_turn_with_retry_ends_ignored",
    ),
    (
        'lock_rate="5/s"',
        'lock_unique_on=["n"]',
        "R:test_thirty_calls_of_one_key_start_at_most_five_a_second_and_all_run",
    ),
    (
        'lock_at="publish"',
        "lock_cooldown=5",
        "L:test_the_cooldown_lasts_as_long_as_configured",
    ),
    (
        "lock_cooldown=5",
        "lock_cooldown_on_failure=False",
        "L:test_a_failed_run_starts_the_cooldown_unless_told_not_to",
    ),
    (
        "lock_cooldown=5",
        'lock_unique_on=["n"]',
        "L:test_cooldown_after_a_run",
    ),
    (
        "lock_cooldown=5",
        'lock_on_duplicate="raise"',
        "L:test_publish_slots_listed_and_refusals_counted",
    ),
    (
        'lock_at="publish"',
        "lock_debounce=1",
        "L:test_debounce_runs_the_last_call",
        "L:test_a_replaced_call_that_arrives_after_its_replacement_ran_is_still_skipped",
    ),
    (
        'lock_at="queue"',
        "lock_debounce=1",
        "L:test_debounce_with_queue_runs_the_last_call_after_the_running_one",
        "Q:test_a_replaced_waiting_copy_ends_replaced_and_its_replacement_starts_at_the_end",
        "L:test_a_replaced_call_that_arrives_after_its_replacement_ran_is_still_skipped",
    ),
    (
        "lock_debounce=1",
        'lock_unique_on=["n"]',
        "L:test_debounce_runs_the_last_call",
    ),
    (
        'lock_at="publish"',
        "lock_release_on_start=True",
        "O:test_lock_release_on_start_dedups_the_queue_only",
    ),
    (
        'lock_at="publish"',
        'lock_on_duplicate="raise"',
        "O:test_lock_on_duplicate_raise",
    ),
    (
        'lock_at="publish"',
        'lock_unique_on=["n"]',
        "S:test_a_debounced_call_during_a_retry_countdown_gets_that_job_back",
    ),
    (
        'lock_on_locked="retry"',
        "lock_retry_countdown=5",
        "O:test_lock_retry_countdown_spaces_the_retries",
    ),
    (
        'lock_on_locked="wait"',
        "lock_wait_timeout=5",
        "O:test_lock_on_locked_wait_skips_after_lock_wait_timeout",
    ),
    (
        'lock_at="queue"',
        "lock_retry_countdown=5",
        "L:test_queue_one_queued_and_one_running",
    ),
    (
        'lock_at="queue"',
        'lock_unique_on=["n"]',
        "L:test_queue_one_queued_and_one_running",
    ),
    (
        'lock_at="queue"',
        "lock_ttl=60",
        "Q:test_the_queued_copy_starts_when_the_run_ends",
    ),
    (
        "lock_limit=3",
        'lock_unique_on=["n"]',
        "L:test_limit_three_runs_at_once",
    ),
    (
        "lock_limit=3",
        "lock_ttl=60",
        "L:test_limit_three_runs_at_once",
    ),
    (
        'lock_at="publish"',
        'lock_on_locked="retry"',
        "O:test_lock_on_locked_retry_of_a_publish_mode_duplicate_sent_by_name",
        "E:test_an_eager_call_of_a_job_held_elsewhere_ends_as_a_duplicate",
    ),
    (
        'lock_at="publish"',
        'lock_on_locked="raise"',
        "E:test_an_eager_call_of_a_job_held_elsewhere_ends_as_a_duplicate",
    ),
    (
        'lock_at="publish"',
        'lock_on_locked="wait"',
        "E:test_an_eager_call_of_a_job_held_elsewhere_ends_as_a_duplicate",
    ),
    (
        'lock_at="queue"',
        'lock_on_locked="retry"',
        "E:test_an_eager_call_of_a_job_held_elsewhere_ends_as_a_duplicate",
    ),
    (
        'lock_at="queue"',
        'lock_on_locked="wait"',
        "E:test_an_eager_call_of_a_job_held_elsewhere_ends_as_a_duplicate",
    ),
    (
        'lock_at="publish"',
        "lock_key=callable",
        "F:test_a_canvas_member_of_a_publish_mode_task_is_deduplicated_at_publish",
    ),
    (
        'lock_unique_on=["n"]',
        "lock_ttl=60",
        "O:test_lock_ttl_and_the_singleton_lock_ttl_setting_lease_a_running_lock",
    ),
]


def proofs(a: str, b: str) -> list[str]:
    """The tests of the pair ``a``, ``b`` besides the model test."""
    found = [p[2:] for p in PROOFS if {p[0], p[1]} == {a, b}]
    return [f"{FILES[t[0]]}::{t[2:]}" for tests in found for t in tests]


def parse(code: str) -> dict[str, Any]:
    """The options a cell's code names (``lock_key=callable``: a callable)."""
    options: dict[str, Any] = {}
    for part in filter(None, (p.strip() for p in code.split(";"))):
        name, _, value = part.partition("=")
        options[name] = str if value == "callable" else ast.literal_eval(value)
    return options


def verdict(options: dict[str, Any]) -> str | None:
    """``None``: the class check admits ``options``; else its message (without the task)."""
    try:
        validate_options("matrix", options)
    except (TypeError, ValueError) as exc:
        return re.sub(r"^task 'matrix': ", "", str(exc))
    return None


def rows() -> list[str]:
    """The table: one row per pair of settings of two different options."""
    lines = [
        "| option | with | and (needed) | verdict | proven by, or why not |",
        "| --- | --- | --- | --- | --- |",
    ]
    for (a, needs_a), (b, needs_b) in itertools.combinations(SETTINGS, 2):
        own = {**parse(a), **parse(b)}
        if len(own) < 2:
            continue  # two values of one option: not a pair
        needs = {**parse(needs_b), **parse(needs_a)}
        extra = {k: v for k, v in needs.items() if k not in own}
        needed = "; ".join(
            code
            for code in dict.fromkeys(filter(None, [needs_a, needs_b]))
            if parse(code).items() <= extra.items()
        )
        said = verdict({**extra, **own})
        if said is None:
            tests = [MODEL, *proofs(a, b)]
            cell = "supported", ", ".join(f"`{t}`" for t in tests)
        else:
            cell = "**refused**", said.replace("|", "\\|")
        lines.append(
            f"| `{a}` | `{b}` | {f'`{needed}`' if needed else ''} | {cell[0]} | {cell[1]} |"
        )
    return lines


def main() -> None:
    text = PAGE.read_text(encoding="utf-8")
    head, _, rest = text.partition(BEGIN)
    _, _, tail = rest.partition(END)
    PAGE.write_text(f"{head}{BEGIN}\n" + "\n".join(rows()) + f"\n{END}{tail}", encoding="utf-8")


if __name__ == "__main__":
    main()
