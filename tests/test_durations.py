"""One check of "a number of seconds" for the whole package: the lock's leases, waits and
backend timeout, the settings and the task options all say the same thing, in the same words,
about the same wrong value. No Redis is needed: every check runs before a command is sent."""

from __future__ import annotations

import math
from typing import Any

import pytest
import redis
from celery_fixtures import new_app

from celery_singleton_lock import LockedTask, LockSpace, ReentrantLock

#: a client whose server does not exist: nothing below may get as far as sending
CLIENT: Any = redis.Redis(port=1)
Lock: Any = ReentrantLock
#: the longest lease: ten years (docs/lock.md)
MAX_LEASE_SECONDS = 10 * 365 * 24 * 3600


def test_a_duration_is_a_finite_real_number_within_its_bounds() -> None:
    assert Lock(CLIENT, "t", ttl=30).ttl == 30.0
    assert isinstance(Lock(CLIENT, "t", ttl=1).ttl, float)
    assert Lock(CLIENT, "t", ttl=MAX_LEASE_SECONDS).ttl == MAX_LEASE_SECONDS
    Lock(CLIENT, "t", timeout=0)  # a wait may be zero ...
    Lock(CLIENT, "t", timeout=None, backend_timeout=None)  # ... or none, no bound
    Lock(CLIENT, "t", timeout=1e12)  # a wait has no maximum


@pytest.mark.parametrize("value", ["30", "30s", True, False, [30], None, b"1"])
def test_a_value_of_the_wrong_type_is_a_type_error_saying_what_it_takes(value: Any) -> None:
    with pytest.raises(TypeError) as info:
        Lock(CLIENT, "t", ttl=value)
    assert str(info.value) == (f"ttl must be a number of seconds such as 30, got {value!r}")


@pytest.mark.parametrize("value", [0, -1, math.nan, math.inf, -math.inf, MAX_LEASE_SECONDS + 1])
def test_a_number_out_of_bounds_is_a_value_error_naming_the_bounds(value: Any) -> None:
    with pytest.raises(ValueError) as info:
        _setting(value)
    assert str(info.value) == (
        f"singleton_lock_ttl must be > 0 and at most {MAX_LEASE_SECONDS} seconds (ten years), "
        f"got {value!r}"
    )


def test_the_message_says_what_none_means_and_how_to_fix_a_value_too_long() -> None:
    with pytest.raises(TypeError, match=r"or None \(no bound\), got 'x'"):
        Lock(CLIENT, "t", timeout="x")
    with pytest.raises(ValueError, match=r"timeout must be a finite number of seconds >= 0"):
        Lock(CLIENT, "t", timeout=-1)
    with pytest.raises(ValueError, match=r"got 3153600000: a lease is how long a lock outlives"):
        Lock(CLIENT, "t", ttl=MAX_LEASE_SECONDS * 10)


def _lock_ttl(value: Any) -> None:
    Lock(CLIENT, "t", ttl=value)


def _space_lease(value: Any) -> None:
    LockSpace(CLIENT).named("t").take("owner", value)


def _job() -> None: ...


def _setting(value: Any) -> None:
    app = new_app("durations")
    app.conf.singleton_lock_ttl = value
    app.finalize()
    task = app.task(base=LockedTask, name="d.setting", shared=False)(_job)
    task.lock_key_for()  # the first use that checks the settings (no client needed)


def _option(value: Any) -> None:
    app = new_app("durations")
    app.finalize()
    app.task(base=LockedTask, name="d.job", shared=False, lock_wait_timeout=value)(_job)


@pytest.mark.parametrize(
    ("call", "named"),
    [
        (_lock_ttl, "ttl"),
        (_space_lease, "lease"),
        (_setting, "singleton_lock_ttl"),
        (_option, "task 'd.job': lock_wait_timeout"),
    ],
    ids=["lock ttl", "space lease", "setting", "option"],
)
@pytest.mark.parametrize(
    ("value", "error", "says"),
    [
        ("30s", TypeError, "must be a number of seconds such as 30, got '30s'"),
        (True, TypeError, "must be a number of seconds such as 30, got True"),
        (-1, ValueError, "and at most 315360000 seconds (ten years), got -1"),
        (math.nan, ValueError, "and at most 315360000 seconds (ten years), got nan"),
        (MAX_LEASE_SECONDS * 2, ValueError, "(ten years), got 630720000"),
    ],
)
def test_every_duration_of_the_package_is_checked_alike(
    call: Any, named: str, value: Any, error: type[Exception], says: str
) -> None:
    with pytest.raises(error) as info:
        call(value)
    assert str(info.value).startswith(f"{named} must be "), str(info.value)
    assert says in str(info.value)
