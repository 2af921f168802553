"""Every public parameter's extremes: a clear error naming it, raised before anything is
written to Redis, or (where the input is odd but valid) correct behaviour with a lease on every
key. After each bad call the test's server must hold no key at all."""

from __future__ import annotations

import math
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import redis
from celery_fixtures import app_task, configure, new_app

from celery_singleton_lock import LockedTask, LockSpace, ReentrantLock, install, reload_settings
from celery_singleton_lock.testing import RedisServer

#: the longest lease the lock takes: ten years (docs/lock.md)
MAX_LEASE_SECONDS = 10 * 365 * 24 * 3600
HUGE = MAX_LEASE_SECONDS * 2
NUMBERS_THAT_ARE_NOT_LEASES: list[Any] = [
    0, -1, math.nan, math.inf, -math.inf, HUGE, 1e14, True, "30", None, [30],
]  # fmt: skip


#: the classes as an untyped caller sees them (the calls below break their annotations)
Lock: Any = ReentrantLock
Space: Any = LockSpace


@pytest.fixture
def client(redis_server: RedisServer) -> Any:
    made: Any = redis.Redis(port=redis_server.port, db=7)
    made.flushdb()
    return made


def _written(client: Any) -> list[bytes]:
    """Every key in the test's database (an earlier test's apps wrote their recent counts
    before it ended: conftest's teardown closes them)."""
    return list(client.scan_iter())


def _refused(client: Any, call: Callable[[], Any], parameter: str) -> None:
    with pytest.raises((TypeError, ValueError)) as raised:
        call()
    assert parameter in str(raised.value), f"{raised.value!r} does not name {parameter}"
    assert _written(client) == [], f"{parameter}: something was written"


@pytest.mark.parametrize("ttl", NUMBERS_THAT_ARE_NOT_LEASES)
def test_lock_ttl(client: Any, ttl: Any) -> None:
    _refused(client, lambda: ReentrantLock(client, "t", ttl=ttl).acquire(), "ttl")


@pytest.mark.parametrize("lease", NUMBERS_THAT_ARE_NOT_LEASES)
def test_space_leases(client: Any, lease: Any) -> None:
    space = LockSpace(client)
    _refused(client, lambda: space.named("t").take("owner", lease), "lease")
    _refused(client, lambda: space.named("t").park("owner", lease), "lease")


@pytest.mark.parametrize("timeout", [-1, math.nan, math.inf * -1, "1", True, [1]])
def test_waits(client: Any, timeout: Any) -> None:
    lock = ReentrantLock(client, "t", ttl=5)
    _refused(client, lambda: lock.acquire(timeout=timeout), "timeout")
    _refused(client, lambda: lock.try_acquire(timeout=timeout), "timeout")
    _refused(
        client,
        lambda: ReentrantLock(client, "t", timeout=timeout),
        "timeout",
    )


@pytest.mark.parametrize(
    ("parameter", "make"),
    [
        ("name", lambda c: Lock(c, "")),
        ("name", lambda c: Lock(c, b"bytes")),
        ("name", lambda c: Lock(c, None)),
        ("owner", lambda c: Lock(c, "t", owner="")),
        ("owner", lambda c: Lock(c, "t", owner=1)),
        ("renew", lambda c: Lock(c, "t", renew="yes")),
        ("prefix", lambda c: Lock(c, "t", prefix="")),
        ("prefix", lambda c: Lock(c, "t", prefix="a{b")),
        ("info", lambda c: Lock(c, "t", info=None)),
        ("run_token", lambda c: Lock(c, "t", run_token=1)),
        ("blocking", lambda c: Lock(c, "t").acquire(blocking="no")),
        ("client", lambda c: Lock("redis://localhost", "t")),
        ("client", lambda c: Space(None)),
        ("prefix", lambda c: Space(c, prefix="}")),
    ],
)
def test_lock_parameters(client: Any, parameter: str, make: Callable[[Any], Any]) -> None:
    _refused(client, lambda: make(client), parameter)


