"""The celery-singleton drop-in, against a real worker and a real Redis.

Written from celery-singleton's documented behaviour, with only the import changed: a
duplicate ``.delay()`` returns the first task's result (or raises ``DuplicateTaskError``), a
new id once the first has ended, ``unique_on`` picks the key, ``clear_locks`` deletes every key
under the prefix (``SINGLETONLOCK_`` by default), the ``singleton_*`` settings apply with the
task's own option first, and a ``singleton_json_encoder_class`` that writes a UUID as its
string makes ``f(uuid)`` and ``f(str(uuid))`` one job. Then the cases where we behave better on
purpose: a retry keeps its lock and runs, a ``send_task`` duplicate is skipped at run time, and
a killed worker's lock ends within one running lease.
"""

from __future__ import annotations

import hashlib
import json
import pickle
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import current_app
from celery_fixtures import (
    CeleryEnv,
    Gates,
    app_task,
    bare_app,
    new_app,
)
from celery_procs import close_app, hanging_job
from lock_helpers import wait_until

from celery_singleton_lock import AlreadyQueuedError, LockSpace, MisconfiguredError
from celery_singleton_lock.compat.singleton import (
    CelerySingletonException,
    DuplicateTaskError,
    Singleton,
    backends,
    clear_locks,
    config,
    util,
)
from celery_singleton_lock.testing import RedisServer

gates = Gates()
app = new_app("csl_compat_singleton")


def _key() -> str:
    return uuid.uuid4().hex


@app_task(app, base=Singleton, shared=False, name="single.held")
def held(key: str, n: int = 0) -> str:
    gates.enter(key)
    return key


@app_task(app, base=Singleton, shared=False, name="single.raising", raise_on_duplicate=True)
def raising(key: str) -> str:
    gates.enter(key)
    return key


@app_task(app, base=Singleton, shared=False, name="single.quiet", raise_on_duplicate=False)
def quiet(key: str) -> str:
    gates.enter(key)
    return key


@app_task(app, base=Singleton, shared=False, name="single.failing")
def failing(key: str) -> None:
    gates.mark(key)
    raise ValueError("fails on purpose")


@app_task(app, base=Singleton, shared=False, name="single.on_first", unique_on="key")
def on_first(key: str, note: str) -> str:
    gates.enter(key)
    return note


@app_task(app, base=Singleton, shared=False, name="single.name_only", unique_on=[])
def name_only(key: str) -> str:
    gates.enter(key)
    return key


@app_task(app, base=Singleton, shared=False, name="single.by_ref")
def by_ref(ref: Any, key: str) -> str:
    gates.enter(key)
    return str(ref)


@app_task(app, base=Singleton, shared=False, bind=True, name="single.retrying")
def retrying(self: Any, key: str) -> int:
    gates.mark(key, self.request.retries)
    if self.request.retries < 1:
        raise self.retry(countdown=1.5)
    return int(self.request.retries)


@app_task(app, shared=False, name="single.publisher")
def publisher(key: str) -> None:
    """Publishes a duplicate with raise_on_duplicate from inside a task: the error goes
    through the result backend."""
    raising.delay(key)


#: the in-process worker and the settings of the conftest ``env`` fixture
CELERY_ENV = {"concurrency": 6}


def test_a_duplicate_returns_the_first_result_and_a_new_id_follows_its_end(
    env: CeleryEnv,
) -> None:
    key = _key()
    first = held.delay(key)
    gates.wait_started(key)
    second = held.delay(key)
    assert second.id == first.id
    assert held.apply_async(args=(key,)).id == first.id
    assert held.delay(key, 1).id != first.id  # other arguments: another job
    gates.open(key)
    assert first.get(timeout=10) == key
    third = held.delay(key)
    assert third.id != first.id
    gates.open(key)
    assert third.get(timeout=10) == key


