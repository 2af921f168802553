"""What docs/production.md tells operators, checked against a real redis-server.

* The ACL rule it prints for the server's version is applied as it is, and a user with only
  that rule runs every lock operation the package makes (acquire, renewal, a blocked acquire
  woken by the release, a semaphore, park, records, force release, the CLI's list and purge)
  without one refusal in ``ACL LOG``; so does a real Celery worker and beat whose locks go
  through that user (a run-mode task and a duplicate woken by its release, a publish-mode
  duplicate, a queued copy, slots, a ``lock_rate`` task with a refusal and a partner's pause,
  the recent counts' write, beat's leader, ``celery locks list`` and the locks page); on a
  Cluster, with the page's Cluster line on every
  node, so does a process's first lock (its probe for sharded pub/sub), a wake-up and a
  release redirected to a slot's new node.
* Its rules start at the oldest server the README names.
* The keys and bytes a held lock costs stay within what the page says.
"""

from __future__ import annotations

import io
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import redirect_stdout
from pathlib import Path
from typing import Any
from urllib.request import urlopen

import aclapp
import pytest
import redis
from celery_fixtures import cli_main
from celery_procs import ROOT, WorkerProcess, close_app, redis_base
from cluster_helpers import Migration, redis_cluster
from lock_helpers import START_TIMEOUT, wait_until, wake_subscribers
from redis.cluster import RedisCluster
from web_helpers import served

from celery_singleton_lock import LockBackendError, LockSpace, ReentrantLock, Semaphore
from celery_singleton_lock.lock import LockState
from celery_singleton_lock.testing import RedisServer
from celery_singleton_lock.web import make_app

PAGE = Path(__file__).resolve().parent.parent / "docs" / "production.md"


def acl_rules() -> dict[tuple[int, int], list[str]]:
    """The page's ``ACL SETUSER ...`` lines, as arguments, by the first server version (``X.Y``
    of ``redis_version``) each one is for."""
    found = re.findall(
        r"<!-- acl-rule from (\d+)\.(\d+)[^>]*-->\n```text\n(ACL SETUSER [^\n]+)\n```",
        PAGE.read_text(),
    )
    assert found, "docs/production.md has no ACL rule block"
    return {(int(major), int(minor)): shlex.split(line) for major, minor, line in found}


def acl_rule(redis_version: str) -> list[str]:
    """The page's rule for a server whose ``INFO server`` says ``redis_version``."""
    version = tuple(int(part) for part in redis_version.split(".")[:2])
    rules = acl_rules()
    fitting = [since for since in rules if since <= version]
    assert fitting, f"docs/production.md gives no ACL rule for Redis {redis_version}"
    return rules[max(fitting)]


def cluster_acl_rule() -> list[str]:
    """The page's line to run after the rule on every node of a Cluster."""
    found = re.search(
        r"<!-- acl-rule cluster[^>]*-->\n```text\n(ACL SETUSER [^\n]+)\n```", PAGE.read_text()
    )
    assert found, "docs/production.md has no ACL rule block for a Cluster"
    return shlex.split(found.group(1))


def apply_acl_rule(admin: Any, *, cluster: bool = False) -> None:
    """Create the page's ``locks`` user on the server of ``admin`` (the rule for its version,
    and on a Cluster node the Cluster's line), with an empty ``ACL LOG``."""
    rule = acl_rule(str(admin.info("server")["redis_version"]))
    assert admin.execute_command(*rule) in (b"OK", "OK", True)
    if cluster:
        assert admin.execute_command(*cluster_acl_rule()) in (b"OK", "OK", True)
    admin.execute_command("ACL", "LOG", "RESET")


@pytest.fixture
def server() -> Iterator[RedisServer]:
    with RedisServer() as server:
        yield server


@pytest.fixture
def locks_user(server: RedisServer) -> Iterator[Any]:
    apply_acl_rule(server.client())
    client = redis.Redis(port=server.port, username="locks", password="CHANGE-ME", socket_timeout=5)
    yield client
    client.close()


def _refusals(server: RedisServer) -> list[Any]:
    return list(server.client().execute_command("ACL", "LOG"))


def _locks_command(server: RedisServer, *args: str) -> Any:
    """``celery-singleton-lock ARGS --json`` as the ``locks`` user, its output read."""
    url = f"redis://locks:CHANGE-ME@127.0.0.1:{server.port}/0"
    out = io.StringIO()
    with redirect_stdout(out), pytest.raises(SystemExit):
        cli_main([*args, "--url", url, "--json"])
    return json.loads(out.getvalue())


def _held(client: Any) -> list[LockState]:
    """Every held lock under the default prefix, read as ``locks list`` reads them."""
    space = LockSpace(client)
    return [state for state in space.inspect_many(list(space.find())) if state.held]


