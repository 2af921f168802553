"""The examples, run as a user runs them (``python examples/X.py --embedded``): each starts its
own server and ``celery worker`` processes, prints what happened and exits 0 only when every
step went as it says. And the README's quick start, pasted into a shell beside the worker it
says to start."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from celery_procs import WorkerProcess
from test_docs import quick_start

from celery_singleton_lock.testing import RedisServer

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"

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


class QuickStartWorker(WorkerProcess):
    """The README's worker command, run as it is (by bash) in the directory of its ``proj.py``."""

    def __init__(self, base: str, workdir: Path, command: str) -> None:
        bin_dir = str(Path(sys.executable).parent)  # `celery` and `python` of this environment
        super().__init__(base, workdir, env={"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"})
        self.workdir, self.line = workdir, command

    def command(self) -> list[str]:
        return ["bash", "-c", f"cd {shlex.quote(str(self.workdir))} && exec {self.line}"]


def test_the_readme_quick_start_shows_a_skip(tmp_path: Path) -> None:
    """The README's step 3, pasted into a shell beside its worker, prints what its comments
    say: the second rebuild_index(1) ended SKIPPED, naming the first as the holder; the second
    send_digest.delay(7) returned the first job; both jobs' results."""
    proj, worker, paste = quick_start(ROOT / "README.md")
    with RedisServer() as server:
        base = f"redis://127.0.0.1:{server.port}"
        (tmp_path / "proj.py").write_text(proj.replace("redis://127.0.0.1:6379", base))
        with QuickStartWorker(base, tmp_path, worker.strip()) as proc:
            done = subprocess.run(
                ["bash", "-c", paste],
                cwd=tmp_path,
                env=proc.env | {k: v for k, v in os.environ.items() if k != "PATH"},
                capture_output=True,
                text=True,
                timeout=120,
            )
            assert done.returncode == 0, done.stdout + done.stderr + proc.log()[-3000:]
            assert re.search(
                r"skipped proj\.rebuild_index\[[^\]]+\]: lock .* is held by", proc.log()
            )
    printed = done.stdout.splitlines()
    said = [line.split("  # ", 1)[1] for line in paste.splitlines() if line.startswith("print(")]
    assert printed == ["SKIPPED True", "True", "rebuilt 1 / sent to 7"]
    assert all(comment.startswith(out) for out, comment in zip(printed, said, strict=True))