@pytest.mark.parametrize(
    "name", ["\x00", "new\nline", "with space", "ünïcødé ✓", "{", "}", "%", "x" * 100_000]
)
def test_odd_names_lock_with_a_lease(client: Any, name: str) -> None:
    lock = ReentrantLock(client, name, ttl=5, info="i" * 1_000_000)
    assert lock.acquire(blocking=False)
    assert all(client.pttl(key) > 0 for key in client.scan_iter())
    assert LockSpace(client).inspect(lock.key).holder == lock.owner
    lock.release()
    assert client.exists(lock.key) == 0


# -- the Celery layer ---------------------------------------------------------------------------


@pytest.fixture
def app(redis_server: RedisServer) -> Any:
    made = new_app("bad_input")
    configure(
        made, redis_server, singleton_lock_redis_url=f"redis://127.0.0.1:{redis_server.port}/7"
    )
    yield made
    made.close()


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("lock_ttl", 0),
        ("lock_ttl", math.nan),
        ("lock_ttl", HUGE),
        ("lock_ttl", "30"),
        ("lock_queue_ttl", -5),
        ("lock_queue_ttl", math.inf),
        ("lock_wait_timeout", -1),
        ("lock_retry_countdown", True),
        ("lock_at", "later"),
        ("lock_on_duplicate", "ignore"),
        ("lock_on_locked", "explode"),
        ("lock_release_on_start", "yes"),
        ("lock_unique_on", 5),
        ("lock_key", "not callable"),
        ("lock_rate", "10 per second"),
        ("lock_rate", "0/s"),
        ("lock_rate", "5/0s"),
        ("lock_rate", "5/fortnight"),
        ("lock_rate", 10),
        ("lock_rate_key", ""),
        ("lock_rate_key", 5),
        ("lock_rate_max_delay", -1),
        ("lock_limit", 0),
    ],
)
def test_task_options(app: Any, client: Any, option: str, value: Any) -> None:
    def define() -> None:
        @app_task(app, base=LockedTask, name=f"bad.{option}", shared=False, **{option: value})
        def task() -> None:
            return None

        assert f"bad.{option}" in app.tasks  # made (and checked) when the app finalizes

    _refused(client, define, option)


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("singleton_lock_ttl", "30s"),
        ("singleton_lock_ttl", HUGE),
        ("singleton_lock_queue_ttl", 0),
        ("singleton_lock_queue_ttl", math.nan),
        ("singleton_lock_prefix", "a}b"),
        ("singleton_lock_on_backend_error", "ignore"),
        ("singleton_lock_tasks", ["x"]),
    ],
)
def test_settings(app: Any, client: Any, name: str, value: Any) -> None:
    app.conf[name] = value

    def read_and_check() -> None:
        reload_settings(app)

        # the first publish of a locked task reads and checks the settings
        @app_task(app, base=LockedTask, name="bad.settings", lock_at="publish", shared=False)
        def task() -> None:
            return None

        task.delay()

    _refused(client, read_and_check, name)


def test_a_setting_is_checked_before_a_publish_writes(app: Any, client: Any) -> None:
    app.conf.singleton_lock_queue_ttl = -1

    @app_task(app, base=LockedTask, name="bad.setting", lock_at="publish", shared=False)
    def task() -> None:
        return None

    _refused(client, task.delay, "singleton_lock_queue_ttl")
    app.conf.singleton_lock_tasks = {"bad.other": {"lock_at": "sometimes"}}
    reload_settings(app)  # the publish above read the settings
    _refused(client, lambda: install(app), "lock_at")


def test_a_publish_that_celery_refuses_leaves_no_lock(app: Any, client: Any) -> None:
    @app_task(app, base=LockedTask, name="bad.refused", lock_at="publish", shared=False)
    def task() -> None:
        return None

    with pytest.raises(OverflowError):
        task.apply_async(countdown=1e12)  # Celery cannot make a date of it
    assert not list(LockSpace(client).find())


