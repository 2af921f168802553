"""The locks page against a hung Redis and a crowd, on real redis-servers over real HTTP: with
the server SIGSTOPped each page answers 503 within 3 s (one deadline per request, the page's
own client with short waits and no resend), and 200 again after SIGCONT."""

from __future__ import annotations

import functools
import os
import signal
import time
from collections.abc import Iterator
from typing import Any

import pytest
from celery_fixtures import DB_LOCKS, configure, new_app
from celery_procs import close_app
from lock_helpers import wait_until
from web_helpers import Client, served

from celery_singleton_lock import LockSpace
from celery_singleton_lock.testing import RedisServer
from celery_singleton_lock.web import LocksWeb, TokenAccess, make_app

TOKEN = "a-token-of-twenty-chars"
KEY = "lock:{hung.job:1}"
PAGES = ["./", "lock?key=lock%3A%7Bhung.job%3A1%7D", "release?key=lock%3A%7Bhung.job%3A1%7D"]


@pytest.fixture
def hung_server(make_redis_server: Any) -> Iterator[RedisServer]:
    """A redis-server of the test's own (it is stopped and continued), with one lock held."""
    server = make_redis_server()
    client = server.client(db=DB_LOCKS)
    assert LockSpace(client).named("hung.job:1").take("task-1", 600, state="running").acquired
    client.close()
    yield server
    if server.process is not None:  # never leave it stopped
        os.kill(server.process.pid, signal.SIGCONT)


@pytest.fixture(params=["url", "app"])
def web(request: pytest.FixtureRequest, hung_server: RedisServer) -> Iterator[LocksWeb]:
    """The page of the server's locks, made from ``--url`` or from a Celery app."""
    access = TokenAccess(TOKEN)
    if request.param == "url":
        yield make_app(url=f"{hung_server.url}/{DB_LOCKS}", access=access, refresh=0)
        return
    app = new_app("webhung")
    configure(app, hung_server)
    try:
        yield make_app(app, access=access, refresh=0)
    finally:
        close_app(app)


def test_a_hung_redis_is_a_503_within_3_s_on_every_page_then_200_again(
    hung_server: RedisServer, web: LocksWeb
) -> None:
    assert hung_server.process is not None
    pid = hung_server.process.pid
    with served(web) as base:
        client = Client(base)
        assert [client.get(page).status for page in PAGES] == [200, 200, 200]
        os.kill(pid, signal.SIGSTOP)
        web.source.shared.forget()  # the list's shared read of a moment ago is not read again
        try:
            for page in PAGES:
                started = time.monotonic()
                reply = client.get(page)
                took = time.monotonic() - started
                assert reply.status == 503, (page, reply.status)
                assert took < 3.0, (page, took)
        finally:
            os.kill(pid, signal.SIGCONT)

        def answers(page: str) -> bool:
            return client.get(page).status == 200

        for page in PAGES:
            wait_until(functools.partial(answers, page), 10, f"{page} again")


def _calls(client: Any) -> int:
    """Commands the server ran that read locks (EVALSHA, SCAN) since the last reset."""
    stats = client.info("commandstats")
    return sum(int(stats.get(f"cmdstat_{c}", {}).get("calls", 0)) for c in ("evalsha", "scan"))


def test_a_view_reads_a_bounded_share_and_twenty_viewers_share_one_read(
    redis_server: RedisServer,
) -> None:
    """With 10,000 locks held and ``max_locks=300``, one view of the list costs Redis a few
    hundred lock reads, not 10,000; twenty viewers at once cost what one does (one read
    shared, at most about once a second)."""
    client = redis_server.client(db=DB_LOCKS)
    client.flushdb()
    with client.pipeline(transaction=False) as pipe:
        for i in range(10_000):
            pipe.hset(f"lock:{{many:{i}}}", f"o{i}", 1)
            pipe.pexpire(f"lock:{{many:{i}}}", 120_000)
        pipe.execute()
    web = make_app(url=f"{redis_server.url}/{DB_LOCKS}", max_locks=300, refresh=0)
    try:
        with served(web) as base:
            assert Client(base).get("./").status == 200  # (the scripts loaded)
            web.source.shared.forget()
            client.config_resetstat()
            assert Client(base).get("./").status == 200
            one = _calls(client)
            assert one < 400, one
            web.source.shared.forget()
            client.config_resetstat()
            import concurrent.futures

            with concurrent.futures.ThreadPoolExecutor(8) as pool:
                statuses = list(pool.map(lambda _: Client(base).get("./").status, range(20)))
            assert statuses.count(200) >= 8 and set(statuses) <= {200, 503}
            assert _calls(client) <= 2 * one, (_calls(client), one)
    finally:
        client.flushdb()
        client.close()