def test_the_documented_acl_user_runs_every_lock_operation(
    server: RedisServer, locks_user: Any
) -> None:
    with pytest.raises(redis.exceptions.NoPermissionError):
        locks_user.set("not-a-lock", "1")  # the rule is a real restriction
    server.client().execute_command("ACL", "LOG", "RESET")

    lock = ReentrantLock(locks_user, "acl-job", ttl=0.6, owner="holder")
    assert lock.acquire()
    first = lock.fence
    time.sleep(1.0)  # past its whole lease (the scenario): held only if the heartbeat renewed it
    lock.ensure_held()
    assert server.client().hexists(lock.key, "holder")

    waiter = ReentrantLock(locks_user, "acl-job", ttl=5, owner="waiter")
    got: list[bool] = []
    thread = threading.Thread(target=lambda: got.append(waiter.acquire(timeout=10)))
    thread.start()
    wait_until(lambda: wake_subscribers(server.client(), lock.key) == 1, 10, "the waiter")
    lock.release()
    thread.join(10)
    assert got == [True] and (waiter.fence or 0) > (first or 0)
    waiter.release()

    semaphore = Semaphore(locks_user, "acl-sem", 2, ttl=5, owner="a")
    other = Semaphore(locks_user, "acl-sem", 2, ttl=5, owner="b")
    assert semaphore.acquire(blocking=False) and other.acquire(blocking=False)
    assert not Semaphore(locks_user, "acl-sem", 2, ttl=5, owner="c").acquire(blocking=False)
    assert semaphore.holders() == {"a": 1, "b": 1}
    semaphore.release()
    other.release_all()

    space = LockSpace(locks_user)
    assert space.named("acl-queued").take("task-1", 30).acquired
    assert space.named("acl-queued").park("task-1", 30)
    # beat's send record beside its lock, as the leader writes it (lua/record_if_held.lua)
    keys, source = space.keys("acl-queued"), (ROOT / "lua" / "record_if_held.lua").read_text()
    sha = locks_user.script_load(source)
    recorded = locks_user.evalsha(
        sha, 2, keys.lock, keys.records("last_run"), "task-1", "tick", "1", 0, 60_000
    )
    assert int(recorded[0]) == 1
    assert locks_user.hgetall(keys.records("last_run")) == {b"tick": b"1"}
    listed = _locks_command(server, "list")
    assert [row["holder"] for row in listed if row["kind"] == "lock"] == ["task-1"]
    assert space.force_release("acl-queued")
    assert space.named("acl-purged").take("task-2", 30).acquired
    assert _locks_command(server, "purge", "--yes") == {"released": 1}
    # a debounce replace: the release and its note in one step, the note read back
    debounced = space.named("acl-debounced")
    assert debounced.take("call-a", 30, state="queued").acquired
    note = ("replaced", "call-b")
    assert debounced.force_release(holder="call-a", states=("queued",), note=note)
    assert debounced.note("replaced", "call-a") == "call-b"
    # lock_rate's limiter: a start, a turn, a pause, a cancel, its listing and a reset
    limiter = space.rate_limiter("acl-rate", "1/s")
    assert limiter.try_acquire("call-1").admitted
    assert not limiter.try_acquire("call-2").admitted
    assert limiter.pause(0.5) > 0 and limiter.cancel("call-2")
    assert [r.name for r in space.rate_limiters()] == ["acl-rate"]
    assert limiter.reset()
    assert _refusals(server) == []


@pytest.mark.parametrize("taken", ["+evalsha", "+hset"], ids=["a-command", "a-script-s-command"])
def test_a_refused_command_s_error_points_to_the_acl_rule(server: RedisServer, taken: str) -> None:
    """A user whose rule lacks a command (one the client sends, or one a script runs): the
    error says the user lacks a permission and where the rule is, not that Redis is down."""
    admin = server.client()
    rule = [part for part in acl_rule(str(admin.info("server")["redis_version"])) if part != taken]
    assert admin.execute_command(*rule) in (b"OK", "OK", True)
    client = redis.Redis(port=server.port, username="locks", password="CHANGE-ME", socket_timeout=5)
    try:
        with pytest.raises(LockBackendError) as raised:
            ReentrantLock(client, "acl-refused", ttl=5).acquire()
    finally:
        client.close()
    assert "The Redis user of the locks lacks a permission" in str(raised.value)
    assert "docs/production.md" in str(raised.value)
    assert "reachable" not in str(raised.value)