@pytest.mark.parametrize(
    ("option", "value"),
    [("countdown", math.nan), ("countdown", "soon")],
)
def test_publish_options(app: Any, client: Any, option: str, value: Any) -> None:
    @app_task(app, base=LockedTask, name="bad.publish", lock_at="publish", shared=False)
    def task() -> None:
        return None

    with pytest.raises((TypeError, ValueError)):
        task.apply_async(**{option: value})
    assert _written(client) == []


@pytest.mark.parametrize(
    "options",
    [
        {"countdown": 20 * 365 * 86400},
        {"eta": datetime.now(UTC) + timedelta(days=365 * 50)},
        {"expires": datetime.now(UTC) + timedelta(days=365 * 50)},
        {"countdown": -10},
        {"eta": datetime.now() - timedelta(days=1)},  # naive, on purpose
    ],
)
def test_far_or_past_delays_take_a_bounded_lease(app: Any, client: Any, options: Any) -> None:
    @app_task(app, base=LockedTask, name="bad.far", lock_at="publish", shared=False)
    def task() -> None:
        return None

    task.apply_async(**options)
    keys = list(LockSpace(client).find())
    assert len(keys) == 1
    assert 0 < client.pttl(keys[0].lock) <= MAX_LEASE_SECONDS * 1000


def test_a_megabyte_of_arguments_makes_a_bounded_key(app: Any, client: Any) -> None:
    @app_task(app, base=LockedTask, name="bad.big", lock_at="publish", shared=False)
    def task(blob: str) -> None:
        return None

    first = task.delay("x" * 1_000_000)
    assert task.delay("x" * 1_000_000).id == first.id
    [keys] = list(LockSpace(client).find())
    assert len(keys.lock) < 300


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"lock_rate_key": "partner"}, "lock_rate_key"),
        ({"lock_rate_max_delay": 5}, "lock_rate_max_delay"),
        ({"lock_limit": None}, "lock_limit=None"),
        ({"lock_limit": None, "lock_rate": "5/s", "lock_at": "publish"}, "lock_limit=None"),
        ({"lock_limit": None, "lock_rate": "5/s", "lock_cooldown": 5}, "lock_limit=None"),
        (
            {"lock_rate": "5/s", "lock_at": "publish", "lock_release_on_start": True},
            "lock_release_on_start",
        ),
    ],
)
def test_rate_options_that_make_no_sense_together(
    app: Any, client: Any, options: dict[str, Any], named: str
) -> None:
    def define() -> None:
        @app_task(app, base=LockedTask, name=f"bad.rate.{named}", shared=False, **options)
        def task() -> None:
            return None

        assert f"bad.rate.{named}" in app.tasks

    _refused(client, define, named)


@pytest.mark.parametrize(
    ("options", "named", "instead"),
    [
        ({"lock_key": str, "lock_unique_on": ["n"]}, "lock_key and lock_unique_on", "not both"),
        ({"lock_on_duplicate": "raise"}, "lock_on_duplicate", "use lock_at='publish'"),
        (
            {"lock_at": "publish", "lock_release_on_start": True, "lock_on_locked": "raise"},
            "lock_on_locked='raise' never applies",
            "drop one of them",
        ),
        ({"lock_wait_timeout": 5}, "lock_wait_timeout", "set lock_on_locked='wait'"),
        (
            {"lock_on_locked": "wait", "lock_retry_countdown": 5},
            "lock_retry_countdown",
            "set lock_on_locked='retry'",
        ),
        (
            {"lock_at": "publish", "lock_release_on_start": True, "lock_ttl": 60},
            "lock_ttl",
            "drop lock_ttl",
        ),
        ({"lock_rate": "5/s", "lock_ttl": 60}, "lock_ttl", "set lock_limit=1"),
        ({"lock_rate": "5/s", "lock_queue_ttl": 60}, "lock_queue_ttl", "set lock_limit=1"),
    ],
)
def test_an_option_the_others_leave_nothing_to_act_on_is_refused(
    app: Any, client: Any, options: dict[str, Any], named: str, instead: str
) -> None:
    """An option that can never take effect beside the others is refused when the class is
    made, naming it and what to do instead, rather than ignored in silence."""

    def define() -> None:
        @app_task(app, base=LockedTask, name="bad.unused", shared=False, **options)
        def task(n: int) -> None:
            return None

        assert "bad.unused" in app.tasks

    with pytest.raises(ValueError) as raised:
        define()
    assert named in str(raised.value) and instead in str(raised.value), str(raised.value)
    assert _written(client) == []


