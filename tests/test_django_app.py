"""A Django project as a new user makes it: ``django-admin startproject``, Celery set up as
docs/django.md shows (its ``proj/celery.py``, ``proj/__init__.py`` and settings lines, read from
the page), and the package in ``INSTALLED_APPS``. ``manage.py check`` reports a misspelt setting
(E001); the locks page sends a visitor who is not logged in to the admin's login (the project
serves nothing at the default ``LOGIN_URL``), and :func:`add_to_admin` serves it inside the
admin, linked from the admin's index. Real processes: ``manage.py``, and a script that drives
the project's own URLs and middleware through Django's test client.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from celery_fixtures import own_redis_server
from celery_procs import redis_base

from celery_singleton_lock.testing import RedisServer

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "django.md"


def docs_file(first_line: str) -> str:
    """The python block of docs/django.md whose first line is ``# <first_line>``, without it."""
    found = re.search(
        rf"```python\n# {re.escape(first_line)}\n(.*?)```", PAGE.read_text(), re.DOTALL
    )
    assert found, f"docs/django.md shows no {first_line}"
    return found.group(1)


@pytest.fixture(scope="module")
def server() -> Iterator[RedisServer]:
    with own_redis_server() as server:
        yield server


def _run(project: Path, args: list[str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT)
    env["PYTHONUNBUFFERED"] = "1"
    env.pop("DJANGO_SETTINGS_MODULE", None)
    return subprocess.run(
        [sys.executable, *args],
        cwd=project,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def make_project(
    where: Path, server: RedisServer | None, settings: str = "", urls: str = ""
) -> Path:
    """``django-admin startproject proj`` in ``where``, with docs/django.md's three files (its
    settings lines pointed at ``server``), ``settings`` and ``urls`` appended to the project's."""
    where.mkdir(parents=True, exist_ok=True)
    done = _run(where, ["-m", "django", "startproject", "proj", "."])
    assert done.returncode == 0, done.stderr
    package = where / "proj"
    (package / "celery.py").write_text(docs_file("proj/celery.py"))
    (package / "__init__.py").write_text(docs_file("proj/__init__.py"))
    redis_url = redis_base(server.port) if server else "redis://127.0.0.1:1"
    documented = docs_file("proj/settings.py (added to what startproject wrote)").replace(
        "redis://127.0.0.1:6379", redis_url
    )
    with open(package / "settings.py", "a") as out:
        out.write("\n" + documented + "\n" + textwrap.dedent(settings))
    with open(package / "urls.py", "a") as out:
        out.write("\n" + textwrap.dedent(urls))
    return where


def test_manage_py_check_reports_a_misspelt_setting_of_an_installed_app(tmp_path: Path) -> None:
    """What docs/django.md and configuration.md say registers the check is what does."""
    configuration = " ".join((ROOT / "docs" / "configuration.md").read_text().split())
    assert "`celery_singleton_lock.E001` once the package is in `INSTALLED_APPS`" in configuration
    project = make_project(tmp_path, None)
    done = _run(project, ["manage.py", "check"])
    assert done.returncode == 0, done.stderr
    assert "no issues" in done.stdout

    with open(project / "proj" / "settings.py", "a") as out:
        out.write("CELERY_SINGLETON_LOCK_TIMEOUT = 30\n")
    done = _run(project, ["manage.py", "check"])
    assert done.returncode != 0
    assert "(celery_singleton_lock.E001) CELERY_SINGLETON_LOCK_TIMEOUT is not a " in done.stderr


#: run in the project: migrate, a staff user, then the requests of ``STEPS`` (a JSON list of
#: ``[who, path]``, who is "anonymous" or "staff"), each answer's status, Location and body
PROBE = """
import json, os, sys
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "proj.settings")
import django
django.setup()
from django.contrib.auth.models import User
from django.core.management import call_command
from django.test import Client
call_command("migrate", verbosity=0)
staff = User.objects.create_user("staff", password="pw", is_staff=True)
answers = []
for who, path in json.loads(sys.argv[1]):
    client = Client(HTTP_HOST="localhost")
    if who == "staff":
        client.force_login(staff)
    got = client.get(path)
    answers.append(
        {"status": got.status_code, "location": got.get("Location"),
         "body": got.content.decode(errors="replace")}
    )
print("ANSWERS " + json.dumps(answers))
"""


def probe(project: Path, steps: list[tuple[str, str]]) -> list[dict[str, Any]]:
    (project / "probe.py").write_text(PROBE)
    done = _run(project, ["probe.py", json.dumps(steps)])
    assert done.returncode == 0, done.stderr
    found = re.search(r"^ANSWERS (.*)$", done.stdout, re.MULTILINE)
    assert found, done.stdout + done.stderr
    answers: list[dict[str, Any]] = json.loads(found.group(1))
    return answers


def test_a_visitor_not_logged_in_is_sent_to_the_admin_login(
    tmp_path: Path, server: RedisServer
) -> None:
    """A fresh project has the admin but nothing at Django's default ``/accounts/login/``."""
    project = make_project(
        tmp_path,
        server,
        urls="""\
        from django.urls import include
        urlpatterns.append(path("locks/", include("celery_singleton_lock.web.django")))
        """,
    )
    sent, login = probe(project, [("anonymous", "/locks/"), ("anonymous", "/admin/login/")])
    assert sent["status"] == 302
    assert sent["location"] == "/admin/login/?next=/locks/"
    assert login["status"] == 200


@pytest.mark.parametrize("admin_first", [True, False], ids=["admin-first", "admin-last"])
def test_add_to_admin_serves_the_page_under_the_admin_linked_from_its_index(
    tmp_path: Path, server: RedisServer, admin_first: bool
) -> None:
    """``add_to_admin()`` in urls.py: the page at ``admin/locks/`` whatever the order of the
    project's patterns (the admin's catch-all view comes after it), linked on the admin's
    index for staff, a visitor not logged in sent to the admin's login."""
    other = 'path("other/", include("celery_singleton_lock.web.django"))'
    patterns = (
        f'[path("admin/", admin.site.urls), {other}]'
        if admin_first
        else f'[{other}, path("admin/", admin.site.urls)]'
    )
    project = make_project(
        tmp_path,
        server,
        urls=f"""\
        from django.urls import include
        from celery_singleton_lock.web.django import add_to_admin
        add_to_admin()
        add_to_admin()  # a second call (urls.py imported again) adds nothing
        urlpatterns = {patterns}
        """,
    )
    sent, index, page = probe(
        project, [("anonymous", "/admin/locks/"), ("staff", "/admin/"), ("staff", "/admin/locks/")]
    )
    assert sent["status"] == 302
    assert sent["location"] == "/admin/login/?next=/admin/locks/"
    assert index["status"] == 200
    assert 'href="/admin/locks/"' in index["body"]
    assert index["body"].count('class="app-celery_singleton_lock module') == 1
    assert page["status"] == 200, page["body"][-3000:]
    assert "<title>Locks - celery-singleton-lock</title>" in page["body"]