def test_a_failed_task_frees_its_lock(env: CeleryEnv) -> None:
    key = _key()
    first = failing.delay(key)
    with pytest.raises(ValueError, match="fails on purpose"):
        first.get(timeout=10)
    assert failing.delay(key).id != first.id


def test_raise_on_duplicate_raises_with_the_first_task_id(env: CeleryEnv) -> None:
    key = _key()
    first = raising.delay(key)
    gates.wait_started(key)
    with pytest.raises(DuplicateTaskError) as caught:
        raising.delay(key)
    error = caught.value
    assert error.task_id == first.id
    assert isinstance(error, AlreadyQueuedError) and isinstance(error, CelerySingletonException)
    assert str(error) == f"Attempted to queue a duplicate of task ID {first.id}"
    assert error.ttl > 0 and error.key.endswith("}")
    copy = pickle.loads(pickle.dumps(error))
    assert (type(copy), copy.task_id, str(copy)) == (DuplicateTaskError, first.id, str(error))
    gates.open(key)
    first.get(timeout=10)


def test_a_duplicate_error_raised_in_a_task_survives_the_result_backend(env: CeleryEnv) -> None:
    key = _key()
    first = raising.delay(key)
    gates.wait_started(key)
    result = publisher.delay(key)
    with pytest.raises(DuplicateTaskError) as caught:
        result.get(timeout=10)
    assert caught.value.task_id == first.id
    gates.open(key)
    first.get(timeout=10)


def test_the_app_setting_applies_and_the_task_option_wins(env: CeleryEnv) -> None:
    key = _key()
    env.app.conf.singleton_raise_on_duplicate = True
    try:
        first = held.delay(key)
        gates.wait_started(key)
        with pytest.raises(DuplicateTaskError):
            held.delay(key)
        quiet_first = quiet.delay(key)
        gates.wait_started(key)
        assert quiet.delay(key).id == quiet_first.id  # raise_on_duplicate=False on the task
    finally:
        env.app.conf.singleton_raise_on_duplicate = None
        gates.open(key)
    first.get(timeout=10)
    quiet_first.get(timeout=10)


def test_unique_on_picks_the_key(env: CeleryEnv) -> None:
    key = _key()
    first = on_first.delay(key, "a")
    gates.wait_started(key)
    assert on_first.delay(key, "b").id == first.id  # note is not part of the key
    assert on_first.delay(key=key, note="c").id == first.id
    name_key = _key()
    name_first = name_only.delay(name_key)
    assert name_only.delay(_key()).id == name_first.id  # [] : the task name alone
    gates.open(key)
    gates.open(name_key)
    assert first.get(timeout=10) == "a"
    assert name_first.get(timeout=10) == name_key


def test_lock_names_holders_and_clear_locks(env: CeleryEnv) -> None:
    key = _key()
    first = held.delay(key)
    gates.wait_started(key)
    lock = held.generate_lock(held.name, [key])
    assert lock == held.generate_lock(held.name, task_kwargs={"key": key})
    previous = current_app._get_current_object()  # noqa: SLF001  # the app behind Celery's proxy: no public way
    env.app.set_current()
    try:
        assert util.generate_lock(held.name, [key]) == lock  # the current app's task's name
    finally:
        previous.set_current()
    assert held.get_existing_task_id(lock) == first.id
    backend = backends.get_backend(config.Config(env.app))
    assert backend.get(lock) == first.id
    held.release_lock(task_args=[key])  # celery-singleton's signature
    assert held.get_existing_task_id(lock) is None
    second = held.delay(key)
    assert second.id != first.id
    other = _key()
    third = held.delay(other)
    gates.wait_started(other)
    assert held.get_existing_task_id(held.generate_lock(held.name, [other])) == third.id
    clear_locks(env.app)
    assert held.get_existing_task_id(held.generate_lock(held.name, [other])) is None
    assert held.get_existing_task_id(lock) is None
    gates.open(key)
    gates.open(other)
    for result in (first, second, third):
        result.get(timeout=10)


