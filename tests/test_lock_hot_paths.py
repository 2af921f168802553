"""The lock layer's shortcuts on the hot paths (see bench/bench_celery.py) behave exactly like
the slow paths they replace: the lock scripts, sent through redis-py's public EVALSHA, see
whatever the client does (a wrapped ``execute_command``, a restart, a connection the server
closed); the quick checks answer as the general one; keys, runtimes and checked locks are what
they say."""

from __future__ import annotations

import dataclasses
import inspect
import os
from typing import Any

import pytest
import redis
import redis.retry
from hypothesis import given
from hypothesis import strategies as st

from celery_singleton_lock import LockSpace, ReentrantLock
from celery_singleton_lock._lock import DeadlineRetry
from celery_singleton_lock._lock.checks import check_duration, check_lease_ms, check_wait
from celery_singleton_lock._lock.keys import LockKeys
from celery_singleton_lock._lock.runtime import LockRuntime
from celery_singleton_lock._lock.semaphore import check_permits
from celery_singleton_lock.testing import RedisServer


def test_a_wrapped_execute_command_still_sees_every_script(redis_client: Any) -> None:
    with ReentrantLock(redis_client, "hot-wrapped", ttl=5, renew=False):
        pass  # the scripts loaded (NOSCRIPT, SCRIPT LOAD) before counting, whatever ran before
    calls: list[tuple[Any, ...]] = []
    inner = redis_client.execute_command

    def counting(*args: Any, **options: Any) -> Any:
        calls.append(args)
        return inner(*args, **options)

    redis_client.execute_command = counting
    try:
        with ReentrantLock(redis_client, "hot-wrapped", ttl=5, renew=False):
            pass
    finally:
        del redis_client.execute_command
    assert [c[0] for c in calls] == ["EVALSHA", "EVALSHA"]


def test_the_scripts_survive_a_server_restart(make_redis_server: Any) -> None:
    server: RedisServer = make_redis_server()
    client = server.client()
    lock = ReentrantLock(client, "hot-restart", ttl=5, renew=False)
    with lock:
        pass
    server.restart()  # the pooled connection is now dead, and the scripts are gone
    with lock:  # reconnected (redis-py's retry) and reloaded (NOSCRIPT)
        assert lock.owned()
    client.close()


def test_a_connection_closed_by_the_server_is_replaced(make_redis_server: Any) -> None:
    """The server closes the pooled connection while it sits unused (CLIENT KILL stands for an
    idle timeout or a proxy): the next acquire and release go through on a new connection, with
    no retry configured on the client (redis-py before 6 retries nothing by default), and the
    hold is counted once."""
    server: RedisServer = make_redis_server()
    client = redis.Redis(port=server.port, retry=redis.retry.Retry(redis.backoff.NoBackoff(), 0))
    admin = server.client()
    lock = ReentrantLock(client, "hot-killed", ttl=5, renew=False)
    with lock:
        pass
    killed = admin.client_kill_filter(_type="normal", skipme=True)
    assert killed >= 1
    with lock:
        assert admin.hgetall(lock.key) == {lock.owner.encode(): b"1"}
    assert not admin.exists(lock.key)
    client.close()


def test_a_single_connection_client_works(redis_server: RedisServer) -> None:
    client = redis.Redis(host="127.0.0.1", port=redis_server.port, single_connection_client=True)
    with ReentrantLock(client, "hot-single", ttl=5, renew=False) as lock:
        assert lock.owned()
    client.close()


@pytest.mark.parametrize("within_deadline", [False, True])
def test_a_deadline_retry_client_survives_a_server_restart(
    make_redis_server: Any, within_deadline: bool
) -> None:
    """The package's own retry policy sends a command at once and enters its retry loop only
    when the send fails: after a restart, the command that finds the dead connection is sent
    again on a new one (the failure handler closed the old), with or without a deadline."""
    server: RedisServer = make_redis_server()
    client = redis.Redis(port=server.port, retry=DeadlineRetry(redis.backoff.NoBackoff(), 2))
    bound = 5.0 if within_deadline else None
    lock = ReentrantLock(client, "hot-retry-restart", ttl=5, renew=False, backend_timeout=bound)
    with lock:
        pass
    server.restart()
    with lock:
        assert lock.owned()
    client.close()


