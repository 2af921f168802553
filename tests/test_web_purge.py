"""What the page's release and purge promise, on a real redis-server over real HTTP: the purge
filtered by a state frees the locks in that state only, checked in Redis with the release (a
run that started since the page's read keeps its lock, as with ``celery locks purge
--queued``); a release frees the lock only from the holder its confirm page showed."""

from __future__ import annotations

import json
from typing import Any

from celery_fixtures import DB_LOCKS
from web_helpers import Client, served, table_rows, text_of

from celery_singleton_lock import LockSpace
from celery_singleton_lock.testing import RedisServer
from celery_singleton_lock.web import LocksWeb, TokenAccess, make_app
from celery_singleton_lock.web.data import matches

TOKEN = "a-token-of-twenty-chars"


def page(redis_server: RedisServer) -> LocksWeb:
    url = f"redis://127.0.0.1:{redis_server.port}/{DB_LOCKS}"
    return make_app(url=url, access=TokenAccess(TOKEN), refresh=0)


def take(client: Any, name: str, owner: str, state: str) -> None:
    info = json.dumps({"task": "purge.sync", "id": owner, "host": "w1", "pid": 1})
    assert LockSpace(client).named(name).take(owner, 60, state=state, info=info).acquired


def test_a_purge_of_one_state_frees_that_state_only(redis_server: RedisServer, locks: Any) -> None:
    take(locks, "purge.sync:1", "t1", "queued")
    take(locks, "purge.sync:2", "t2", "running")
    take(locks, "purge.sync:3", "t3", "cooldown")
    with served(page(redis_server)) as base:
        client = Client(base)
        confirm = client.get("purge?q=purge.sync&state=queued")
        assert text_of(confirm.body, "id", "count") == "1"
        done = client.confirm("purge?q=purge.sync&state=queued", token=TOKEN)
        assert done.status == 303
        after = client.get("./?q=purge.sync")
        assert text_of(after.body, "id", "message") == "Released 1 lock(s)."
        left = {r["data-key"]: r["data-state"] for r in table_rows(after.body, "locks")}
    assert left == {"lock:{purge.sync:2}": "running", "lock:{purge.sync:3}": "cooldown"}


def test_a_purge_keeps_a_lock_whose_state_changed_since_the_read(
    redis_server: RedisServer, locks: Any
) -> None:
    """The page read the lock queued; its run started (same holder, now running) before the
    purge reached it: the state is checked in Redis, in the same step as the release."""
    take(locks, "purge.sync:4", "t4", "queued")
    source = page(redis_server).source
    read = [v for v in source.read(fresh=True).locks if matches(v, "", "queued")]
    assert [v.key for v in read] == ["lock:{purge.sync:4}"]
    take(locks, "purge.sync:4", "t4", "running")  # the run entered: the same holder
    assert source.purge(read, "queued") == 0
    held = LockSpace(locks).inspect("lock:{purge.sync:4}")
    assert (held.holder, held.state) == ("t4", "running")


def test_a_release_confirmed_for_one_holder_does_not_free_the_next(
    redis_server: RedisServer, locks: Any
) -> None:
    take(locks, "purge.job:1", "holder-a", "running")
    with served(page(redis_server)) as base:
        client = Client(base)
        confirm = client.get("release?key=lock%3A%7Bpurge.job%3A1%7D")
        form = dict(confirm.forms()["confirm"])
        assert form["holder"] == "holder-a"
        # A lets go, B takes the lock, then the operator posts the form A's page showed
        assert LockSpace(locks).named("purge.job:1").release("holder-a").freed
        take(locks, "purge.job:1", "holder-b", "running")
        form.pop("@action"), form.pop("@method")
        done = client.post("release", {**form, "token": TOKEN})
        assert done.status == 303
        after = client.get("./")
        assert text_of(after.body, "id", "message") == "lock:{purge.job:1} was not held: " + (
            "nothing released."
        )
    assert LockSpace(locks).inspect("lock:{purge.job:1}").holder == "holder-b"
