"""The shortcuts on the hot paths (see bench/bench_celery.py) behave exactly like the slow paths
they replace: the settings lookup, the operator info, and the lock scripts sent on a connection the
thread keeps out of the client's pool."""

from __future__ import annotations

import json
import os
import threading
from collections import UserDict
from collections.abc import Callable
from typing import Any, ClassVar

import pytest
import redis
from celery import Celery
from redis.utils import HIREDIS_AVAILABLE

from celery_singleton_lock import ReentrantLock
from celery_singleton_lock._celery.info import HOST, holder_info
from celery_singleton_lock._celery.settings import DEFAULTS, setting
from celery_singleton_lock._lock import connection
from celery_singleton_lock.testing import RedisServer


def _setting_by_conf_get(app: Any, name: str) -> Any:
    """The reference: what ``setting()`` did before its fast path."""
    for candidate in (name, name.upper(), "CELERY_" + name.upper()):
        value = app.conf.get(candidate)
        if value is not None:
            return value
    return DEFAULTS[name]


class _ConfigObject:
    singleton_lock_prefix = "from-object"
    CELERY_SINGLETON_LOCK_TTL = 9
    #: set and deleted by test_setting_sees_changes_made_after_the_first_read
    singleton_lock_queue_ttl: ClassVar[int]


class _DjangoLike:
    SINGLETON_LOCK_PREFIX = "upper"
    singleton_lock_ttl = None
    CELERY_SINGLETON_LOCK_TTL = 4


def _apps() -> list[Celery]:
    direct = Celery("direct", broker="redis://127.0.0.1:1/0")
    direct.conf.singleton_lock_ttl = 5
    namespaced = Celery("namespaced")
    namespaced.config_from_object(
        {"CELERY_SINGLETON_LOCK_PREFIX": "zz", "singleton_lock_ttl": None}, namespace="CELERY"
    )
    upper = Celery("upper")
    upper.config_from_object({"SINGLETON_LOCK_QUEUE_TTL": 7})
    from_object = Celery("from_object")
    from_object.config_from_object(_ConfigObject)
    django_like = Celery("django_like")
    django_like.config_from_object(_DjangoLike, namespace="CELERY")
    odd_defaults = Celery("odd_defaults")
    odd_defaults.conf.add_defaults(UserDict({"singleton_lock_prefix": "user-dict"}))
    return [direct, namespaced, upper, from_object, django_like, odd_defaults, Celery("empty")]


@pytest.mark.parametrize("app", _apps(), ids=lambda app: app.main)
def test_setting_fast_path_reads_what_conf_get_reads(app: Celery) -> None:
    for name in DEFAULTS:
        assert setting(app, name) == _setting_by_conf_get(app, name), name


def test_setting_sees_changes_made_after_the_first_read() -> None:
    app = Celery("changes", broker="redis://127.0.0.1:1/0")
    assert setting(app, "singleton_lock_prefix") == "lock"
    app.conf.singleton_lock_prefix = "changed"
    assert setting(app, "singleton_lock_prefix") == "changed"
    app.conf.update(SINGLETON_LOCK_TTL=12)
    assert setting(app, "singleton_lock_ttl") == 12
    _ConfigObject.singleton_lock_queue_ttl = 99  # a config object changed in place
    try:
        from_object = Celery("from_object")
        from_object.config_from_object(_ConfigObject)
        assert setting(from_object, "singleton_lock_queue_ttl") == 99
    finally:
        del _ConfigObject.singleton_lock_queue_ttl


@pytest.mark.parametrize(
    ("task", "task_id", "state"),
    [("a.b", "0f-1", "running"), ('é"x\n', "id\u2028", "queued"), ("t" * 300, "💥", "x")],
)
def test_info_is_the_json_it_always_was(task: str, task_id: str, state: str) -> None:
    expected = json.dumps(
        {"task": task, "id": task_id, "state": state, "host": HOST, "pid": os.getpid()},
        separators=(",", ":"),
    )
    assert holder_info(task, task_id, state) == expected
    assert json.loads(holder_info(task, task_id, state))["id"] == task_id