@pytest.mark.cluster
@pytest.mark.timeout(120)
def test_the_documented_acl_user_runs_the_locks_on_a_cluster_without_a_refusal() -> None:
    """The page's rule for the server's version and its Cluster line on every node; then a
    process's first locks (the probe for sharded pub/sub that their first release makes), a
    waiter woken by the release's push, and a release that follows its slot to another node
    (ASK): no node has a refusal in ``ACL LOG``."""
    with redis_cluster(2) as nodes:
        for node in nodes:
            apply_acl_rule(node.client(), cluster=True)
        admin = RedisCluster(host="127.0.0.1", port=nodes[0].port, socket_timeout=5)
        client = RedisCluster(
            host="127.0.0.1",
            port=nodes[0].port,
            username="locks",
            password="CHANGE-ME",
            socket_timeout=5,
        )
        try:
            # a holder with a long lease: the waiter gets the lock within its 10 s only if
            # the release's push wakes it (the process's probe for sharded pub/sub, made by its
            # first release or wait, is allowed by the rule: no refusal below)
            holder = ReentrantLock(client, "acl-cluster", ttl=30, owner="holder")
            assert holder.acquire()
            waiter = ReentrantLock(client, "acl-cluster", ttl=30, owner="waiter")
            got: list[bool] = []
            thread = threading.Thread(target=lambda: got.append(waiter.acquire(timeout=10)))
            thread.start()
            wait_until(lambda: wake_subscribers(admin, holder.key) == 1, 10, "the waiter")
            holder.release()
            thread.join(15)
            assert got == [True]
            waiter.release()

            # a lock whose slot moves to the other node while held: its release is redirected
            # there (ASK, and redis-py's ASKING)
            moved = next(
                lock
                for lock in (ReentrantLock(client, f"acl-moved-{i}", ttl=30) for i in range(99))
                if admin.keyslot(lock.key) <= 8191  # type: ignore[no-untyped-call]  # redis-py: unannotated
            )
            assert moved.acquire()
            slot = admin.keyslot(moved.key)  # type: ignore[no-untyped-call]  # redis-py: unannotated
            migration = Migration(nodes[0], nodes[1], slot)
            migration.begin()
            migration.move(moved.key, moved.key + ":meta")
            moved.release()
            migration.end()
            assert not moved.locked()

            assert {node.port: _refusals(node) for node in nodes} == {n.port: [] for n in nodes}
        finally:
            client.close()
            admin.close()


def test_the_page_has_an_acl_rule_from_the_oldest_server_the_readme_names() -> None:
    readme = (PAGE.parent.parent / "README.md").read_text()
    claimed = re.search(r"Requires Python.*?\bRedis (\d+)\.(\d+)\+", readme, re.DOTALL)
    assert claimed, "README.md names no oldest Redis in its requirements"
    assert min(acl_rules()) == (int(claimed.group(1)), int(claimed.group(2)))


def test_what_a_held_lock_costs(server: RedisServer) -> None:
    client = server.client()
    task_id = "3f1c2a9e-8d41-4c59-9a71-2b7e3d3f0c11"
    # the operator info a task's hold carries (docs/upgrading.md), as compact JSON
    info = json.dumps(
        {
            "task": "proj.tasks.report",
            "id": task_id,
            "host": socket.gethostname(),
            "pid": os.getpid(),
        },
        separators=(",", ":"),
    )
    name = "proj.tasks.report:5d41402abc4b2a76b9719d911017c592"
    lock = ReentrantLock(client, name, ttl=30, owner=task_id, info=info)
    assert lock.acquire()
    meta = lock.key + ":meta"
    assert sorted(k.decode() for k in client.keys("*")) == [lock.key, meta]
    # the page: about 150 + 650 bytes
    assert client.memory_usage(lock.key) <= 250
    assert client.memory_usage(meta) <= 900
    lock.release()
    assert client.keys("*") == [meta.encode()]
    assert client.memory_usage(meta) <= 900  # the page: about 700, for one to two minutes
    # the lease it was taken with, plus one and a half retentions (see lua/acquire.lua's x)
    assert 0 < client.pttl(meta) <= 30_000 + 90_000


class AclWorker(WorkerProcess):
    """A ``celery worker`` of tests/aclapp.py (threads: a held run, its waiting duplicate and
    the rest at once)."""

    def command(self) -> list[str]:
        return [
            sys.executable, "-m", "celery", "-A", "tests.aclapp", "worker",
            "-P", "threads", "-c", "6", "-n", self.hostname, "-Q", "acl",
            "--without-mingle", "--without-gossip", "--without-heartbeat", "-l", "info",
        ]  # fmt: skip


def _celery(base: str, *args: str, **popen: Any) -> Any:
    env = {**os.environ, aclapp.URL_ENV: base, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}
    command = [sys.executable, "-m", "celery", "-A", "tests.aclapp", *args]
    if popen:
        return subprocess.Popen(command, cwd=ROOT, env=env, **popen)
    return subprocess.run(
        command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=START_TIMEOUT
    )


