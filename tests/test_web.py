"""The locks page (celery_singleton_lock.web) on a real redis-server, served by a real wsgiref
server in a thread and read over HTTP: what it lists, its filter, sort and paging, a lock's
page, release and purge behind a confirmation, and every refusal (which frees nothing)."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery
from celery_fixtures import DB_LOCKS, app_task, configure, new_app
from celery_procs import close_app
from web_helpers import Client, served, table_rows, text_of

from celery_singleton_lock import LockedTask, LockSpace, RateLimiter, ReentrantLock
from celery_singleton_lock.testing import RedisServer
from celery_singleton_lock.web import TokenAccess, make_app

app = new_app("webtest")


@app_task(app, base=LockedTask, name="webt.debounced", lock_at="publish", lock_debounce=60)
def debounced(n: int) -> int:
    return n


@app_task(app, base=LockedTask, name="webt.slots", lock_at="publish", lock_limit=3)
def slots(n: int) -> int:
    return n


TOKEN = "s3cret-token-for-tests"


def info(task: str, task_id: str, limit: int = 1) -> str:
    found: dict[str, Any] = {"task": task, "id": task_id, "host": "w1", "pid": 4242}
    return json.dumps({**found, "limit": limit} if limit > 1 else found)


@pytest.fixture(scope="module")
def web_app(redis_server: RedisServer) -> Iterator[Celery]:
    configure(app, redis_server)
    yield app
    close_app(app)


@pytest.fixture
def locks(redis_server: RedisServer, web_app: Celery) -> Iterator[Any]:
    """The lock database of the app, emptied first."""
    client = redis_server.client(db=DB_LOCKS)
    client.flushdb()
    yield client
    client.close()


def hold(client: Any, name: str, owner: str, *, state: str = "", task: str = "") -> Any:
    """A lock held in Redis for ``owner`` (no renewal here: a long lease)."""
    reply = (
        LockSpace(client)
        .named(name)
        .take(owner, 60, state=state, info=info(task, owner) if task else "")
    )
    assert reply.acquired
    return reply


def test_the_list_shows_locks_cooldowns_slots_limiters_and_beat_leaders(
    web_app: Celery, locks: Any
) -> None:
    running = ReentrantLock(
        locks, "webt.run:1", ttl=30, owner="task-1", info=info("webt.run", "task-1"),
        state="running",
    )  # fmt: skip
    assert running.acquire(blocking=False)
    hold(locks, "webt.cool:1", "task-2", state="cooldown", task="webt.cool")
    first, second = slots.delay(7), slots.delay(7)
    debounced.delay(1)
    limiter = RateLimiter(locks, "api", "5/m")
    assert limiter.try_acquire().admitted
    leader = ReentrantLock(
        locks,
        "beat:webtest",
        ttl=30,
        info=json.dumps({"task": "celery beat", "host": "b1", "pid": 4321}),
    )
    assert leader.acquire(blocking=False)
    try:
        with served(make_app(web_app, refresh=7)) as base:
            page = Client(base).get("./")
            assert page.status == 200
            assert '<meta http-equiv="refresh" content="7">' in page.body
            rows = {r["key"]: r for r in table_rows(page.body, "locks")}
            run = rows["lock:{webt.run:1}"]
            assert (run["state"], run["task"], run["holder"]) == ("running", "webt.run", "task-1")
            assert (run["host"], run["pid"], run["@detail"]) == (
                "w1",
                "4242",
                "lock?key=lock%3A%7Bwebt.run%3A1%7D",
            )
            assert rows["lock:{webt.cool:1}"]["state"] == "cooldown"
            assert rows["lock:{webt.cool:1}"]["lease"].endswith("s")
            slot_rows = [r for r in rows.values() if r["task"] == "webt.slots"]
            assert {r["holder"] for r in slot_rows} == {first.id, second.id}
            assert {r["slots"] for r in slot_rows} == {"2/3"}
            assert rows[debounced.lock_key_for(1)]["state"] == "debounced"
            assert "@release" not in run  # read-only: no token given
            # the beat leader's lock is held too, as `celery locks list` shows it
            assert rows["lock:{beat:webtest}"]["holder"] == leader.owner
            assert text_of(page.body, "id", "total") == str(len(rows)) == "6"
            (rate,) = table_rows(page.body, "limiters")
            assert (rate["key"], rate["used"], rate["rule"]) == ("lock:rate:{api}", "1/5", "5/m")
            (beat,) = table_rows(page.body, "beat")
            assert (beat["data-key"], beat["app"], beat["holder"]) == (
                "lock:{beat:webtest}", "webtest", leader.owner,
            )  # fmt: skip
            assert (beat["host"], beat["pid"]) == ("b1", "4321")
            for name in (
                "duplicates",
                "refusals-limit",
                "refusals-cooldown",
                "refusals-rate",
                "lost",
            ):
                assert text_of(page.body, "data-count", name) is not None
                assert text_of(page.body, "data-count", name).isdecimal()  # type: ignore[union-attr]
            assert 'id="purge"' not in page.body
    finally:
        running.release()
        leader.release()


def test_filter_sort_and_paging(web_app: Celery, locks: Any) -> None:
    space = LockSpace(locks)
    for i in range(7):  # their ages grow in this order: job 0 oldest
        assert space.named(f"webt.page:{i}").take(f"t{i}", 60, state="queued").acquired
        locks.time()  # (the next take is at a later server time)
    hold(locks, "other:1", "x1", state="running", task="webt.other")
    with served(make_app(web_app, page_size=3, refresh=0)) as base:
        client = Client(base)
        first = client.get("./?q=page")
        assert "http-equiv" not in first.body  # refresh=0: none
        keys = [r["key"] for r in table_rows(first.body, "locks")]
        assert text_of(first.body, "id", "total") == "7"
        assert keys == [f"lock:{{webt.page:{i}}}" for i in (0, 1, 2)]
        rows = table_rows(first.body, "locks")
        assert all(r["state"] == "queued" for r in rows)
        assert 'class="prev"' not in first.body and 'class="next"' in first.body
        last = client.get("./?q=page&page=3")
        assert [r["key"] for r in table_rows(last.body, "locks")] == ["lock:{webt.page:6}"]
        assert 'class="prev"' in last.body and 'class="next"' not in last.body
        newest = client.get("./?q=PAGE&sort=-age")
        assert table_rows(newest.body, "locks")[0]["key"] == "lock:{webt.page:6}"
        running = client.get("./?state=running")
        assert [r["key"] for r in table_rows(running.body, "locks")] == ["lock:{other:1}"]
        by_task = client.get("./?q=webt.other")
        assert [r["key"] for r in table_rows(by_task.body, "locks")] == ["lock:{other:1}"]
        only_limiters = client.get("./?state=limiter")
        assert table_rows(only_limiters.body, "locks") == []
        assert text_of(only_limiters.body, "id", "total") == "0"


@pytest.mark.parametrize(
    ("query", "named"),
    [
        ("page=abc", "page"),
        ("page=0", "page"),
        ("state=frozen", "state"),
        ("sort=name", "sort"),
    ],
)
def test_bad_query_is_a_400_naming_the_parameter(
    make_redis_server: Any, query: str, named: str
) -> None:
    server = make_redis_server()
    server.stop()  # a 400 comes before any Redis read: a stopped server is never reached
    with served(make_app(url=server.url)) as base:
        reply = Client(base).get(f"./?{query}")
    assert reply.status == 400
    error = text_of(reply.body, "id", "error")
    assert error is not None and error.startswith(f"{named} must be")


def test_a_down_redis_is_a_503_page(make_redis_server: Any) -> None:
    server = make_redis_server()
    server.stop()
    with served(make_app(url=server.url)) as base:
        reply = Client(base).get("./")
    assert reply.status == 503 and "Redis failed" in (text_of(reply.body, "id", "error") or "")


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"page_size": 0}, "page_size"),
        ({"refresh": -1}, "refresh"),
        ({"refresh": 1.5}, "refresh"),
        ({"link_pattern": "http://flower/task/"}, "link_pattern"),
        ({"link_pattern": "http://x/{task_id}/{other}"}, "link_pattern"),
        ({"prefixes": "lock"}, "prefixes"),
    ],
)
def test_bad_make_app_options_name_the_parameter(options: dict[str, Any], named: str) -> None:
    with pytest.raises(ValueError, match=f"^{named} must"):
        make_app(url="redis://127.0.0.1:1/0", **options)


def test_one_of_celery_app_or_url(web_app: Celery) -> None:
    with pytest.raises(ValueError, match="exactly one of celery_app or url"):
        make_app()
    with pytest.raises(ValueError, match="exactly one of celery_app or url"):
        make_app(web_app, url="redis://127.0.0.1:1/0")


def test_the_lock_page_says_everything_known(web_app: Celery, locks: Any) -> None:
    first, second = slots.delay(3), slots.delay(3)
    key = slots.lock_key_for(3)
    web = make_app(web_app, link_pattern="http://flower:5555/task/{task_id}")
    with served(web) as base:
        client = Client(base)
        listed = {r["holder"]: r for r in table_rows(client.get("./").body, "locks")}
        page = client.get(listed[first.id]["@detail"])
        assert page.status == 200
        fields = {
            f: text_of(page.body, "data-field", f)
            for f in ("task", "key", "state", "holder", "host", "pid", "fence", "holds", "age",
                      "lease", "slots", "result")
        }  # fmt: skip
        assert fields["task"] == "webt.slots" and fields["key"] == listed[first.id]["key"]
        assert fields["state"] == "queued" and fields["holder"] == first.id
        assert fields["slots"] == "2/3" and fields["result"] == "PENDING"
        assert fields["holds"] == "1" and (fields["fence"] or "").isdecimal()
        assert f'href="http://flower:5555/task/{first.id}"' in page.body
        (other,) = table_rows(page.body, "permits")
        assert other["holder"] == second.id
        assert {listed[first.id]["key"], other["key"]} <= {key, f"{key}:s2", f"{key}:s3"}

        gone = client.get("lock?key=lock%3A%7Bnothing%7D")
        assert gone.status == 404 and "not held" in (text_of(gone.body, "id", "error") or "")


def test_release_confirm_then_post_frees_the_lock(
    web_app: Celery, locks: Any, caplog: pytest.LogCaptureFixture
) -> None:
    hold(locks, "webt.job:1", "task-1", state="running", task="webt.job")
    with served(make_app(web_app, access=TokenAccess(TOKEN))) as base:
        client = Client(base)
        page = client.get("./")
        (row,) = table_rows(page.body, "locks")
        confirm = client.get(row["@release"])
        assert "lock:{webt.job:1}" in confirm.body and "task-1" in confirm.body
        assert 'type="password" name="token"' in confirm.body and 'id="do-release"' in confirm.body
        with caplog.at_level(logging.WARNING, "celery_singleton_lock.web"):
            done = client.confirm(row["@release"], token=TOKEN)
        assert done.status == 303 and done.headers["Location"] == "./"
        assert "done" not in done.headers["Location"] and "csl_done" in client.cookies
        after = client.get(done.headers["Location"])
        assert text_of(after.body, "id", "message") == "Released lock:{webt.job:1}."
        assert table_rows(after.body, "locks") == []
    assert LockSpace(locks).named("webt.job:1").take("next", 10).acquired  # free to take
    (record,) = [r for r in caplog.records if r.name == "celery_singleton_lock.web"]
    assert "holder of the web token" in record.getMessage()
    assert "127.0.0.1" in record.getMessage() and "lock:{webt.job:1}" in record.getMessage()


def test_release_resets_a_limiter(web_app: Celery, locks: Any) -> None:
    limiter = RateLimiter(locks, "api", "1/m")
    assert limiter.try_acquire().admitted and not limiter.try_acquire().admitted
    with served(make_app(web_app, access=TokenAccess(TOKEN))) as base:
        client = Client(base)
        (row,) = table_rows(client.get("./").body, "limiters")
        done = client.confirm(row["@release"], token=TOKEN)
        assert done.status == 303
        after = client.get(done.headers["Location"])
        assert "Reset the rate limiter" in (text_of(after.body, "id", "message") or "")
    assert limiter.try_acquire().admitted


@pytest.mark.parametrize(
    "attack", ["no-csrf", "wrong-csrf", "no-token", "wrong-token", "other-origin", "read-only"]
)
def test_refused_posts_free_nothing(web_app: Celery, locks: Any, attack: str) -> None:
    hold(locks, "webt.job:2", "task-2", state="running", task="webt.job")
    access = TokenAccess(None if attack == "read-only" else TOKEN)
    with served(make_app(web_app, access=access)) as base:
        client = Client(base)
        client.get("./")  # the CSRF cookie
        form = {"key": "lock:{webt.job:2}", "csrf": client.cookies["csl_csrf"], "token": TOKEN}
        headers: dict[str, str] = {}
        if attack == "no-csrf":
            del form["csrf"]
        elif attack == "wrong-csrf":
            form["csrf"] = "x" * 43
        elif attack == "no-token":
            del form["token"]
        elif attack == "wrong-token":
            form["token"] = "guess"
        elif attack == "other-origin":
            headers["Origin"] = "http://evil.example"
        reply = client.post("release", form, **headers)
        assert reply.status == 403, reply.body
        assert text_of(reply.body, "id", "error")
        purge = client.post("purge", {k: v for k, v in form.items() if k != "key"}, **headers)
        assert purge.status == 403
        if attack == "read-only":
            assert client.get("release?key=lock%3A%7Bwebt.job%3A2%7D").status == 403
            assert 'class="release"' not in client.get("./").body
    assert LockSpace(locks).inspect("lock:{webt.job:2}").holder == "task-2"


def test_purge_frees_the_matching_locks(web_app: Celery, locks: Any) -> None:
    for i in range(4):
        hold(locks, f"webt.sync:{i}", f"s{i}", state="queued", task="webt.sync")
    hold(locks, "webt.keep:1", "k1", state="running", task="webt.keep")
    with served(make_app(web_app, access=TokenAccess(TOKEN))) as base:
        client = Client(base)
        page = client.get("./?q=sync")
        href = page.body.split('id="purge" href="', 1)[1].split('"', 1)[0]
        assert href == "purge?q=sync"
        confirm = client.get(href)
        assert text_of(confirm.body, "id", "count") == "4" and 'id="do-purge"' in confirm.body
        done = client.confirm(href, token=TOKEN)
        assert done.status == 303 and done.headers["Location"] == "./"
        after = client.get("./")
        assert text_of(after.body, "id", "message") == "Released 4 lock(s)."
        keys = [r["key"] for r in table_rows(after.body, "locks")]
    assert keys == ["lock:{webt.keep:1}"]


def test_ten_thousand_locks_list_one_page_of_the_first_found(web_app: Celery, locks: Any) -> None:
    """The list reads at most ``max_locks`` locks (and says there are more), fast with
    10,000 held; a filter by text reads the keys that contain it, whichever Redis found first."""
    import time

    space = LockSpace(locks)
    with locks.pipeline(transaction=False) as pipe:
        for i in range(10_000):
            pipe.hset(f"lock:{{bulk:{i}}}", f"o{i}", 1)
            pipe.pexpire(f"lock:{{bulk:{i}}}", 120_000)
        pipe.execute()
    assert space.inspect("lock:{bulk:5}").held
    with served(make_app(web_app, page_size=50)) as base:
        client = Client(base)
        started = time.perf_counter()
        page = client.get("./?page=3")
        took = time.perf_counter() - started
        assert page.status == 200 and text_of(page.body, "id", "total") == "2000"
        assert text_of(page.body, "id", "more") == "+" and text_of(page.body, "id", "too-many")
        assert len(table_rows(page.body, "locks")) == 50
        assert len(page.body) < 100_000
        narrowed = client.get("./?q=BULK:77")  # bulk:77, bulk:770-779, bulk:7700-7799
        assert text_of(narrowed.body, "id", "total") == "111"
        assert text_of(narrowed.body, "id", "more") is None
        assert len(table_rows(narrowed.body, "locks")) == 50
    print(f"10,000 locks: the list page in {took:.2f} s")