@pytest.mark.parametrize("lock_at", ["publish", "queue"])
def test_debounce_with_wait_is_refused_with_what_to_use_instead(
    app: Any, client: Any, lock_at: str
) -> None:
    """lock_debounce with lock_on_locked="wait": a replaced call's run would block on the lock
    its replacement holds and run after it; refused when the class is made, naming the mode to
    use instead."""

    def define() -> None:
        @app_task(
            app, base=LockedTask, name=f"bad.debounce.wait.{lock_at}", shared=False,
            lock_at=lock_at, lock_debounce=1.0, lock_on_locked="wait",
        )  # fmt: skip
        def task() -> None:
            return None

        assert f"bad.debounce.wait.{lock_at}" in app.tasks

    with pytest.raises(ValueError, match="lock_debounce with lock_on_locked='wait'") as raised:
        define()
    message = str(raised.value)
    assert "use lock_at='queue' with the default lock_on_locked='skip'" in message
    assert f"bad.debounce.wait.{lock_at}" in message
    assert _written(client) == []


def test_a_rate_callables_bad_answer_fails_the_run_before_redis(app: Any, client: Any) -> None:
    @app_task(app, base=LockedTask, name="bad.rate.answer", shared=False, lock_rate=lambda n: n)
    def rated(n: Any) -> None:
        return None

    @app_task(
        app, base=LockedTask, name="bad.rate.key", shared=False, lock_rate="5/s",
        lock_rate_key=lambda n: n,
    )  # fmt: skip
    def keyed(n: Any) -> None:
        return None

    @app_task(
        app, base=LockedTask, name="bad.rate.locked_key", shared=False, lock_rate="5/s",
        lock_limit=1, lock_rate_key=lambda n: n,
    )  # fmt: skip
    def locked_keyed(n: Any) -> None:
        return None

    _refused(client, lambda: rated.apply(("ten a second",), throw=True), "lock_rate(...)")
    _refused(client, lambda: keyed.apply((7,), throw=True), "lock_rate_key(...)")
    # with a lock too: the limiter is made before the lock is taken, so no lock is left held
    _refused(client, lambda: locked_keyed.apply((7,), throw=True), "lock_rate_key(...)")


@pytest.mark.parametrize("lock_at", ["publish", "queue"])
def test_a_rate_callables_bad_answer_fails_the_publish_before_redis(
    app: Any, client: Any, lock_at: str
) -> None:
    """lock_rate (or lock_rate_key) as a callable with a publish-time lock: its answer is
    checked before the publish takes the job's lock, so a bad one fails the call with an error
    naming it and leaves no key at all (no lock, no meta record); an eager call too."""

    @app_task(
        app, base=LockedTask, name=f"bad.rate.publish.{lock_at}", shared=False, lock_at=lock_at,
        lock_rate=lambda n: n,
    )  # fmt: skip
    def rated(n: Any) -> None:
        return None

    @app_task(
        app, base=LockedTask, name=f"bad.rate.publish_key.{lock_at}", shared=False,
        lock_at=lock_at, lock_rate="5/s", lock_rate_key=lambda n: n,
    )  # fmt: skip
    def keyed(n: Any) -> None:
        return None

    _refused(client, lambda: rated.delay("ten a second"), "lock_rate(...)")
    _refused(client, lambda: rated.apply(("ten a second",), throw=True), "lock_rate(...)")
    _refused(client, lambda: keyed.delay(7), "lock_rate_key(...)")
    _refused(client, lambda: keyed.apply((7,), throw=True), "lock_rate_key(...)")
    assert not list(client.scan_iter(match="*")), "a key was left under the prefix"