@pytest.mark.slow  # a `celery worker` and a `celery beat` process (CI runs it on Redis 6.2 too)
@pytest.mark.timeout(2 * START_TIMEOUT + 240)
def test_a_celery_worker_and_beat_run_under_the_documented_acl_user(
    server: RedisServer, tmp_path: Path
) -> None:
    """A worker, beat, a publisher, ``celery locks list`` and the page, their locks through the
    ``locks`` user of the page's rule for this server (Celery's broker and results through the
    default user): every feature's commands, and not one refusal in ``ACL LOG``."""
    admin = server.client()
    apply_acl_rule(admin)
    locks = server.client(db=aclapp.LOCK_DB)
    data = server.client(db=aclapp.DATA_DB)
    base = redis_base(server.port)
    app = aclapp.make_app(base)
    tasks = app.tasks
    worker = AclWorker(base, tmp_path, env={aclapp.URL_ENV: base})
    beat: subprocess.Popen[bytes] | None = None
    try:
        worker.start()

        def held_by(task_id: str) -> Any:
            """The job's lock while ``task_id`` runs (not its queued lock, same holder)."""
            found = [s for s in _held(locks) if s.holder == task_id and s.state == "running"]
            return found[0] if found else None

        # run mode: a held run, a duplicate that waits for it and is woken by its release
        first = tasks["acl.run"].delay("r", hold=True)
        view = wait_until(lambda: held_by(first.id), 30, "the run's lock")
        second = tasks["acl.run"].delay("r")
        wait_until(
            lambda: wake_subscribers(locks, view.keys.lock) == 1, 30, "the waiting duplicate"
        )

        # publish mode: the duplicate returns the first job
        published = tasks["acl.published"].delay("p")
        assert tasks["acl.published"].delay("p").id == published.id, "publish-mode duplicate"

        # queue mode: a held run, a queued copy, and a duplicate of the copy
        running = tasks["acl.queued"].delay("q", hold=True)
        wait_until(lambda: held_by(running.id), 30, "the queued task's run")
        # A run lets its queued lock go just after it takes the job's lock: a publish between
        # the two is handed the run itself.
        wait_until(
            lambda: (
                not [s for s in _held(locks) if s.holder == running.id and s.state != "running"]
            ),
            30,
            "the run's queued lock freed",
        )
        copy = tasks["acl.queued"].delay("q")
        assert tasks["acl.queued"].delay("q").id == copy.id, "the queued copy's duplicate"

        # the CLI and the page, while those locks are held
        listed = _celery(base, "locks", "list")
        assert listed.returncode == 0, listed.stderr
        assert "acl.run" in listed.stdout and "acl.published" in listed.stdout
        with served(make_app(app)) as page:
            answer = urlopen(page, timeout=30)
            assert answer.status == 200
            assert "acl.run" in answer.read().decode()

        data.set("go:r", 1)
        data.set("go:p", 1)
        data.set("go:q", 1)
        assert first.get(timeout=30) == second.get(timeout=30) == "ran r"
        assert published.get(timeout=30) == "published p"
        assert running.get(timeout=30) == copy.get(timeout=30) == "queued q"

        # slots, a rate limit with a refusal, a partner's "slow down"
        assert [r.get(timeout=30) for r in [tasks["acl.slots"].delay("s", n) for n in (1, 2)]]
        assert tasks["acl.rated"].delay("x").get(timeout=30) == "rated x"
        refused = tasks["acl.rated"].delay("x", n=1)
        wait_until(lambda: refused.state == "SKIPPED", 30, "the rate's refusal")
        assert refused.info["reason"] == "rate"
        assert tasks["acl.told"].delay("t").get(timeout=30) == "told t"

        # the recent counts, written by the worker's counter (a duplicate, a refusal)
        wait_until(lambda: list(locks.scan_iter("lock:counts:*")), 30, "the counts' write")

        # beat's leader: ticks sent, then a clean stop that gives the lead up
        beat = _celery(
            base, "beat", "-S", "celery_singleton_lock.beat:LeaderScheduler",
            "-s", str(tmp_path / "schedule"), "-l", "info",
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        wait_until(lambda: int(data.get("ticks") or 0) >= 2, START_TIMEOUT, "beat's ticks")
        beat.send_signal(signal.SIGTERM)
        beat.wait(30)
    finally:
        if beat is not None and beat.poll() is None:
            beat.kill()
            beat.wait(10)
        worker.stop()
        close_app(app)
        print(worker.log()[-6000:])  # shown when the test fails
    refusals = _refusals(server)
    assert refusals == [], refusals
    assert "NoPermission" not in worker.log() and "no permissions" not in worker.log()
