"""One check of "a number of seconds" (``check_duration``) for the whole package: the lock's
leases, waits and backend timeout, the settings and the task options all say the same thing, in
the same words, about the same wrong value. No Redis is needed: every check runs before a
command is sent."""

from __future__ import annotations

import math
from typing import Any

import pytest
import redis
from celery_fixtures import new_app

from celery_singleton_lock import LockedTask, LockSpace, ReentrantLock
from celery_singleton_lock._celery.config import LockConfig
from celery_singleton_lock._celery.settings import check_seconds
from celery_singleton_lock._lock import MAX_LEASE_SECONDS, check_duration

#: a client whose server does not exist: nothing below may get as far as sending
CLIENT: Any = redis.Redis(port=1)
Lock: Any = ReentrantLock


def test_a_duration_is_a_finite_real_number_within_its_bounds() -> None:
    assert check_duration(30, "ttl") == 30.0
    assert isinstance(check_duration(1, "ttl"), float)
    assert check_duration(MAX_LEASE_SECONDS, "ttl") == MAX_LEASE_SECONDS
    assert check_duration(0, "wait", include_minimum=True) == 0.0
    assert check_duration(None, "wait", allow_none=True) is None
    assert check_duration(1e12, "wait", maximum=None) == 1e12


@pytest.mark.parametrize("value", ["30", "30s", True, False, [30], None, b"1"])
def test_a_value_of_the_wrong_type_is_a_type_error_saying_what_it_takes(value: Any) -> None:
    with pytest.raises(TypeError) as info:
        check_duration(value, "my_param")
    assert str(info.value) == (f"my_param must be a number of seconds such as 30, got {value!r}")


@pytest.mark.parametrize("value", [0, -1, math.nan, math.inf, -math.inf, MAX_LEASE_SECONDS + 1])
def test_a_number_out_of_bounds_is_a_value_error_naming_the_bounds(value: Any) -> None:
    with pytest.raises(ValueError) as info:
        check_duration(value, "my_param")
    assert str(info.value) == (
        f"my_param must be > 0 and at most {MAX_LEASE_SECONDS} seconds (ten years), got {value!r}"
    )


def test_the_message_says_what_none_means_and_how_to_fix_a_value_too_long() -> None:
    with pytest.raises(TypeError, match=r"or None \(no bound\), got 'x'"):
        check_duration("x", "timeout", allow_none=True)
    with pytest.raises(ValueError, match=r"timeout must be a finite number of seconds >= 0"):
        check_duration(-1, "timeout", include_minimum=True, maximum=None, allow_none=True)
    with pytest.raises(ValueError, match=r"got 3153600000: keep it short"):
        check_duration(MAX_LEASE_SECONDS * 10, "lease", too_long=": keep it short")


def _lock_ttl(value: Any) -> None:
    Lock(CLIENT, "t", ttl=value)


def _space_lease(value: Any) -> None:
    LockSpace(CLIENT).named("t").take("owner", value)


def _setting(value: Any) -> None:
    app = new_app("durations")
    app.conf.singleton_lock_ttl = value
    LockConfig.of(app).check()


def _option(value: Any) -> None:
    app = new_app("durations")
    app.finalize()

    def job() -> None: ...

    app.task(base=LockedTask, name="d.job", shared=False, lock_wait_timeout=value)(job)


def _drop_in(value: Any) -> None:
    check_seconds("lock_expiry", value)


@pytest.mark.parametrize(
    ("call", "named"),
    [
        (_lock_ttl, "ttl"),
        (_space_lease, "lease"),
        (_setting, "singleton_lock_ttl"),
        (_option, "task 'd.job': lock_wait_timeout"),
        (_drop_in, "lock_expiry"),
    ],
    ids=["lock ttl", "space lease", "setting", "option", "drop-in"],
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