class RefEncoder(json.JSONEncoder):
    """Writes a UUID as its string: the use celery-singleton documents for its
    ``singleton_json_encoder_class``."""

    def default(self, o: Any) -> Any:
        if isinstance(o, uuid.UUID):
            return str(o)
        return super().default(o)


def test_a_name_the_app_does_not_register_gets_celery_singleton_s_name(env: CeleryEnv) -> None:
    """celery-singleton hashes whatever task name it is given, and code written for it names
    locks that way (its own suite does: ``generate_lock("simple_task", ...)`` beside a task
    registered under its module's name). Such a name is celery-singleton's md5 of the name and
    the arguments, with the calling task's ``unique_on``; a registered name is its lock's."""
    key = _key()
    digest = hashlib.md5(f'simple_task["{key}", 1]{{}}'.encode(), usedforsecurity=False)
    lock = held.generate_lock("simple_task", task_args=[key, 1])
    assert lock == digest.hexdigest()
    assert util.generate_lock("simple_task", [key, 1], app=env.app) == lock
    # Registered, but not a locked task: celery-singleton's name too.
    assert (
        util.generate_lock(publisher.name, [key], app=env.app)
        == hashlib.md5(f'{publisher.name}["{key}"]{{}}'.encode(), usedforsecurity=False).hexdigest()
    )
    # The calling task's unique_on applies, as celery-singleton's method applies it.
    by_key = hashlib.md5(f'other[]{{"key": "{key}"}}'.encode(), usedforsecurity=False)
    assert on_first.generate_lock("other", [key, "a"]) == by_key.hexdigest()
    assert on_first.generate_lock("other", [key], {"note": "b"}) == by_key.hexdigest()
    # The name works with every method that takes one, in Redis.
    assert held.aquire_lock(lock, "test_task_id")
    assert held.get_existing_task_id(lock) == "test_task_id"
    assert not held.aquire_lock(lock, "another_task_id")
    held.unlock(lock)
    assert held.get_existing_task_id(lock) is None
    # A registered locked task's name is its own lock's, whichever task asks.
    assert quiet.generate_lock(held.name, [key]) == held.generate_lock(held.name, [key])
    assert util.generate_lock(held.name, [key], app=env.app) == held.generate_lock(held.name, [key])


@pytest.fixture
def ref_encoder(env: CeleryEnv) -> Iterator[None]:
    env.app.conf.singleton_json_encoder_class = f"{__name__}.RefEncoder"
    try:
        yield
    finally:
        env.app.conf.singleton_json_encoder_class = None


def test_an_encoder_writing_a_uuid_as_its_string_makes_both_one_job(
    env: CeleryEnv, ref_encoder: None
) -> None:
    """celery-singleton keys the arguments as the encoder writes them, so a UUID and its
    string are one job, at publish and (for a message sent by name) at run time."""
    key = _key()
    ref = uuid.uuid4()
    first = by_ref.delay(ref, key)
    gates.wait_started(key)
    assert by_ref.delay(str(ref), key).id == first.id
    assert by_ref.delay(ref=str(ref), key=key).id == first.id
    other = by_ref.delay(uuid.uuid4(), key)  # another UUID: another job
    assert other.id != first.id
    by_name = env.app.send_task("single.by_ref", args=(str(ref), key))
    assert env.wait_state(by_name.id, "SKIPPED") == "SKIPPED"
    assert by_name.info["holder"] == first.id
    gates.open(key)
    assert first.get(timeout=10) == str(ref)
    other.get(timeout=10)
    assert gates.runs[key] == 2
    assert by_ref.delay(str(ref), key).id != first.id  # ended: a new run
    by_ref.delay(str(ref), key).get(timeout=10)


