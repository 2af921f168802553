"""No leaks: after 10,000 mixed tasks (success, failure, retry, skipped duplicates,
revoked while queued, publish-time locks) through a real prefork worker, the lock keyspace holds
only expiring records and no held lock, and the worker's processes have the threads they had
before the load (and the recent counts' writer: one a process)."""

from __future__ import annotations

import contextlib
import os
import random
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import redis
from celery_procs import WorkerProcess, close_app, new_job, redis_base, task_states
from faultapp import DATA_DB, LOCK_DB, RESULT_DB, make_app
from lock_helpers import wait_until

from celery_singleton_lock import LockSpace
from celery_singleton_lock.testing import RedisServer

pytestmark = [pytest.mark.faults, pytest.mark.slow, pytest.mark.timeout(600)]

FINAL = {"SUCCESS", "FAILURE", "SKIPPED", "REVOKED"}
TASKS = int(os.environ.get("LEAK_TASKS", "10000"))


def _threads_by_pid(app: Any, probes: int = 6) -> dict[int, list[str]]:
    """Each pool child's thread names, as a locked task running there sees them."""
    replies = [app.tasks["fault.threads"].delay(new_job("probe"), 0.2) for _ in range(probes)]
    return {r["pid"]: sorted(r["threads"]) for r in (x.get(timeout=60) for x in replies)}


#: the thread of :class:`celery_singleton_lock._celery.counts.RecentCounter`
COUNTS_WRITER = "celery-singleton-lock-counts"


def _but_the_counts_writer(after: list[str], before: list[str]) -> bool:
    """``after`` is ``before`` and at most one counts writer more."""
    return after.count(COUNTS_WRITER) <= 1 and [t for t in after if t != COUNTS_WRITER] == [
        t for t in before if t != COUNTS_WRITER
    ]


def _main_threads(app: Any, worker: WorkerProcess) -> list[str]:
    answer = app.control.broadcast(
        "fault_threads", destination=[worker.hostname], reply=True, timeout=5
    )
    return sorted(answer[0][worker.hostname]["threads"])


def test_ten_thousand_mixed_tasks_leave_no_lock_and_no_thread(
    make_redis_server: Any, tmp_path: Path
) -> None:
    server: RedisServer = make_redis_server()
    base = redis_base(server.port)
    app = make_app(base)
    worker = WorkerProcess(base, tmp_path, concurrency=2).start()
    results = redis.Redis(port=server.port, db=RESULT_DB)
    data = redis.Redis(port=server.port, db=DATA_DB)
    locks = redis.Redis(port=server.port, db=LOCK_DB)
    try:
        children_before = _threads_by_pid(app)
        main_before = _main_threads(app, worker)
        rng = random.Random(7)
        mixed, publish = app.tasks["fault.mixed"], app.tasks["fault.publish_work"]
        ids: list[str] = []
        revoked: set[str] = set()
        for _ in range(TASKS):
            roll = rng.random()
            if roll < 0.1:
                result = publish.delay(f"leak-{rng.randrange(50)}", 0.0)
            else:
                mode = "fail" if roll < 0.2 else "retry" if roll < 0.3 else "ok"
                # 300 keys: concurrent runs of one key collide now and then, and are skipped
                result = mixed.delay(f"k{rng.randrange(300)}", mode)
            ids.append(result.id)
            if roll > 0.98:
                app.control.revoke(result.id)
                revoked.add(result.id)

        # A publish-time duplicate returns the first task's result: ids has repeats.
        distinct = list(dict.fromkeys(ids))

        retried_ran: set[str] = set()

        def ended(task_id: str, state: str | None) -> bool:
            """A final state. A RETRY is not (its retry is on its way), unless the retry has
            ended already and the RETRY of the run that sent it was stored after that: Celery
            stores it after sending the retry, and on a loaded machine the retry can run
            first (its SUCCESS overwritten: Celery's guard reads, then writes), or be marked
            REVOKED first (a task revoked while it ran). Seen under load, in plain Celery too."""
            if state in FINAL:
                return True
            return state == "RETRY" and (task_id in revoked or task_id in retried_ran)

        def finished() -> int:
            retried_ran.update(
                i.decode() for i in data.smembers("mixed:ran") if isinstance(i, bytes)
            )
            return sum(ended(i, state) for i, state in task_states(results, distinct).items())

        with contextlib.suppress(AssertionError):  # what is unfinished is said below
            wait_until(lambda: finished() >= len(distinct), 480, "every task to finish", 1.0)
        all_states = task_states(results, distinct)
        unfinished = Counter(
            all_states.get(i, "no result") for i in distinct if not ended(i, all_states.get(i))
        )
        assert not unfinished, f"tasks never finished: {dict(unfinished)}; {worker.log()[-3000:]}"
        states = Counter(all_states.values())
        assert set(states) - {"RETRY"} == FINAL, states  # every kind of ending happened

        # Only expiring records: no held lock, every key (meta hashes) with a TTL.
        space = LockSpace(locks)
        held = [space.inspect(keys.lock) for keys in space.find()]
        assert held == [], [(s.info, s.lease_left, s.run_token, s.owners) for s in held[:5]]
        # every key left expires (-1: no lease); one that expired since the scan (-2) is gone
        forever = [key for key in locks.scan_iter(count=1000) if locks.pttl(key) == -1]
        assert forever == [], [(key, locks.type(key)) for key in forever[:5]]

        # The same threads as before the load, in the main process and in each pool child, but
        # one: the recent counts' writer, started at a process's first duplicate (one a
        # process, however many duplicates).
        assert _but_the_counts_writer(_main_threads(app, worker), main_before)
        children_after = _threads_by_pid(app)
        for pid in children_before.keys() & children_after.keys():
            assert _but_the_counts_writer(children_after[pid], children_before[pid]), pid
    finally:
        worker.stop()
        close_app(app)
