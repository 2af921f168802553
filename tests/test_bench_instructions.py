"""bench/instructions.py's arithmetic and table, from made-up counts (its callgrind runs take
minutes and belong to the benchmark, not to the suite)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_instructions", BENCH / "instructions.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _counts(per_job: int, check: int, start: int = 5_000_000) -> dict[int, tuple[int, int]]:
    """(publishes', runs') counts at 20, 80, 50 and 250 jobs: a start-up part, then ``check``
    instructions a job between 20 and 80 jobs and ``per_job`` between 50 and 250, of which
    the publishes' are four fifths."""

    def split(total: int) -> tuple[int, int]:
        return total * 4 // 5, total - total * 4 // 5

    return {
        20: split(start),
        80: split(start + 60 * check),
        50: split(start + 1),
        250: split(start + 1 + 200 * per_job),
    }


def test_the_figure_is_the_slope_and_the_ratios_are_the_issues() -> None:
    bench = _load()
    counts = {
        "plain": _counts(2_000_000, 2_010_000),
        "celery-singleton": _counts(2_500_000, 2_500_000),
        "celery-once": _counts(2_600_000, 2_600_000),
        "floor-run": _counts(2_400_000, 2_400_000),
        "locked-run": _counts(2_496_000, 2_496_000),
        "locked-publish": _counts(2_750_000, 2_750_000),
    }
    summary = bench.summarize(counts, ((20, 80), (50, 250)))
    plain = summary["rows"]["plain"]
    assert (plain["per_job"], plain["check"], plain["x_plain"]) == (2_000_000, 2_010_000, 1.0)
    assert (plain["publish"], plain["run"]) == (1_600_000, 400_000)
    assert plain["spread"] == pytest.approx(0.005)
    assert summary["rows"]["locked-publish"]["x_plain"] == 1.375
    # publish mode against the lower of the two peers (celery-singleton here)
    assert summary["targets"]["publish"] == {"ratio": 1.1, "target": 1.0}
    assert summary["targets"]["run"] == {"ratio": 1.04, "target": 1.03}

    table = bench.render_markdown(summary, "python bench/instructions.py", "2026-01-01", "x")
    assert "| plain task | 2,000 k | 1.00 | 1,600 k | 400 k | 2,010 k | 0.5% |" in table
    assert '| ours, `lock_at="publish"` | 2,750 k | 1.38 | 2,200 k | 550 k | 2,750 k | 0.0% |' in (
        table
    )
    assert "x the lower of celery-once and celery-singleton: 1.100x (target <= 1.00x, **not" in (
        table
    )
    assert "x the reference: 1.040x (target <= 1.03x, **not met**)" in table


def test_a_missing_peer_leaves_its_target_to_the_other() -> None:
    bench = _load()
    counts = {
        "plain": _counts(2_000_000, 2_000_000),
        "celery-once": _counts(2_600_000, 2_600_000),
        "locked-publish": _counts(2_600_000, 2_600_000),
    }
    summary = bench.summarize(counts, ((20, 80), (50, 250)))
    assert summary["targets"] == {"publish": {"ratio": 1.0, "target": 1.0}}
    assert "celery-singleton: 1.000x (target <= 1.00x, met)" in bench.render_markdown(
        summary, "c", "d", "m"
    )


def test_the_job_counts_are_two_growing_pairs() -> None:
    bench = _load()
    assert bench.parse_pairs("20:80,50:250") == ((20, 80), (50, 250))
    for wrong in ("20:80", "80:20,50:250", "20:80,50:250,1:2", "0:10,50:250"):
        with pytest.raises(Exception, match="two pairs N1:N2 with N1 < N2"):
            bench.parse_pairs(wrong)