def test_the_encoder_keeps_the_keys_of_plain_arguments(env: CeleryEnv) -> None:
    """Strings, numbers and lists hash as they did without an encoder: turning the setting on
    does not move the locks of jobs queued with such arguments."""
    calls: list[tuple[list[Any], dict[str, Any]]] = [
        (["a"], {}),
        (["a"], {"n": 3}),
        ([["x", 1.5, None, True]], {}),
    ]
    before = [held.generate_lock(held.name, args, kwargs) for args, kwargs in calls]
    env.app.conf.singleton_json_encoder_class = RefEncoder
    try:
        after = [held.generate_lock(held.name, args, kwargs) for args, kwargs in calls]
    finally:
        env.app.conf.singleton_json_encoder_class = None
    assert after == before


def test_clear_locks_leaves_no_key_under_the_prefix(env: CeleryEnv) -> None:
    """Every key of a lock goes (its ``:meta`` hash too, which outlives a released lock), and
    whatever else starts with the prefix, as celery-singleton's clear does; other keys stay."""
    prefix = config.Config(env.app).key_prefix
    assert prefix == "SINGLETONLOCK_"
    done, running = _key(), _key()
    gates.open(done)
    finished = held.delay(done)
    finished.get(timeout=10)  # released: its meta hash stays behind for a while
    first = held.delay(running)
    gates.wait_started(running)
    assert held.aquire_lock("hand-taken", "someone")  # a lock without a message
    locks = env.locks
    locks.set(f"{prefix}0123456789abcdef", "left by celery-singleton")
    locks.set("unrelated", "1")
    under = sorted(k.decode() for k in locks.scan_iter(f"{prefix}*"))
    assert any(k.endswith(":meta") for k in under) and len(under) >= 5, under
    clear_locks(env.app)
    assert list(locks.scan_iter(f"{prefix}*")) == []
    assert locks.get("unrelated") == b"1"
    second = held.delay(running)
    assert second.id != first.id  # its lock is gone: a second run is queued
    gates.open(running)
    first.get(timeout=10)
    second.get(timeout=10)
    locks.delete("unrelated")


# -- where we behave better on purpose -----------------------------------------------------


def test_a_retry_keeps_its_lock_and_runs(env: CeleryEnv) -> None:
    """celery-singleton's retry met its own lock at publish and was never sent."""
    key = _key()
    first = retrying.delay(key)
    wait_until(lambda: gates.data[key] == [0], 10)
    assert retrying.delay(key).id == first.id  # kept through the countdown
    assert first.get(timeout=15) == 1
    assert gates.data[key] == [0, 1]


def test_a_send_task_duplicate_is_skipped_at_run_time(env: CeleryEnv) -> None:
    """celery-singleton did not see a publish by name at all: both ran."""
    key = _key()
    first = held.delay(key)
    gates.wait_started(key)
    by_name = env.app.send_task("single.held", args=(key,))
    assert env.wait_state(by_name.id, "SKIPPED") == "SKIPPED"
    assert by_name.info["holder"] == first.id
    gates.open(key)
    first.get(timeout=10)
    assert gates.runs[key] == 1


# -- settings, without a worker -----------------------------------------------------------


def test_the_singleton_settings_give_the_redis_the_prefix_and_the_lease(
    redis_server: RedisServer,
) -> None:
    bare = bare_app(
        redis_server,
        "csl_compat_bare",
        singleton_backend_url=f"redis://127.0.0.1:{redis_server.port}/7",
        singleton_key_prefix="legacy",
        singleton_lock_expiry=120,
    )

    @app_task(bare, base=Singleton, shared=False, name="bare.job")
    def job(x: int) -> int:
        return x

    @app_task(bare, base=Singleton, shared=False, name="bare.short", lock_expiry=40)
    def short(x: int) -> int:
        return x

    db7 = redis.Redis(port=redis_server.port, db=7, decode_responses=True)
    db7.flushdb()
    try:
        first = job.delay(1)
        assert job.delay(1).id == first.id
        [key] = [k for k in db7.keys("legacy:*") if not str(k).endswith(":meta")]
        assert 110_000 < db7.pttl(key) <= 120_000  # singleton_lock_expiry
        short.delay(1)
        short_key = short.locking.lock_name("bare.short", (1,), {})
        assert 30_000 < db7.pttl(f"legacy:{{{short_key}}}") <= 40_000  # the task's own wins
    finally:
        db7.flushdb()
        close_app(bare)


