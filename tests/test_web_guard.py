"""The standalone page against a hostile browser, over real HTTP on a real redis-server: it
answers its own names only (a DNS-rebinding site's name is refused before routing, for every
method), checks a POST's Origin against those names (scheme included), slows wrong tokens
down, logs refusals at most every few seconds with a count (values escaped, the actor
"anonymous" until the token matched), and refuses a short token at start."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from celery_fixtures import DB_LOCKS
from celery_procs import ROOT
from lock_helpers import START_TIMEOUT, wait_until
from web_helpers import Client, served

from celery_singleton_lock import LockSpace
from celery_singleton_lock.testing import RedisServer
from celery_singleton_lock.web import LocksWeb, TokenAccess, make_app

TOKEN = "a-token-of-twenty-chars"
KEY = "lock:{guard.job:1}"


@pytest.fixture
def locks(redis_server: RedisServer) -> Iterator[Any]:
    client = redis_server.client(db=DB_LOCKS)
    client.flushdb()
    assert LockSpace(client).named("guard.job:1").take("task-1", 60, state="running").acquired
    yield client
    client.close()


def page(redis_server: RedisServer, token: str | None = TOKEN) -> LocksWeb:
    url = f"redis://127.0.0.1:{redis_server.port}/{DB_LOCKS}"
    return make_app(url=url, access=TokenAccess(token), refresh=0)


def release_form(client: Client, token: str = TOKEN) -> dict[str, str]:
    client.get("./")
    return {"key": KEY, "holder": "", "csrf": client.cookies["csl_csrf"], "token": token}


def holder(locks: Any) -> str | None:
    return LockSpace(locks).inspect(KEY).holder


def test_a_foreign_host_is_refused_before_routing_for_every_method(
    redis_server: RedisServer, locks: Any, caplog: pytest.LogCaptureFixture
) -> None:
    with served(page(redis_server)) as base, caplog.at_level(logging.INFO):
        client = Client(base)
        form = release_form(client)
        port = base.rsplit(":", 1)[1].rstrip("/")
        evil = {"Host": f"evil.example:{port}"}
        for method, path in [("GET", "./"), ("GET", "lock?key=x"), ("HEAD", "./"),
                             ("GET", "release?key=x"), ("GET", "purge"), ("PUT", "./"),
                             ("GET", "nothing")]:  # fmt: skip
            reply = client.request(method, path, headers=evil)
            assert reply.status == 421, (method, path, reply.status)
            assert KEY not in reply.body
        posted = client.request(
            "POST", "release", form, {**evil, "Origin": f"http://{evil['Host']}"}
        )
        assert posted.status == 421 and holder(locks) == "task-1"
        assert client.request("POST", "purge", form, evil).status == 421
        assert holder(locks) == "task-1"
        for name in (f"localhost:{port}", f"127.0.0.1:{port}"):
            assert client.request("GET", "./", headers={"Host": name}).status == 200
        # the loopback name on another port is another site
        assert client.request("GET", "./", headers={"Host": "127.0.0.1:1"}).status == 421
    (line,) = [r.getMessage() for r in caplog.records if r.name == "celery_singleton_lock.web"]
    assert line.startswith("refused a GET by anonymous for a Host") and "evil.example" in line


def test_the_origin_is_checked_against_the_allowed_names_scheme_included(
    redis_server: RedisServer, locks: Any
) -> None:
    with served(page(redis_server), allowed_hosts=("locks.example.com",)) as base:
        client = Client(base)
        form = release_form(client)
        port = base.rsplit(":", 1)[1].rstrip("/")
        refused = [
            {"Origin": f"https://127.0.0.1:{port}"},  # the page is http only on loopback
            {"Origin": "http://evil.example"},
            {"Origin": "null"},
            {"Referer": "http://evil.example/x"},
            {"Host": "locks.example.com", "Origin": "https://evil.example"},
        ]
        for headers in refused:
            assert client.post("release", form, **headers).status == 403, headers
        assert holder(locks) == "task-1"
        proxied = {"Host": "locks.example.com", "Origin": "https://locks.example.com"}
        assert client.get("./").status == 200
        assert client.request("GET", "./", headers={"Host": "locks.example.com"}).status == 200
        assert client.post("release", form, **proxied).status == 303
    assert holder(locks) is None


def test_wrong_tokens_slow_down_and_are_logged_at_most_every_few_seconds(
    redis_server: RedisServer, locks: Any, caplog: pytest.LogCaptureFixture
) -> None:
    web = page(redis_server)
    web.refusal_every = 1.0
    with served(web) as base, caplog.at_level(logging.INFO, "celery_singleton_lock.web"):
        client = Client(base)
        wrong = release_form(client, token="w" * 20)
        assert [client.post("release", wrong).status for _ in range(3)] == [403] * 3
        # the gate is closed now: even the right token waits
        right = release_form(client)
        blocked = client.post("release", right)
        assert blocked.status == 429 and "try again" in blocked.body
        assert holder(locks) == "task-1"
        assert wait_until(lambda: web.access.wait_left() == 0, 10, "the gate", 0.05)  # type: ignore[attr-defined]
        assert client.post("release", wrong).status == 403  # one more try, then longer
        assert web.access.wait_left() > 1.0  # type: ignore[attr-defined]
        wait_until(lambda: web.access.wait_left() == 0, 10, "the gate", 0.05)  # type: ignore[attr-defined]
        assert client.post("release", right).status == 303
    assert holder(locks) is None
    lines = [r.getMessage() for r in caplog.records if r.name == "celery_singleton_lock.web"]
    refusals = [line for line in lines if line.startswith("refused")]
    assert 1 <= len(refusals) <= 3, refusals
    assert any("more refused" in line for line in refusals), refusals
    assert all("by anonymous" in line for line in refusals), refusals
    (released,) = [line for line in lines if line.startswith("released")]
    assert "by holder of the web token" in released and "Host 127.0.0.1:" in released


def test_a_refusal_log_line_escapes_what_the_request_sent(
    redis_server: RedisServer, locks: Any, caplog: pytest.LogCaptureFixture
) -> None:
    with served(page(redis_server)) as base, caplog.at_level(logging.INFO):
        client = Client(base)
        form = release_form(client)
        folded = "http://evil.example\r\n\tWARNING forged: released everything"
        assert client.post("release", form, Origin=folded).status == 403
    (line,) = [r.getMessage() for r in caplog.records if r.name == "celery_singleton_lock.web"]
    assert "\n" not in line and "\r" not in line and "by anonymous" in line
    assert "Origin http://evil.example\\r\\n\\tWARNING" in line


def test_a_short_token_is_refused_at_start(redis_server: RedisServer) -> None:
    with pytest.raises(ValueError, match="at least 16 characters"):
        TokenAccess("fifteen-chars!!")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "CELERY_SINGLETON_LOCK_WEB_TOKEN": "tok"}
    url = f"redis://127.0.0.1:{redis_server.port}/{DB_LOCKS}"
    done = subprocess.run(
        [sys.executable, "-m", "celery_singleton_lock", "--url", url, "web", "--port", "0"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=START_TIMEOUT,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "CELERY_SINGLETON_LOCK_WEB_TOKEN" in done.stderr and "16" in done.stderr


def test_a_bad_allowed_host_is_refused_at_start(redis_server: RedisServer) -> None:
    url = f"redis://127.0.0.1:{redis_server.port}/{DB_LOCKS}"
    done = subprocess.run(
        [sys.executable, "-m", "celery_singleton_lock", "--url", url, "web", "--port", "0",
         "--allowed-host", "https://locks.example.com/path"],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True,
        timeout=START_TIMEOUT,
    )  # fmt: skip
    assert done.returncode == 2 and "--allowed-host" in done.stderr, done.stderr
    assert "must be a host name as a proxy sends it" in done.stderr, done.stderr


def test_every_answer_carries_the_security_headers(redis_server: RedisServer, locks: Any) -> None:
    wanted = {
        "Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'; "
        "form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
        "X-Content-Type-Options": "nosniff",
        "Referrer-Policy": "same-origin",
    }
    with served(page(redis_server)) as base:
        client = Client(base)
        form = release_form(client)
        port = base.rsplit(":", 1)[1].rstrip("/")
        answers = [
            client.get("./"),
            client.get("lock?key=lock%3A%7Bguard.job%3A1%7D"),
            client.get("lock?key=lock%3A%7Bnone%7D"),  # 404
            client.get("./?page=x"),  # 400
            client.get("nothing"),  # 404
            client.request("GET", "./", headers={"Host": f"evil.example:{port}"}),  # 421
            client.post("release", {**form, "csrf": "x"}),  # 403
            client.post("release", form),  # 303
        ]
    assert [a.status for a in answers] == [200, 200, 404, 400, 404, 421, 403, 303]
    for answer in answers:
        assert {k: answer.headers.get(k) for k in wanted} == wanted, answer.status