def _kept_connection(client: Any) -> Any:
    by_pool = connection._local.__dict__.get("by_pool") or {}
    borrowed = by_pool.get(client.connection_pool)
    return None if borrowed is None else borrowed.conn


def test_scripts_use_one_kept_connection_per_thread(
    make_redis_server: Callable[..., RedisServer],
) -> None:
    # A server of its own: the count of clients below must not see other tests' connections
    # (a heartbeat test's last command is an EVALSHA too).
    redis_client = make_redis_server().client()
    lock = ReentrantLock(redis_client, "hot-kept", ttl=5, renew=False)
    for _ in range(3):
        with lock:
            pass
    conn = _kept_connection(redis_client)
    assert conn is not None
    clients = [c for c in redis_client.client_list() if c.get("cmd") in ("evalsha", "client|list")]
    assert len(clients) <= 2  # the kept connection, and the one that asked for the list

    seen: list[Any] = []

    def other_thread() -> None:
        with ReentrantLock(redis_client, "hot-kept-2", ttl=5, renew=False):
            seen.append(_kept_connection(redis_client))

    thread = threading.Thread(target=other_thread)
    thread.start()
    thread.join()
    assert seen and seen[0] is not None and seen[0] is not conn
    pool = redis_client.connection_pool
    assert conn in pool._in_use_connections  # this thread's, still kept
    assert seen[0] in pool._available_connections  # the ended thread's, back in the pool


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


def test_the_kept_connection_survives_a_server_restart(make_redis_server: Any) -> None:
    server: RedisServer = make_redis_server()
    client = server.client()
    lock = ReentrantLock(client, "hot-restart", ttl=5, renew=False)
    with lock:
        pass
    server.restart()  # the kept connection is now dead, and the scripts are gone
    with lock:  # reconnected (redis-py's retry) and reloaded (NOSCRIPT)
        assert lock.owned()
    client.close()


@pytest.mark.parametrize(
    ("encoding", "errors"), [("utf-8", "strict"), ("latin-1", "replace"), ("utf-16", "strict")]
)
def test_the_lock_s_packer_writes_what_redis_py_writes(encoding: str, errors: str) -> None:
    """The kept connection packs the scripts' commands itself: byte for byte what redis-py's
    packer makes with the client's encoding (in UTF-8 whatever the encoding, as redis-py does,
    when hiredis is installed), for every argument type the lock sends."""
    client = redis.Redis(encoding=encoding, encoding_errors=errors)
    conn = client.connection_pool.make_connection()
    packing = connection.packing_encoding(conn)
    assert packing == (("utf-8", "strict") if HIREDIS_AVAILABLE else (encoding, errors))
    encoding, errors = packing
    commands = [
        ("EVALSHA", "a" * 40, 2, "lock:{n}", "lock:{n}:meta", "host:1:tok:1", 30000, "r:1", "", 0),
        ("EVALSHA", "f" * 40, 2, "lock:{ünï ☃}", "lock:{ünï ☃}:meta", -1, 2**63 - 1, b"\x00\xff"),
        ("PING",),
        ("CLIENT SETNAME", "lock-ünï"),
        ("SET", "k", "v" * 10_000),
    ]
    for command in commands:
        assert connection._pack(command, encoding, errors) == [
            b"".join(conn.pack_command(*command))  # type: ignore[no-untyped-call]  # redis-py: unannotated
        ]
    # anything else is left to redis-py's packer
    assert connection._pack(("SET", "k", 1.5), encoding, errors) is None
    assert connection._pack(("SET", "k", True), encoding, errors) is None


def test_a_kept_connection_closed_by_the_server_is_replaced(make_redis_server: Any) -> None:
    """The server closes the kept connection while it sits unused (CLIENT KILL stands for an
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


def test_a_single_connection_client_is_left_alone(redis_server: RedisServer) -> None:
    client = redis.Redis(host="127.0.0.1", port=redis_server.port, single_connection_client=True)
    with ReentrantLock(client, "hot-single", ttl=5, renew=False):
        pass
    assert _kept_connection(client) is None
    client.close()