def test_the_result_backend_then_the_broker_are_the_default_redis(
    redis_server: RedisServer,
) -> None:
    bare = bare_app(redis_server, "csl_compat_bare")

    @app_task(bare, base=Singleton, shared=False, name="bare.job")
    def job(x: int) -> int:
        return x

    results = redis.Redis(port=redis_server.port, db=1, decode_responses=True)
    try:
        job.delay(2)
        # celery-singleton's default key prefix, kept
        assert config.Config(bare).key_prefix == "SINGLETONLOCK_"
        keys = list(results.scan_iter("SINGLETONLOCK_*"))
        assert any(k.startswith("SINGLETONLOCK_:{bare.job") for k in keys), keys
    finally:
        results.flushdb()
        redis.Redis(port=redis_server.port, db=0).flushdb()
        close_app(bare)


class DictBackend(backends.BaseBackend):
    """A backend of celery-singleton's interface, complete: still refused (no lease renewal,
    no owner-checked release, no fencing token can go through lock/unlock/get/clear)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.locks: dict[str, str] = {}

    def lock(self, lock: str, task_id: str, expiry: float | None = None) -> bool:
        return self.locks.setdefault(lock, task_id) == task_id

    def unlock(self, lock: str) -> None:
        self.locks.pop(lock, None)

    def get(self, lock: str) -> str | None:
        return self.locks.get(lock)

    def clear(self, key_prefix: str) -> None:
        self.locks.clear()


@pytest.mark.parametrize(
    "backend_class", ["myproject.backends.Memcached", DictBackend, f"{__name__}.DictBackend"]
)
def test_another_backend_class_is_refused_when_the_task_is_bound(
    redis_server: RedisServer, backend_class: Any
) -> None:
    bare = bare_app(redis_server, "csl_compat_bare", singleton_backend_class=backend_class)

    @app_task(bare, base=Singleton, shared=False, name="bare.job")
    def job(x: int) -> int:
        return x

    with pytest.raises(MisconfiguredError) as caught:
        bare.finalize()
    message = str(caught.value)
    assert "renew a lease" in message  # why
    assert "Remove the setting" in message and "singleton_lock_client" in message  # instead
    with pytest.raises(MisconfiguredError):
        clear_locks(bare)
    close_app(bare)


def test_a_backend_built_from_a_url_clears_any_prefix(redis_server: RedisServer) -> None:
    """celery-singleton's ``RedisBackend(url)`` and ``clear(prefix)``, outside any app."""
    backend = backends.RedisBackend(f"redis://127.0.0.1:{redis_server.port}/11")
    client = redis.Redis(port=redis_server.port, db=11)
    client.flushdb()
    try:
        assert backend.space.prefix == "SINGLETONLOCK_"
        assert backend.lock("job-a", "t1", expiry=30) and not backend.lock("job-a", "t2")
        assert backend.get("job-a") == "t1"
        other = backends.RedisBackend(space=LockSpace(client, "other[1]"))
        assert other.lock("job-b", "t3")
        backend.clear("other[1]")  # a prefix with glob characters: taken literally
        assert other.get("job-b") is None and backend.get("job-a") == "t1"
        assert sorted(client.scan_iter("other*")) == []
        backend.clear("SINGLETONLOCK_")
        assert client.dbsize() == 0
    finally:
        client.flushdb()
        client.close()


