"""The examples, run as a user runs them (``python examples/X.py --embedded``): each starts its
own server and ``celery worker`` processes, prints what happened and exits 0 only when every
step went as it says."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"

pytestmark = pytest.mark.slow


def _run(script: str, timeout: float = 180.0) -> str:
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / script), "--embedded"],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=str(EXAMPLES.parent),
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_the_celery_demo() -> None:
    out = _run("demo_celery.py")
    assert "SKIPPED, held by" in out
    assert "$ celery -A demo_celery locks list" in out and "running" in out
    assert "(the same job: nothing sent)" in out
    assert "SKIPPED, the lock is still" in out
    assert "synced on try 2" in out
    assert "nobody renews it, so its lease ran out" in out


def test_the_dedup_example() -> None:
    assert "Done:" in _run("dedup_jobs.py")