def test_the_retry_policy_retries_what_redis_py_adds_to_it() -> None:
    """redis-py widens a client's policy (``retry_on_error``) through ``update_supported_errors``:
    an error it added is resent too, the failure handler gets the count when asked, and an
    error ``is_retryable`` refuses is raised at once, without a resend."""
    policy = DeadlineRetry(redis.backoff.NoBackoff(), 3)
    policy.update_supported_errors([KeyError])
    attempts: list[int] = []
    failures: list[tuple[Any, ...]] = []

    def flaky() -> str:
        attempts.append(1)
        if len(attempts) < 3:
            raise KeyError("lost")
        return "done"

    # redis-py 6 and later hand the failure count and ask is_retryable; 5 calls do and fail only
    newer = "with_failure_count" in inspect.signature(redis.retry.Retry.call_with_retry).parameters
    extra: dict[str, Any] = {"with_failure_count": True} if newer else {}
    result = policy.call_with_retry(flaky, lambda *failure: failures.append(failure), **extra)
    assert result == "done"
    assert len(attempts) == 3
    assert [f[1] for f in failures] == [1, 2] if newer else len(failures) == 2
    if not newer:
        return
    attempts.clear()
    with pytest.raises(KeyError):
        policy.call_with_retry(flaky, lambda *_: None, lambda _error: False)
    assert len(attempts) == 1


def test_a_checked_lock_is_the_lock_its_space_makes(redis_client: Any) -> None:
    """``LockSpace.checked_lock`` (a job's lock, its checks done once per space) makes the same
    object ``LockSpace.lock`` does; a lease or a name it cannot take is refused as ``lock``
    refuses it."""
    space = LockSpace(redis_client, "hot", backend_timeout=3.0)
    texts = {"owner": "task-1", "info": "{}", "run_token": "r-1", "state": "running"}
    checked = space.checked_lock("job:1", ttl=7.5, **texts)
    made = space.lock("job:1", ttl=7.5, **texts)
    assert vars(checked) == vars(made)
    with checked:
        assert checked.owned()
    with pytest.raises(ValueError, match="ttl"):
        space.checked_lock("job:1", ttl=0.0, **texts)
    with pytest.raises(TypeError, match="name"):
        space.checked_lock("", ttl=7.5, **texts)


def test_a_runtime_is_per_client_and_per_process(redis_server: RedisServer) -> None:
    """A client's runtime is found again for that client only, and a forked child gets its own."""
    first, second = redis_server.client(), redis_server.client()
    runtime = LockRuntime.of(first)
    assert LockRuntime.of(first) is runtime
    assert LockRuntime.of(second) is not runtime
    assert LockRuntime.of(first) is runtime
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: a new runtime for the same client
        os.write(write, b"1" if LockRuntime.of(first) is not runtime else b"0")
        os._exit(0)
    os.close(write)
    assert os.read(read, 1) == b"1"
    os.close(read)
    os.waitpid(pid, 0)


@pytest.mark.parametrize(("name", "slot"), [("a", 1), ("b}%c", 1), ("d", 3)])
def test_keys_made_for_a_name_are_the_dataclass_they_say(name: str, slot: int) -> None:
    """``LockKeys.for_name`` fills the frozen dataclass without its ``__init__``: the same
    object, equal, hashed and shown as one made by it, and still frozen."""
    keys = LockKeys.for_name("p", name, slot)
    made = LockKeys(keys.prefix, name, keys.lock, keys.lock + ":meta", keys.channel, slot)
    assert keys == made
    assert hash(keys) == hash(made)
    assert repr(keys) == repr(made)
    assert dataclasses.asdict(keys) == dataclasses.asdict(made)
    assert LockKeys.from_lock_key(keys.lock) == keys
    with pytest.raises(dataclasses.FrozenInstanceError):
        keys.name = "other"  # type: ignore[misc]


_NUMBERS = st.one_of(
    st.integers(min_value=-(10**12), max_value=10**12),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0, 0.0, 0.001, 0.0009, 1, 10 * 365 * 24 * 3600, 10 * 365 * 24 * 3600 + 1]),
    st.booleans(),
    st.none(),
    st.text(max_size=2),
)


def _outcome(check: Any, value: object) -> object:
    try:
        return check(value)
    except (TypeError, ValueError) as exc:
        return type(exc), str(exc)


@given(_NUMBERS)
def test_the_quick_checks_answer_as_the_general_one(value: object) -> None:
    """A lease, a wait and a permit count checked the quick way are accepted, converted or
    refused (with the same words) as the general check does."""
    general_lease = _outcome(
        lambda v: round(
            check_duration(
                v,
                "lease",
                minimum=0.001,
                include_minimum=True,
                too_long=(
                    ": a lease is how long a lock outlives a holder that died; keep it short "
                    "and let the heartbeat renew it"
                ),
            )
            * 1000
        ),
        value,
    )
    assert _outcome(check_lease_ms, value) == general_lease
    general_wait = _outcome(
        lambda v: check_duration(
            v, "timeout", include_minimum=True, maximum=None, none_means="no bound", example="10"
        ),
        value,
    )
    assert _outcome(check_wait, value) == (None if value is None else general_wait)
    if not isinstance(value, bool) and isinstance(value, int) and value >= 1:
        assert check_permits(value) == value
    else:
        with pytest.raises((TypeError, ValueError), match="permits must be an int >= 1"):
            check_permits(value)
