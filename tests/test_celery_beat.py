"""Beat: a periodic task due every second that runs for 3 s never overlaps
itself, and every skipped run is logged with the id of the run that holds the lock.

A real ``celery worker -B`` subprocess (prefork, ``-c 2``, embedded beat with its schedule file
in a temporary folder) on a redis-server of the test's own; the task records its runs in Redis.
"""

from __future__ import annotations

import re
from datetime import datetime
from pathlib import Path

import pytest
from celery_procs import WorkerProcess, close_app, no_overlap, records, redis_base
from faultapp import BEAT_ENV, DATA_DB, LOCK_DB, make_app
from lock_helpers import START_TIMEOUT, wait_until

from celery_singleton_lock.testing import RedisServer

SKIP_LINE = re.compile(
    r"\[(?P<ts>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}): INFO/[^\]]+\] "
    r"skipped fault\.tick\[(?P<dup>[0-9a-f-]+)\]: lock (?P<key>\S+) is held by task "
    r"(?P<holder>[0-9a-f-]+)"
)


@pytest.mark.slow
def test_beat_task_due_every_second_never_overlaps_itself(tmp_path: Path) -> None:
    with RedisServer() as server:
        base = redis_base(server.port)
        app = make_app(base, beat=True)
        data = server.client(db=DATA_DB)
        locks = server.client(db=LOCK_DB)
        key = app.tasks["fault.tick"].lock_key_for("beat")
        try:
            worker = WorkerProcess(
                base,
                tmp_path,
                env={BEAT_ENV: "1"},
                args=("-B", "-s", str(tmp_path / "beat-schedule")),
            )
            with worker:
                worker.wait_log(r"beat: Starting", START_TIMEOUT)
                # two runs ended, and beat's sends in between were skipped twice
                wait_until(
                    lambda: (
                        len(records(data, "intervals", "beat")) >= 2
                        and len(SKIP_LINE.findall(worker.log())) >= 2
                    ),
                    30,
                    "two runs and two skips",
                )
                worker.stop()  # warm: the run in progress finishes
                log = worker.log()
            intervals = records(data, "intervals", "beat")
            starts = records(data, "starts", "beat")
            skips = [m.groupdict() for m in SKIP_LINE.finditer(log)]
            states = {
                s["dup"]: (r.state, r.info) for s in skips for r in [app.AsyncResult(s["dup"])]
            }
            assert not locks.exists(key)
        finally:
            close_app(app)
            data.close()
            locks.close()

    assert len(intervals) >= 2, f"only {len(intervals)} run(s):\n{log[-4000:]}"
    assert len(starts) == len(intervals)  # every run finished (warm shutdown)
    assert no_overlap(intervals), intervals
    runs = {i["id"]: i for i in intervals}
    # Beat sent it every second: the runs in between were skipped, each naming its holder,
    # which was running at that moment.
    assert len(skips) >= 2, log[-4000:]
    for skip in skips:
        assert skip["key"] == key
        assert skip["dup"] not in runs
        holder = runs.get(skip["holder"])
        assert holder is not None, f"skip names {skip['holder']}, not a run: {runs}"
        at = datetime.strptime(skip["ts"], "%Y-%m-%d %H:%M:%S,%f").timestamp()
        # (the run records its start just after taking the lock, its end just before
        # letting go: a small margin)
        assert holder["start"] - 0.3 <= at <= holder["end"] + 0.3, (skip, holder)
        state, info = states[skip["dup"]]
        assert state == "SKIPPED"
        assert info["holder"] == skip["holder"]
