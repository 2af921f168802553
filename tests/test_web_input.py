"""Odd input to the locks page, over real HTTP on a real redis-server: every one a 4xx that
says what is wrong (a page number of thousands of digits, an oversized form, a key too long
for a URL, linked by its digest instead), and anything unexpected the page's own 500 page,
with its usual headers. What others choose is never a link or a banner of the page's: a task
id is percent-encoded in the holder's link, a link pattern is a URL or a path, and only what
the page did shows in its success banner (a crafted ``?done=`` or cookie shows nothing)."""

from __future__ import annotations

import http.client
from typing import Any
from urllib.parse import quote, urlsplit

import pytest
from celery_fixtures import DB_LOCKS
from web_helpers import Client, served, table_rows, text_of

from celery_singleton_lock import LockSpace
from celery_singleton_lock.testing import RedisServer
from celery_singleton_lock.web import CallableAccess, LocksWeb, TokenAccess, make_app
from celery_singleton_lock.web.views import MAX_FORM_BYTES

TOKEN = "a-token-of-twenty-chars"


def page(redis_server: RedisServer, **options: Any) -> LocksWeb:
    options.setdefault("access", TokenAccess(TOKEN))
    return make_app(url=f"redis://127.0.0.1:{redis_server.port}/{DB_LOCKS}", **options)


@pytest.mark.parametrize(
    ("query", "says"),
    [
        ("page=" + "9" * 5000, "page must be a whole number"),
        ("page=99", "page must be a whole number from 1 to 1"),
        ("d=xyz", "d must be 24 hex digits"),
    ],
)
def test_an_odd_query_is_a_400_saying_why(
    redis_server: RedisServer, locks: Any, query: str, says: str
) -> None:
    path = ("lock?" if query.startswith("d=") else "./?") + query
    with served(page(redis_server)) as base:
        reply = Client(base).get(path)
    assert reply.status == 400, reply.body[:300]
    assert says in (text_of(reply.body, "id", "error") or "")


def _raw_post(base: str, path: str, body: bytes, length: str) -> tuple[int, str]:
    url = urlsplit(base)
    connection = http.client.HTTPConnection(url.hostname or "", url.port, timeout=30)
    try:
        connection.putrequest("POST", "/" + path)
        connection.putheader("Content-Type", "application/x-www-form-urlencoded")
        connection.putheader("Content-Length", length)
        connection.endheaders(body)
        reply = connection.getresponse()
        return reply.status, reply.read().decode()
    finally:
        connection.close()


def test_an_oversized_or_unreadable_form_says_so(redis_server: RedisServer, locks: Any) -> None:
    with served(page(redis_server)) as base:
        too_big = MAX_FORM_BYTES + 1
        status, body = _raw_post(base, "release", b"key=" + b"k" * (too_big - 4), str(too_big))
        assert status == 413 and f"the form has {too_big} bytes" in body
        status, body = _raw_post(base, "release", b"", "-5")
        assert status == 400 and "Content-Length" in body


def test_a_long_key_is_linked_by_its_digest_and_released_through_it(
    redis_server: RedisServer, locks: Any
) -> None:
    name = "long.job:" + "x" * 70_000
    assert LockSpace(locks).named(name).take("task-long", 60, state="queued").acquired
    key = LockSpace(locks).keys(name).lock
    with served(page(redis_server)) as base:
        client = Client(base)
        (row,) = table_rows(client.get("./").body, "locks")
        assert row["data-key"] == key
        assert len(row["@detail"]) < 100 and len(row["@release"]) < 100
        detail = client.get(row["@detail"])
        assert detail.status == 200 and text_of(detail.body, "data-field", "key") == key
        done = client.confirm(row["@release"], token=TOKEN)
        assert done.status == 303, done.body[:300]
        assert client.get(row["@detail"]).status == 404
    assert not LockSpace(locks).inspect(key).held


def test_anything_unexpected_is_the_pages_own_500_with_its_headers(
    redis_server: RedisServer, locks: Any
) -> None:
    def broken(environ: dict[str, Any]) -> bool:
        raise RuntimeError("the site's own access check failed")

    with served(page(redis_server, access=CallableAccess(broken))) as base:
        reply = Client(base).get("./")
    assert reply.status == 500
    assert "the page failed unexpectedly" in (text_of(reply.body, "id", "error") or "")
    assert reply.headers["Cache-Control"] == "no-store"
    assert reply.headers["X-Frame-Options"] == "DENY"


@pytest.mark.parametrize(
    "pattern", ["{task_id}", "javascript:{task_id}", "//evil.example/{task_id}", "http://{task_id}"]
)
def test_a_link_pattern_must_be_a_url_or_a_path(pattern: str) -> None:
    with pytest.raises(ValueError, match=r"^link_pattern must be an http:// or https:// URL"):
        make_app(url="redis://127.0.0.1:1/0", link_pattern=pattern)
    assert make_app(url="redis://127.0.0.1:1/0", link_pattern="/flower/task/{task_id}")


def test_the_holders_link_percent_encodes_the_task_id(
    redis_server: RedisServer, locks: Any
) -> None:
    task_id = 'javascript:alert(1)//"/../x?y=1#z'
    info = '{"task": "link.job", "id": "x", "host": "w1", "pid": 1}'
    assert LockSpace(locks).named("link.job:1").take(task_id, 60, info=info).acquired
    with served(page(redis_server, link_pattern="http://flower:5555/task/{task_id}")) as base:
        client = Client(base)
        (row,) = table_rows(client.get("./").body, "locks")
        body = client.get(row["@detail"]).body
    href = body.split('class="holder-link" href="', 1)[1].split('"', 1)[0]
    assert href == "http://flower:5555/task/" + quote(task_id, safe="")
    assert "/task/javascript%3Aalert%281%29%2F%2F%22%2F..%2Fx%3Fy%3D1%23z" in href


def test_the_banner_shows_only_what_the_page_did(redis_server: RedisServer, locks: Any) -> None:
    assert LockSpace(locks).named("banner.job:1").take("task-1", 60).acquired
    with served(page(redis_server)) as base:
        client = Client(base)
        crafted = client.get("./?done=released%3AYour%20account%20is%20locked%3A%20call%20us")
        assert crafted.status == 200 and text_of(crafted.body, "id", "message") is None
        client.cookies["csl_done"] = "WyJyZWxlYXNlZCIsICJ5b3UgYXJlIGhhY2tlZCJd.0123456789abcdef"
        assert text_of(client.get("./").body, "id", "message") is None
        del client.cookies["csl_done"]
        (row,) = table_rows(client.get("./").body, "locks")
        assert client.confirm(row["@release"], token=TOKEN).status == 303
        shown = client.get("./")
        assert text_of(shown.body, "id", "message") == "Released lock:{banner.job:1}."
        assert text_of(client.get("./").body, "id", "message") is None  # shown once
