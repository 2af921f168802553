"""The Celery layer on Redis Sentinel: the locks take every sentinel of a ``sentinel://`` list,
read as the broker (kombu) reads it.

Before the fix a ``sentinel://s1;sentinel://s2;...`` broker URL gave the locks the first
sentinel only (cut at the first ``;``): the broker failed over to the next sentinel, the locks
could not reach Sentinel at all while the first one was down. The fault tests here start a
master, a replica and three sentinels (real processes), stop the first sentinel and fail the
master over; the others check the spellings of a sentinel URL against kombu's reading, and the
errors of the ones the locks cannot read as the broker does.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from celery import Celery
from celery_fixtures import BASE_CONF, lock_space, new_app
from lock_helpers import wait_until
from test_lock_deployments import SentinelProcess

from celery_singleton_lock.testing import RedisServer

#: the password of the default user, and the ACL user ``locks`` (with a character that a URL
#: must quote), on the servers of an authenticated set
PASSWORD, LOCKS_PASSWORD = "s3cret", "p@ss"
#: seconds: the lease of the held lock (renewed every LEASE/3): it must outlast the failover,
#: during which a killed master takes no renewal, on a loaded machine too
LEASE = 5.0


@dataclass
class SentinelSet:
    master: RedisServer
    replica: RedisServer
    sentinels: list[SentinelProcess]
    password: str | None

    def client(self, server: RedisServer, db: int = 0) -> Any:
        return server.client(password=self.password, db=db)

    def urls(self, first: str = "", path: str = "") -> list[str]:
        """One ``sentinel://`` URL per sentinel; ``first`` (``user:pw@``) and ``path`` (``/2``)
        in the first one only."""
        ports = [s.port for s in self.sentinels]
        return [f"sentinel://{first}127.0.0.1:{ports[0]}{path}"] + [
            f"sentinel://127.0.0.1:{port}" for port in ports[1:]
        ]


def _sees_the_replica(sentinel: SentinelProcess) -> bool:
    """Whether ``sentinel`` knows the replica, is connected to it and sees its link to the
    master up: only then may it promote it (``NOGOODSLAVE`` otherwise)."""
    with sentinel.client() as probe:
        replicas = probe.sentinel_slaves("mymaster")
    return any(r["flags"] == "slave" and r["master-link-status"] == "ok" for r in replicas)


@contextlib.contextmanager
def sentinel_set(
    make_redis_server: Callable[..., RedisServer], auth: bool
) -> Iterator[SentinelSet]:
    """A master, its replica and three sentinels (quorum 2) watching them. ``auth``: the
    default user has a password, and an ACL user ``locks`` exists on both servers."""
    args = ["--repl-diskless-sync-delay", "0"]  # the replica's first sync at once, not in 5 s
    extra = ["sentinel failover-timeout mymaster 5000"]
    if auth:
        args += ["--requirepass", PASSWORD, "--masterauth", PASSWORD]
        args += ["--user", "locks", "on", f">{LOCKS_PASSWORD}", "~*", "&*", "+@all"]
        extra.append(f"sentinel auth-pass mymaster {PASSWORD}")
    master = make_redis_server(*args)
    replica = make_redis_server(*args, "--replicaof", "127.0.0.1", str(master.port))
    group = SentinelSet(master, replica, [], PASSWORD if auth else None)
    wait_until(
        lambda: group.client(replica).info("replication")["master_link_status"] == "up",
        20,
        "the replica to sync",
    )
    try:
        for _ in range(3):
            group.sentinels.append(
                SentinelProcess(master, quorum=2, down_after_ms=1000, extra=tuple(extra)).start()
            )
        wait_until(
            lambda: all(_sees_the_replica(s) for s in group.sentinels),
            20,
            "every sentinel to find the replica and connect to it",
        )
        yield group
    finally:
        for sentinel in group.sentinels:
            sentinel.stop()


def _app(name: str, **conf: Any) -> Celery:
    app = new_app(name)
    app.conf.update(BASE_CONF)
    # the master's socket timeout; each sentinel's is a quarter of it (three and the command
    # fit in it), which a hung first sentinel costs once
    app.conf.update(singleton_lock_backend_timeout=2.0, **conf)
    return app


def _fail_over(group: SentinelSet, kill_master: bool) -> None:
    """Promote the replica through the second sentinel (the first is stopped), after killing
    the master if ``kill_master``; return when the live sentinels name the new master."""
    assert group.master.process is not None
    if kill_master:
        os.kill(group.master.process.pid, signal.SIGKILL)
    with group.sentinels[1].client() as probe:
        probe.execute_command("SENTINEL", "FAILOVER", "mymaster")
    wait_until(
        lambda: all(s.master_port() == group.replica.port for s in group.sentinels[1:]),
        30,
        "the live sentinels to name the promoted replica",
    )


@pytest.mark.sentinel
@pytest.mark.faults
@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("stop", "failover", "where"),
    [
        ("SIGSTOP", "SENTINEL FAILOVER", "broker_url"),
        ("SIGKILL", "master SIGKILLed", "broker_url"),
        ("SIGSTOP", "master SIGKILLed", "singleton_lock_redis_url"),
    ],
)
def test_the_locks_use_every_sentinel_of_the_url(
    make_redis_server: Callable[..., RedisServer], stop: str, failover: str, where: str
) -> None:
    auth = where == "singleton_lock_redis_url"
    with sentinel_set(make_redis_server, auth=auth) as group:
        if where == "broker_url":
            # as Celery users write it: the URLs, and the master's name for the broker
            app = _app(
                "sentinel_broker",
                broker_url=";".join(group.urls()),
                broker_transport_options={"master_name": "mymaster"},
            )
            db = 0
        else:
            # an ACL user and a database in the first URL only, and a trailing ';'
            app = _app(
                "sentinel_own_url",
                broker_url="memory://",
                singleton_lock_redis_url=";".join(group.urls("locks:p%40ss@", "/3")) + ";",
                singleton_lock_redis_options={"master_name": "mymaster"},
            )
            db = 3
        first = group.sentinels[0].process
        assert first is not None
        # The first sentinel is down before the app's first lock: SIGSTOP hangs it (a connect
        # succeeds, no reply comes), SIGKILL refuses.
        os.kill(first.pid, getattr(signal, stop))
        space = lock_space(app)
        holder = space.lock("sentinel-job", ttl=LEASE, owner="holder")
        assert holder.acquire(blocking=False)
        assert group.client(group.master, db).hexists(holder.key, "holder")
        # Replicated before the fault (what asynchronous replication may lose is not the
        # subject here): the replica's offset reaches the master's.
        written = group.client(group.master).info("replication")["master_repl_offset"]
        wait_until(
            lambda: (
                group.client(group.replica).info("replication")["master_repl_offset"] >= written
            ),
            10,
            "the replica to catch up with the lock",
        )

        _fail_over(group, kill_master=failover == "master SIGKILLed")

        # The held lock is renewed on the new master (its TTL there grows), and nobody else
        # gets it.
        new_master = group.client(group.replica, db)
        contender = space.lock("sentinel-job", ttl=LEASE, owner="contender")
        replicated = new_master.pttl(holder.key)
        assert replicated > 0
        wait_until(
            lambda: new_master.pttl(holder.key) > replicated,
            3 * LEASE,
            "the holder to renew its lease on the new master",
        )
        assert not contender.acquire(blocking=False)
        assert not holder.lost.is_set()
        # A lock taken now lands on the new master too.
        after = space.lock("after-failover", ttl=LEASE)
        assert after.acquire(blocking=False)
        assert new_master.exists(after.key)
        after.release()
        holder.release()
        assert contender.acquire(blocking=False)
        contender.release()
        lock_space(app).client.close()


def _reading(pool: Any) -> tuple[list[tuple[str, int]], dict[str, Any]]:
    """What a Sentinel master pool was made from: the sentinels it asks, in order, and the
    user, password and database of its master connections."""
    sentinels = [
        (s.connection_pool.connection_kwargs["host"], s.connection_pool.connection_kwargs["port"])
        for s in pool.sentinel_manager.sentinels
    ]
    kwargs = pool.connection_kwargs
    return sentinels, {k: kwargs.get(k) for k in ("username", "password", "db")}


@pytest.mark.sentinel
@pytest.mark.timeout(60)
def test_the_locks_read_a_sentinel_broker_url_as_the_broker_does(
    make_redis_server: Callable[..., RedisServer],
) -> None:
    """Spellings of a sentinel broker URL that users write: each gives the locks the sentinels,
    user, password and database the broker's own connection (kombu) has."""
    with sentinel_set(make_redis_server, auth=True) as group:
        ports = [s.port for s in group.sentinels]
        sentinels = [("127.0.0.1", port) for port in ports]
        spellings: list[tuple[Any, dict[str, Any]]] = [
            # the password and database in the first URL only
            (
                ";".join(group.urls(f":{PASSWORD}@", "/2")),
                {"username": None, "password": PASSWORD, "db": 2},
            ),
            # an ACL user (a quoted password), and a trailing ';'
            (
                ";".join(group.urls("locks:p%40ss@", "/3")) + ";",
                {"username": "locks", "password": LOCKS_PASSWORD, "db": 3},
            ),
            # the same password and database in every URL
            (
                ";".join(f"sentinel://:{PASSWORD}@127.0.0.1:{port}/4" for port in ports),
                {"username": None, "password": PASSWORD, "db": 4},
            ),
            # a list of URLs instead of a ';'-separated string
            (group.urls(f":{PASSWORD}@", "/5"), {"username": None, "password": PASSWORD, "db": 5}),
        ]
        for url, expected in spellings:
            app = _app(
                "sentinel_spelling",
                broker_url=url,
                broker_transport_options={"master_name": "mymaster"},
            )
            with app.connection_for_write() as connection:  # kombu's, as the broker makes it
                broker = _reading(connection.default_channel.client.connection_pool)
            client = lock_space(app).client
            assert _reading(client.connection_pool) == broker == (sentinels, expected), url
            # one try per sentinel, a quarter of the master's timeout: three and the command
            # fit in it
            for sentinel in client.connection_pool.sentinel_manager.sentinels:
                kwargs = sentinel.connection_pool.connection_kwargs
                assert kwargs["socket_timeout"] == kwargs["socket_connect_timeout"] == 0.5
                # (redis-py before 5.1 has no Retry.get_retries(): the attribute it reads)
                assert kwargs["retry"]._retries == 0  # noqa: SLF001
            lock = lock_space(app).lock("spelling", ttl=LEASE)
            assert lock.acquire(blocking=False)
            assert group.client(group.master, expected["db"]).exists(lock.key)
            lock.release()
            client.close()


