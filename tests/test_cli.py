"""The operator CLI, run as real subprocesses against a real server: what it shows of
held locks, and that release and purge free them (and only them)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from types import SimpleNamespace
from typing import Any, cast

import pytest
from celery_fixtures import locks_command, new_app
from celery_procs import close_app
from lock_helpers import START_TIMEOUT

from celery_singleton_lock import LockedTask, LockSpace, ReentrantLock
from celery_singleton_lock.compat.singleton import Singleton
from celery_singleton_lock.testing import RedisServer

TASK_INFO = json.dumps({"task": "proj.rebuild", "id": "task-1", "host": "w1", "pid": 4242})


def cli(server: RedisServer, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "celery_singleton_lock", "--url", server.url, *args],
        capture_output=True,
        text=True,
        timeout=START_TIMEOUT,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )


def listed(server: RedisServer) -> list[dict[str, Any]]:
    done = cli(server, "list", "--json")
    assert done.returncode == 0, done.stderr
    return cast("list[dict[str, Any]]", json.loads(done.stdout))


def test_list_shows_who_holds_what(redis_server: RedisServer, redis_client: Any) -> None:
    task_lock = ReentrantLock(
        redis_client, "proj.rebuild:abc", ttl=30, owner="task-1", info=TASK_INFO, state="running"
    )
    plain = ReentrantLock(redis_client, "plain", ttl=20)
    assert task_lock.acquire(blocking=False) and plain.acquire(blocking=False)
    try:
        views = {v["key"]: v for v in listed(redis_server)}
        assert set(views) == {"lock:{proj.rebuild:abc}", "lock:{plain}"}
        view = views["lock:{proj.rebuild:abc}"]
        assert view["task"] == "proj.rebuild"
        assert view["holder"] == "task-1"
        assert (view["host"], view["pid"], view["state"]) == ("w1", 4242, "running")
        assert view["fence"] == task_lock.fence
        assert view["hold_count"] == 1
        assert 25 < view["lease_s"] <= 30
        assert 0 <= view["age_s"] < 10
        assert views["lock:{plain}"]["holder"] == plain.owner

        table = cli(redis_server, "list")
        assert table.returncode == 0, table.stderr
        assert "lock:{proj.rebuild:abc}" in table.stdout and "task-1" in table.stdout

        shown = cli(redis_server, "show", "proj.rebuild:abc", "--json")
        assert json.loads(shown.stdout)["holder"] == "task-1"
    finally:
        task_lock.release()
        plain.release()
    assert listed(redis_server) == []


def test_release_frees_one_lock_and_checks_the_holder(
    redis_server: RedisServer, redis_client: Any
) -> None:
    # a short lease: the holder's heartbeat renews it every second, and notices the release
    lock = ReentrantLock(redis_client, "job:1", ttl=3, owner="task-9")
    other = ReentrantLock(redis_client, "job:2", ttl=30, owner="task-8")
    assert lock.acquire(blocking=False) and other.acquire(blocking=False)

    wrong = cli(redis_server, "release", "lock:{job:1}", "--holder", "someone-else", "--json")
    assert json.loads(wrong.stdout) == {
        "key": "lock:{job:1}",
        "released": False,
        "holder": "task-9",
    }
    assert wrong.returncode == 1  # a lock left in place is a failure, not "was not held"
    assert "held by task-9, not someone-else; not released" in wrong.stderr
    assert redis_client.exists("lock:{job:1}")
    plain = cli(redis_server, "release", "lock:{job:1}", "--holder", "someone-else")
    assert plain.returncode == 1 and "was not held" not in plain.stdout

    done = cli(redis_server, "release", "lock:{job:1}", "--json")
    assert json.loads(done.stdout) == {"key": "lock:{job:1}", "released": True, "holder": None}
    absent = cli(redis_server, "release", "lock:{job:1}")
    assert absent.returncode == 0 and "was not held" in absent.stdout
    assert not redis_client.exists("lock:{job:1}")
    assert redis_client.exists("lock:{job:2}")  # only the named lock
    assert lock.lost.wait(15)  # the holder's heartbeat notices on its next renewal (ttl/3)
    other.release()


def test_purge_frees_the_matching_locks(redis_server: RedisServer, redis_client: Any) -> None:
    locks = [ReentrantLock(redis_client, f"sync:{i}", ttl=30, renew=False) for i in range(5)]
    keep = ReentrantLock(redis_client, "report:1", ttl=30, renew=False)
    for lock in [*locks, keep]:
        assert lock.acquire(blocking=False)
    done = cli(redis_server, "purge", "--match", "sync:*", "--yes", "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"released": 5}
    assert [v["key"] for v in listed(redis_server)] == ["lock:{report:1}"]
    keep.release()


def test_purge_queued_frees_only_locks_no_run_entered(
    redis_server: RedisServer, redis_client: Any
) -> None:
    """After `celery purge`: the locks of queued messages go (a publish-time hold, labelled
    "queued"), a running task's stays, and so does a hold in no state (a plain lock's).
    tests/test_celery_seams.py does the same with real jobs, a cooldown, a retry and a beat."""
    space = LockSpace(redis_client)
    assert space.named("proj.job:queued").take("task-1", 30, state="queued").acquired
    assert space.named("proj.job:plain").take("someone", 30).acquired
    running = ReentrantLock(
        redis_client, "proj.job:running", ttl=30, owner="task-2", run_token="run-1", renew=False
    )
    assert running.acquire(blocking=False)
    done = cli(redis_server, "purge", "--queued", "--yes", "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"released": 1}
    assert [v["key"] for v in listed(redis_server)] == [
        "lock:{proj.job:plain}",
        "lock:{proj.job:running}",
    ]
    running.release()


def test_purge_asks_before_it_acts(redis_server: RedisServer, redis_client: Any) -> None:
    lock = ReentrantLock(redis_client, "asked", ttl=30, renew=False)
    assert lock.acquire(blocking=False)
    refused = subprocess.run(
        [sys.executable, "-m", "celery_singleton_lock", "--url", redis_server.url, "purge"],
        input="n\n",
        capture_output=True,
        text=True,
        timeout=START_TIMEOUT,
    )
    assert refused.returncode != 0
    assert "no message is touched" in refused.stdout
    assert redis_client.exists("lock:{asked}")
    lock.release()


def test_a_down_server_is_a_clear_error(make_redis_server: Any) -> None:
    server = make_redis_server()
    server.stop()
    done = cli(server, "list")
    assert done.returncode != 0
    assert "Redis failed" in done.stderr and "Traceback" not in done.stderr


def test_under_an_app_every_prefix_of_its_locked_tasks_is_covered(
    redis_server: RedisServer, redis_client: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """A celery-singleton drop-in keeps its keys under ``SINGLETONLOCK_`` beside the app's
    ``lock``: `celery locks list` and `purge` cover both, ``show`` and ``release`` find a key
    or a name under either; ``--prefix`` picks one."""
    app = new_app("cli_prefixes", broker=redis_server.url)

    def job(x: int) -> None: ...

    plain = app.task(base=LockedTask, name="cli.plain", shared=False, lock_at="publish")(job)
    single = app.task(base=Singleton, name="cli.single", shared=False)(job)
    app.finalize()

    def run(*args: str) -> Any:
        locks_command().main(
            args=[*args, "--json"], obj=SimpleNamespace(app=app), standalone_mode=False
        )
        return json.loads(capsys.readouterr().out)

    try:
        plain.delay(1)
        single.delay(1)
        plain_key, single_key = plain.lock_key_for(1), single.lock_key_for(1)
        assert single_key.startswith("SINGLETONLOCK_:{cli.single:")
        assert [v["key"] for v in run("list")] == [plain_key, single_key]  # the app's first
        assert [v["key"] for v in run("list", "--prefix", "lock")] == [plain_key]
        name = single.generate_lock(single.name, [1])
        assert run("show", name)["key"] == single_key  # a name: found under the prefix holding it
        assert run("release", single_key)["released"] is True
        assert not single.is_locked(1) and plain.is_locked(1)
        single.delay(1)
        assert run("purge", "--yes") == {"released": 2}
        assert run("list") == []
    finally:
        close_app(app)
