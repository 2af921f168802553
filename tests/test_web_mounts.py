"""The locks page mounted in a Flask app (its own session login) and a Django project (auth,
staff only), and served by ``celery locks web``: each over real HTTP on a real redis-server."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import flask
import pytest
from celery import Celery
from celery_fixtures import DB_LOCKS, configure, new_app
from celery_procs import ROOT, close_app
from lock_helpers import START_TIMEOUT, wait_until
from web_helpers import Client, served, table_rows, text_of

from celery_singleton_lock import LockSpace
from celery_singleton_lock.testing import RedisServer
from celery_singleton_lock.web.flask import blueprint


def hold(client: Any, name: str, owner: str) -> None:
    info = json.dumps({"task": "proj.job", "id": owner, "host": "w1", "pid": 1})
    assert LockSpace(client).named(name).take(owner, 60, state="running", info=info).acquired


def held_by(client: Any, key: str) -> str | None:
    return LockSpace(client).inspect(key).holder


@pytest.fixture
def celery_app(redis_server: RedisServer) -> Iterator[Celery]:
    made = new_app("webmount")
    configure(made, redis_server)
    yield made
    close_app(made)


def flask_site(celery_app: Celery) -> flask.Flask:
    """A Flask app with its own login (the user in its session): alice may release, bob may
    only look, nobody else sees the page."""
    site = flask.Flask("webmount")
    site.secret_key = "web-tests-only"

    @site.route("/login/<user>")
    def login(user: str) -> str:
        flask.session["user"] = user
        return "ok"

    bp = blueprint(
        celery_app,
        can_view=lambda: flask.session.get("user") in ("alice", "bob"),
        can_change=lambda: flask.session.get("user") == "alice",
        actor=lambda: str(flask.session.get("user")),
        refresh=0,
    )
    site.register_blueprint(bp, url_prefix="/locks")
    return site


def test_flask_blueprint_behind_the_apps_own_login(
    celery_app: Celery, locks: Any, caplog: pytest.LogCaptureFixture
) -> None:
    hold(locks, "proj.job:1", "task-1")
    with served(flask_site(celery_app)) as base:
        anonymous = Client(base)
        assert anonymous.get("locks/").status == 403
        bob, alice = Client(base), Client(base)
        assert bob.get("login/bob").status == 200 and alice.get("login/alice").status == 200

        seen = bob.get("locks/")
        assert seen.status == 200 and 'class="release"' not in seen.body
        (row,) = table_rows(seen.body, "locks")
        assert row["data-key"] == "lock:{proj.job:1}"
        assert bob.get("locks/" + row["@detail"]).status == 200
        assert bob.get("locks/release?key=lock%3A%7Bproj.job%3A1%7D").status == 403
        bob_form = {"key": "lock:{proj.job:1}", "csrf": bob.cookies["csl_csrf"]}
        assert bob.post("locks/release", bob_form).status == 403
        assert held_by(locks, "lock:{proj.job:1}") == "task-1"

        (row,) = table_rows(alice.get("locks/").body, "locks")
        done = alice.confirm("locks/" + row["@release"])
        assert done.status == 303 and done.headers["Location"] == "./"
        assert held_by(locks, "lock:{proj.job:1}") is None
        assert "csl_csrf" in alice.cookies
    assert any("alice" in r.getMessage() for r in caplog.records if r.name.endswith(".web"))


@pytest.fixture
def django_site(redis_server: RedisServer, tmp_path: Path) -> Iterator[str]:
    """The webproj Django project served by a subprocess; yields its base URL."""
    env = {
        **os.environ,
        "CSL_WEB_REDIS": f"redis://127.0.0.1:{redis_server.port}",
        "CSL_WEB_DB": str(tmp_path / "db.sqlite3"),
        "PYTHONPATH": os.pathsep.join([str(ROOT / "tests"), str(ROOT)]),
        "PYTHONUNBUFFERED": "1",
    }
    log = tmp_path / "django.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "webproj.serve"], env=env, stdout=out, stderr=subprocess.STDOUT
        )
    try:

        def port() -> str | None:
            found = re.search(r"serving on (\d+)", log.read_text())
            assert proc.poll() is None, log.read_text()
            return found and found.group(1)

        yield f"http://127.0.0.1:{wait_until(port, START_TIMEOUT, 'the Django project to serve')}/"
    finally:
        proc.terminate()
        proc.wait(10)
        print(log.read_text()[-5000:])  # shown when the test fails


def test_django_staff_only(django_site: str, locks: Any) -> None:
    hold(locks, "proj.job:2", "task-2")
    anonymous = Client(django_site)
    sent = anonymous.get("locks/")
    assert sent.status == 302
    assert sent.headers["Location"].startswith("/accounts/login/?next=/locks/")

    viewer = Client(django_site)
    assert viewer.post("accounts/login/", {"username": "viewer", "password": "pw"}).status == 302
    refused = viewer.get("locks/")
    assert refused.status == 403 and text_of(refused.body, "id", "error")

    staff = Client(django_site)
    assert staff.post("accounts/login/", {"username": "staff", "password": "pw"}).status == 302
    page = staff.get("locks/")
    assert page.status == 200
    (row,) = table_rows(page.body, "locks")
    assert row["data-key"] == "lock:{proj.job:2}" and "@release" in row
    viewer_form = {"key": "lock:{proj.job:2}", "csrf": viewer.cookies.get("csl_csrf", "x")}
    assert viewer.post("locks/release", viewer_form).status == 403
    no_csrf = staff.post("locks/release", {"key": "lock:{proj.job:2}"})
    assert no_csrf.status == 403
    assert held_by(locks, "lock:{proj.job:2}") == "task-2"
    done = staff.confirm("locks/" + row["@release"])
    assert done.status == 303
    assert held_by(locks, "lock:{proj.job:2}") is None


def _serve(args: list[str], tmp_path: Path, **env: str) -> Iterator[tuple[str, Path]]:
    log = tmp_path / "web.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, *args, "--port", "0"],
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT), **env},
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:

        def url() -> str | None:
            found = re.search(r"served on (http://\S+/)", log.read_text())
            assert proc.poll() is None, log.read_text()
            return found and found.group(1)

        yield wait_until(url, START_TIMEOUT, "the locks page to be served"), log
    finally:
        proc.terminate()
        proc.wait(10)


#: a web token as the command accepts it (16 characters or more)
TOKEN = "tok-tok-tok-tok-tok"


def test_the_celery_locks_web_command(
    redis_server: RedisServer, locks: Any, tmp_path: Path
) -> None:
    """`celery -A app locks web` on loopback; the token comes from the environment only."""
    hold(locks, "proj.job:3", "task-3")
    args = ["-m", "celery", "-A", "tests.faultapp", "locks", "web", "--refresh", "0"]
    env = {"CSL_FAULT_REDIS": f"redis://127.0.0.1:{redis_server.port}"}
    env["CELERY_SINGLETON_LOCK_WEB_TOKEN"] = TOKEN
    for base, log in _serve(args, tmp_path, **env):
        assert base.startswith("http://127.0.0.1:")
        client = Client(base)
        page = client.get("./")
        (row,) = table_rows(page.body, "locks")
        assert row["data-key"] == "lock:{proj.job:3}" and "@release" in row
        assert client.confirm(row["@release"], token="nope").status == 403
        assert client.confirm(row["@release"], token=TOKEN).status == 303
        assert held_by(locks, "lock:{proj.job:3}") is None
        assert "released by holder of the web token from 127.0.0.1" in log.read_text()


def test_python_m_web_with_a_url_is_read_only_without_a_token(
    redis_server: RedisServer, locks: Any, tmp_path: Path
) -> None:
    hold(locks, "proj.job:4", "task-4")
    url = f"redis://127.0.0.1:{redis_server.port}/{DB_LOCKS}"
    env = {"CELERY_SINGLETON_LOCK_WEB_TOKEN": ""}
    for base, log in _serve(["-m", "celery_singleton_lock", "--url", url, "web"], tmp_path, **env):
        page = Client(base).get("./")
        assert [r["data-key"] for r in table_rows(page.body, "locks")] == ["lock:{proj.job:4}"]
        assert 'class="release"' not in page.body
        assert "read-only" in log.read_text()


def test_the_mounts_refuse_a_name_their_framework_does_not_serve(
    django_site: str, celery_app: Celery, locks: Any
) -> None:
    """A rebinding site's name: Django's ALLOWED_HOSTS and Flask's TRUSTED_HOSTS apply to the
    page whatever the project's middleware (400, nothing read)."""
    hold(locks, "proj.job:5", "task-5")
    evil = {"Host": "evil.example"}
    staff = Client(django_site)
    assert staff.post("accounts/login/", {"username": "staff", "password": "pw"}).status == 302
    assert staff.get("locks/").status == 200
    refused = staff.request("GET", "locks/", headers=evil)
    assert refused.status == 400 and "proj.job:5" not in refused.body
    site = flask_site(celery_app)
    site.config["TRUSTED_HOSTS"] = ["127.0.0.1"]
    with served(site) as base:
        alice = Client(base)
        assert alice.get("login/alice").status == 200
        assert alice.get("locks/").status == 200
        refused = alice.request("GET", "locks/", headers=evil)
        assert refused.status == 400 and "proj.job:5" not in refused.body
    assert held_by(locks, "lock:{proj.job:5}") == "task-5"