@pytest.mark.parametrize(
    ("conf", "message"),
    [
        (
            {"broker_url": "sentinel://127.0.0.1:26379;redis://127.0.0.1:6379/0"},
            r"broker_url mixes redis://… into a sentinel:// list",
        ),
        (
            {
                "broker_url": "memory://",
                "singleton_lock_redis_url": "sentinel://127.0.0.1:26379;rediss://127.0.0.1:1/0",
            },
            r"singleton_lock_redis_url mixes rediss://… into a sentinel:// list",
        ),
        (
            {"broker_url": "sentinel://127.0.0.1:26379;sentinel://:pw@127.0.0.1:26380"},
            r"broker_url: sentinel 127.0.0.1:26380 gives another user, password or database",
        ),
        (
            {"broker_url": "sentinel://127.0.0.1:26379/1;sentinel://127.0.0.1:26380/2"},
            r"broker_url: sentinel 127.0.0.1:26380 gives another user, password or database",
        ),
    ],
    ids=["broker-mixes", "own-url-mixes", "later-password", "later-db"],
)
def test_a_sentinel_url_the_locks_cannot_read_as_the_broker_does_names_the_setting(
    conf: dict[str, Any], message: str
) -> None:
    app = _app("sentinel_wrong", broker_transport_options={"master_name": "mymaster"}, **conf)
    with pytest.raises(ValueError, match=message):
        lock_space(app)


def test_a_sentinel_url_without_the_master_name_says_where_to_give_it() -> None:
    app = _app("sentinel_no_master", broker_url="sentinel://127.0.0.1:26379;sentinel://h2")
    with pytest.raises(ValueError, match=r"broker_url is a sentinel:// URL") as info:
        lock_space(app)
    assert "broker_transport_options = {'master_name': 'mymaster'}" in str(info.value)
    app = _app(
        "sentinel_own_no_master",
        broker_url="memory://",
        singleton_lock_redis_url="sentinel://127.0.0.1:26379;sentinel://h2",
    )
    with pytest.raises(ValueError, match=r"singleton_lock_redis_url is a sentinel:// URL") as info:
        lock_space(app)
    assert "singleton_lock_redis_options = {'master_name': 'mymaster'}" in str(info.value)
