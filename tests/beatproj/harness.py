"""What the beat tests run in the test process: real ``celery beat`` subprocesses under the
leader scheduler, the sends read back from their logs, and the leader and its last-run records
read from Redis.

A send is a ``Scheduler: Sending due task`` line of a beat's log: Celery logs it just before it
publishes, and the leader scheduler lets it through only when it sends. Every beat of a test
runs on this host, so the times of the lines of two beats compare.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import re
import signal
import subprocess
import sys
from datetime import datetime
from pathlib import Path
from typing import Any

from celery_singleton_lock import LockSpace

ROOT = Path(__file__).resolve().parents[2]
LEADER_SCHEDULER = "celery_singleton_lock.beat:LeaderScheduler"

SEND_LINE = re.compile(
    r"^\[(?P<ts>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}): INFO/[^\]]+\] "
    r"Scheduler: Sending due task (?P<entry>\S+) ",
    re.MULTILINE,
)


def log_time(stamp: str) -> float:
    """A log line's time (``2024-05-01 12:00:00,123``, local time) as a Unix time."""
    return datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp()


class Beat:
    """One ``celery -A <app> beat -S <scheduler>`` subprocess in a process group of its own,
    logging at INFO to a file; always stopped (SIGCONT, then SIGKILL to the group)."""

    def __init__(
        self,
        app: str,
        log_dir: Path,
        n: int,
        env: dict[str, str],
        scheduler: str = LEADER_SCHEDULER,
    ) -> None:
        self.n = n
        self.log_path = log_dir / f"beat-{n}.log"
        self._log = open(self.log_path, "wb")  # noqa: SIM115 - closed in stop()
        command = [
            sys.executable, "-m", "celery", "-A", app, "beat", "-S", scheduler,
            "-s", str(log_dir / f"schedule-{n}"), "-l", "info",
        ]  # fmt: skip
        self.proc = subprocess.Popen(
            command,
            cwd=ROOT,
            env={
                **os.environ,
                **env,
                "PYTHONPATH": os.pathsep.join(
                    [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]
                ),
                "PYTHONUNBUFFERED": "1",
            },
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def sends(self, entry: str) -> list[float]:
        """When this beat sent ``entry`` (Unix times, from its log)."""
        return [log_time(m["ts"]) for m in SEND_LINE.finditer(self.log()) if m["entry"] == entry]

    def signal(self, signum: int) -> None:
        os.kill(self.proc.pid, signum)

    def stop(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            if self.proc.poll() is None:
                os.killpg(self.proc.pid, signal.SIGCONT)
                os.killpg(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(10)
        self._log.close()


def all_sends(beats: list[Beat], entry: str) -> list[float]:
    return sorted(t for beat in beats for t in beat.sends(entry))


def sends_since(beats: list[Beat], entry: str, since: float) -> list[float]:
    return [t for t in all_sends(beats, entry) if t > since]


def close_pairs(times: list[float], within: float) -> list[tuple[float, float]]:
    """The consecutive sends closer together than ``within`` seconds (a tick sent twice)."""
    ordered = sorted(times)
    return [(a, b) for a, b in itertools.pairwise(ordered) if b - a < within]


def lock_space(client: Any, lock_name: str) -> LockSpace | None:
    """The lock space the beats' leader lock is in, found by its key (``<prefix>:{name}``):
    the test does not assume the app's ``singleton_lock_prefix``. ``None`` before any beat
    tried the lock."""
    for key in client.scan_iter(match=f"*:{{{lock_name}}}*", count=1000):
        text = key.decode() if isinstance(key, bytes) else key
        return LockSpace(client, text.partition(":{")[0])
    return None


def holder(client: Any, lock_name: str) -> str:
    """The owner token of the leader lock's holder ("" when free)."""
    space = lock_space(client, lock_name)
    return "" if space is None else str(space.inspect(lock_name).holder or "")


def leader(beats: list[Beat], client: Any, lock_name: str) -> Beat | None:
    """The beat that holds the leader lock now (its owner token names its pid)."""
    token = holder(client, lock_name)
    for beat in beats:
        if token and f":{beat.pid}:" in token:
            return beat
    return None


def records(client: Any, lock_name: str) -> dict[str, datetime]:
    """The last-run records beside the leader lock: entry name -> last send."""
    space = lock_space(client, lock_name)
    if space is None:
        return {}
    raw = client.hgetall(space.keys(lock_name).lock + ":last_run")
    return {
        (k.decode() if isinstance(k, bytes) else k): datetime.fromisoformat(
            v.decode() if isinstance(v, bytes) else v
        )
        for k, v in raw.items()
    }


def report(beats: list[Beat], tail: int = 4000) -> str:
    return "\n".join(f"--- beat {b.n} (pid {b.pid}) ---\n{b.log()[-tail:]}" for b in beats)