@pytest.mark.parametrize(
    ("option", "error", "match"),
    [
        ({"raise_on_duplicate": "yes"}, TypeError, "raise_on_duplicate must be True, False"),
        ({"lock_expiry": -1}, ValueError, "lock_expiry must be > 0"),
        ({"lock_expiry": "1h"}, TypeError, "lock_expiry must be a number of seconds"),
        ({"unique_on": ["nope"]}, ValueError, r"unique_on \(lock_unique_on\) names \['nope'\]"),
    ],
)
def test_bad_option_values_name_the_option(
    option: dict[str, Any], error: type[Exception], match: str
) -> None:
    bare = new_app("csl_compat_bad")

    @app_task(bare, base=Singleton, shared=False, name="bad.job", **option)
    def job(x: int) -> None: ...

    with pytest.raises(error, match=match):
        bare.finalize()
    close_app(bare)


# -- a killed worker ------------------------------------------------------------------------


@pytest.mark.faults
@pytest.mark.slow  # a `celery worker` process, SIGKILLed
def test_a_killed_workers_lock_ends_within_one_running_lease(
    make_redis_server: Any, tmp_path: Path
) -> None:
    """celery-singleton kept it until lock_expiry (by default: forever)."""
    server: RedisServer = make_redis_server()
    with hanging_job(server.port, tmp_path, "fault.singleton_hang") as (task, job, first, worker):
        assert task.delay(job, 60).id == first.id
        worker.kill_group()
        killed = time.monotonic()
        lock = task.generate_lock(task.name, [job, 60])
        wait_until(lambda: task.get_existing_task_id(lock) is None, 10)
        assert time.monotonic() - killed < 2 + 1.5  # the running lease (lock_ttl=2), plus slack
        assert task.delay(job, 60).id != first.id


class Point:
    def __init__(self, x: int, y: int) -> None:
        self.x, self.y = x, y


class PointEncoder(json.JSONEncoder):
    def default(self, o: Any) -> Any:
        if isinstance(o, Point):
            return [o.x, o.y]
        return super().default(o)


def test_the_json_encoder_class_keys_arguments_the_lock_cannot(
    redis_server: RedisServer,
) -> None:
    bare = bare_app(
        redis_server,
        "csl_compat_bare",
        task_serializer="pickle",
        accept_content=["pickle", "json"],
        singleton_lock_redis_url=f"redis://127.0.0.1:{redis_server.port}/9",
    )

    @app_task(bare, base=Singleton, shared=False, name="bare.plot")
    def plot(point: Point) -> None: ...

    try:
        with pytest.raises(TypeError, match="cannot build a lock key"):
            plot.delay(Point(1, 2))
        bare.conf.singleton_json_encoder_class = f"{__name__}.PointEncoder"
        first = plot.delay(Point(1, 2))
        assert plot.delay(Point(1, 2)).id == first.id
        assert plot.delay(Point(2, 1)).id != first.id
    finally:
        redis.Redis(port=redis_server.port, db=9).flushdb()
        redis.Redis(port=redis_server.port, db=0).flushdb()
        close_app(bare)


def test_the_module_paths_celery_singleton_users_write_import() -> None:
    """celery-singleton's modules, with only ``celery_singleton`` changed in the import: its
    ``backends`` (the base class of a custom backend), ``exceptions``, ``config`` and ``util``."""
    from celery_singleton_lock.compat.singleton.backends import (
        BaseBackend,
        RedisBackend,
        get_backend,
    )
    from celery_singleton_lock.compat.singleton.config import Config
    from celery_singleton_lock.compat.singleton.exceptions import DuplicateTaskError as Duplicate
    from celery_singleton_lock.compat.singleton.util import generate_lock

    assert issubclass(RedisBackend, BaseBackend) and get_backend is backends.get_backend
    assert Duplicate is DuplicateTaskError and issubclass(Duplicate, CelerySingletonException)
    assert Config is config.Config and generate_lock is util.generate_lock
