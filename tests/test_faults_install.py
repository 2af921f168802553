"""install() on a lazy app, run as a user runs it (a hole found from outside).

The app module is written as the README says: a plain ``@app.task``, the task named in
``singleton_lock_tasks``, ``install(app)`` at the end of the module. A prefork worker with
concurrency 4 runs it, and another process that imports the module publishes. Before the fix,
evaluating the task's proxy registered the task without finalizing the app, so the publisher
never put the lock in front of its class (no dedup at publish), and the name it locked under
came from a stand-in that did not know the task's signature, so the worker computed another
name for the duplicate and ran it beside the first.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from lock_helpers import START_TIMEOUT, wait_until

from celery_singleton_lock.testing import RedisServer

pytestmark = [pytest.mark.faults, pytest.mark.slow, pytest.mark.timeout(2 * START_TIMEOUT + 60)]

ROOT = Path(__file__).resolve().parents[1]

APP_MODULE = """
import json, os, time
import redis
from celery import Celery
from celery_singleton_lock import install

PORT = int(os.environ["LAZY_REDIS_PORT"])
app = Celery("lazymod", broker=f"redis://127.0.0.1:{PORT}/0", backend=f"redis://127.0.0.1:{PORT}/1")
app.conf.singleton_lock_redis_url = f"redis://127.0.0.1:{PORT}/2"
app.conf.singleton_lock_tasks = {"lazymod.report": {"lock_at": "publish"}}


@app.task
def report(day):
    runs = redis.Redis(port=PORT, db=3)
    start = time.time()
    time.sleep(2)  # the body's work: the second delay comes while it runs
    runs.rpush("runs", json.dumps({"id": report.request.id, "start": start, "end": time.time()}))
    return day


install(app)
"""

PUBLISHER = """
import json, os
from celery import Celery
import lazymod

first = lazymod.report.delay("monday")
second = lazymod.report.delay("monday")
# A publisher that takes no lock at all (no install(), sent by name): only the worker can
# keep this one from running beside the first.
plain = Celery("plain", broker=lazymod.app.conf.broker_url)
third = plain.send_task("lazymod.report", args=["monday"])
print(json.dumps([first.id, second.id, third.id]))
"""


@pytest.fixture
def lazy_app(tmp_path: Path, make_redis_server: Any) -> Iterator[tuple[Path, RedisServer]]:
    (tmp_path / "lazymod.py").write_text(APP_MODULE)
    (tmp_path / "publish.py").write_text(PUBLISHER)
    yield tmp_path, make_redis_server()


def _env(module_dir: Path, server: RedisServer) -> dict[str, str]:
    env = dict(os.environ)
    env["LAZY_REDIS_PORT"] = str(server.port)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(module_dir), str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]
    )
    return env


def test_two_delays_of_an_installed_lazy_app_task_run_once(
    lazy_app: tuple[Path, RedisServer],
) -> None:
    module_dir, server = lazy_app
    env = _env(module_dir, server)
    log = open(module_dir / "worker.log", "wb")  # noqa: SIM115 - closed below
    worker = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "lazymod", "worker", "-P", "prefork", "-c", "4",
         "--without-mingle", "--without-gossip", "-l", "info"],
        cwd=module_dir, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    try:

        def ready() -> bool:
            return b"ready." in (module_dir / "worker.log").read_bytes()

        assert wait_until(ready, START_TIMEOUT, "the worker to be ready"), (
            module_dir / "worker.log"
        ).read_text()
        published = subprocess.run(
            [sys.executable, "publish.py"],
            cwd=module_dir, env=env, capture_output=True, text=True, timeout=START_TIMEOUT,
            check=True,
        )  # fmt: skip
        first, second, third = json.loads(published.stdout.strip().splitlines()[-1])
        # Deduplicated at publish: the second .delay() returned the first job.
        assert second == first
        runs_db = redis.Redis(port=server.port, db=3)
        results = redis.Redis(port=server.port, db=1)
        # The one sent by name without a lock is skipped by the worker (its result says so).
        assert wait_until(lambda: results.exists(f"celery-task-meta-{third}") == 1, 30)
        assert wait_until(lambda: runs_db.llen("runs") >= 1, 30)
        # Both messages sent are done with (the first ran, the third was skipped) and the
        # queue is empty: no other run can come.
        assert wait_until(lambda: results.exists(f"celery-task-meta-{first}") == 1, 30)
        broker = redis.Redis(port=server.port, db=0)
        assert broker.llen("celery") == 0 and broker.hlen("unacked") == 0
        runs = [json.loads(r) for r in runs_db.lrange("runs", 0, -1)]
        assert [run["id"] for run in runs] == [first], (module_dir / "worker.log").read_text()
        skipped = json.loads(results.get(f"celery-task-meta-{third}") or b"{}")
        assert skipped["status"] == "SKIPPED"
        assert skipped["result"]["holder"] == first
    finally:
        os.killpg(worker.pid, signal.SIGTERM)
        try:
            worker.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(worker.pid, signal.SIGKILL)
            worker.wait(5)
        log.close()


@pytest.mark.parametrize("when", ["before finalize", "after finalize"])
def test_a_task_defined_before_or_after_finalize_is_deduplicated_at_its_first_publish(
    make_redis_server: Any, when: str
) -> None:
    """No worker needed: the publisher alone must return the first job for the duplicate,
    whether the app was finalized before the task was defined or not at all yet."""
    from celery_fixtures import app_task, configure, new_app

    from celery_singleton_lock import install

    server = make_redis_server()
    app = new_app("lazy2")
    configure(app, server, singleton_lock_tasks={"lazy2.sync": {"lock_at": "publish"}})
    install(app)
    if when == "after finalize":
        app.finalize()

    @app_task(app, name="lazy2.sync", shared=False)
    def sync(day: str) -> str:
        return day

    first, second = sync.delay("monday"), sync.delay("monday")
    assert second.id == first.id
    assert sync.delay("tuesday").id != first.id
    app.close()
