"""The wheel: built from this checkout once per module, installed (with its dependencies, and
nothing else) into a fresh venv, and used there: to take a lock, its Lua scripts loaded from the
installed package, and to run a real ``celery worker`` on a Redis broker, as the README's
install and Celery sections tell users to."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import textwrap
import urllib.request
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from lock_helpers import START_TIMEOUT, wait_until

from celery_singleton_lock._errors import install_hint
from celery_singleton_lock.testing import RedisServer

ROOT = Path(__file__).resolve().parents[1]


def _env() -> dict[str, str]:
    """This process's environment without the variables that would reach outside the venv."""
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}


def _run(*cmd: str | Path, cwd: Path, timeout: float = 300) -> str:
    done = subprocess.run(
        [str(c) for c in cmd], cwd=cwd, env=_env(), capture_output=True, text=True, timeout=timeout
    )
    assert done.returncode == 0, f"{cmd} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout


@dataclass(frozen=True)
class InstalledWheel:
    wheel: Path
    venv: Path

    @property
    def bin(self) -> Path:
        return self.venv / "bin"

    @property
    def python(self) -> Path:
        return self.bin / "python"


@pytest.fixture(scope="module")
def installed_wheel(tmp_path_factory: pytest.TempPathFactory) -> InstalledWheel:
    """The wheel built from this checkout, installed alone (``pip install <wheel>``: the wheel
    and the dependencies it declares, no pytest, no build) into a fresh venv. Built once for
    the module."""
    base = tmp_path_factory.mktemp("wheel")
    _run(sys.executable, "-m", "build", "--wheel", "--outdir", base / "dist", ROOT, cwd=ROOT)
    (wheel,) = (base / "dist").glob("celery_singleton_lock-*.whl")

    venv = base / "venv"
    _run(sys.executable, "-m", "venv", venv, cwd=base)
    installed = InstalledWheel(wheel=wheel, venv=venv)
    pip = (installed.python, "-m", "pip", "install", "--disable-pip-version-check", "-q")
    _run(*pip, wheel, cwd=base)
    # Nothing that the test tools would have brought in by chance (pytest and build both
    # install `packaging`, which kombu's Redis transport imports).
    _run(
        installed.python,
        "-c",
        "import importlib.util as u; assert u.find_spec('pytest') is None, 'pytest';"
        " assert u.find_spec('build') is None, 'build'",
        cwd=base,
    )
    return installed


@pytest.mark.slow  # about 10 s with a warm pip cache (the build and install of the fixture)
@pytest.mark.timeout(600)
def test_the_wheel_installs_and_takes_a_lock(
    tmp_path: Path, redis_server: Any, installed_wheel: InstalledWheel
) -> None:
    wheel, venv, python = installed_wheel.wheel, installed_wheel.venv, installed_wheel.python

    names = set(zipfile.ZipFile(wheel).namelist())
    assert "celery_singleton_lock/py.typed" in names
    for script in (ROOT / "lua").glob("*.lua"):
        assert f"celery_singleton_lock/lua/{script.name}" in names

    snippet = textwrap.dedent(
        f"""
        import pathlib, sys, sysconfig
        from importlib import resources

        import redis
        import celery_singleton_lock
        from celery_singleton_lock import ReentrantLock
        from celery_singleton_lock._lock import scripts as _scripts

        site = pathlib.Path(sysconfig.get_paths()["purelib"]).resolve()
        assert not any(p.startswith({str(ROOT)!r}) for p in sys.path), sys.path
        assert site in pathlib.Path(celery_singleton_lock.__file__).resolve().parents
        scripts = pathlib.Path(str(resources.files("celery_singleton_lock").joinpath("lua")))
        assert site in scripts.resolve().parents, scripts
        assert _scripts.ACQUIRE.source == (scripts / "acquire.lua").read_text(encoding="utf-8")

        client = redis.Redis(port={redis_server.port}, socket_timeout=10)
        lock = ReentrantLock(client, "from-the-wheel", ttl=5)
        assert lock.acquire(blocking=False)
        assert client.hget(lock.key, lock.owner) == b"1"
        fence = lock.fence
        lock.release()
        assert client.exists(lock.key) == 0
        print("ok", scripts, fence)
        """
    )
    out = _run(python, "-c", snippet, cwd=tmp_path, timeout=START_TIMEOUT)
    assert out.startswith("ok ")
    assert str(venv.resolve()) in out


#: the user's module, as the README's Celery section writes it; {url} is the test's server
WHEEL_APP = """\
import time

from celery import Celery
from celery_singleton_lock import LockedTask

app = Celery("wheelapp", broker="{url}/0", backend="{url}/1")
app.conf.singleton_lock_redis_url = "{url}/2"
app.conf.task_default_queue = "wheelapp"  # a queue of its own on the shared server


@app.task(base=LockedTask)
def add(x, y):
    return x + y


@app.task(base=LockedTask, lock_at="publish")
def digest(user_id, day):
    time.sleep(1)  # still running when the test checks the lock
    return f"{{user_id}}:{{day}}"


# celery-singleton and celery-once code with only the import changed
from celery_singleton_lock.compat.once import QueueOnce
from celery_singleton_lock.compat.singleton import Singleton


@app.task(base=Singleton, unique_on=["user_id"])
def report(user_id, note):
    time.sleep(1)  # the body's work
    return note


@app.task(base=QueueOnce, once={{"graceful": False}})
def rebuild(user_id):
    time.sleep(1)  # the body's work
    return user_id
"""

#: run in the venv next to the running worker: publishes, waits, checks the deduplication
PUBLISHER = """\
import pathlib, sysconfig, uuid

import celery_singleton_lock
from celery_singleton_lock.compat.once import AlreadyQueued
from wheelapp import add, digest, rebuild, report

site = pathlib.Path(sysconfig.get_paths()["purelib"]).resolve()
assert site in pathlib.Path(celery_singleton_lock.__file__).resolve().parents

assert add.delay(2, 3).get(timeout=30) == 5

user = uuid.uuid4().hex
first = digest.delay(user, "mon")
second = digest.delay(user, "mon")
assert second.id == first.id, (first.id, second.id)
assert digest.is_locked(user, "mon")
assert first.get(timeout=30) == f"{user}:mon"
assert not digest.is_locked(user, "mon")

first_report = report.delay(user, "a")
assert report.delay(user, "b").id == first_report.id
assert first_report.get(timeout=30) == "a"
first_rebuild = rebuild.delay(user)
try:
    rebuild.delay(user)
except AlreadyQueued as error:
    assert error.countdown > 0
else:
    raise AssertionError("no AlreadyQueued")
assert first_rebuild.get(timeout=30) == user
print("ok", first.id)
"""


def _stop(worker: subprocess.Popen[bytes], timeout: float = 20.0) -> None:
    """Warm shutdown (SIGTERM); SIGKILL to the worker's process group if it takes too long."""
    if worker.poll() is None:
        worker.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            worker.wait(timeout)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(worker.pid, signal.SIGKILL)  # whatever is left of its group
    worker.wait(10)


@contextlib.contextmanager
def _worker(
    installed: InstalledWheel, app_dir: Path, module: str
) -> Iterator[tuple[subprocess.Popen[bytes], Path, Path]]:
    """``celery -A module worker`` of the venv, run from ``app_dir`` with its output in files;
    stopped on exit."""
    out_path, err_path = app_dir / "worker.out", app_dir / "worker.err"
    cmd = [installed.bin / "celery", "-A", module, "worker", "--pool=solo", "--concurrency=1"]
    with open(out_path, "wb") as out, open(err_path, "wb") as err:
        worker = subprocess.Popen(
            [*map(str, cmd), "-l", "info"],
            cwd=app_dir,
            env=_env(),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=err,
            start_new_session=True,
        )
        try:
            yield worker, out_path, err_path
        finally:
            _stop(worker)


def _wait_ready(worker: subprocess.Popen[bytes], logs: tuple[Path, Path], timeout: float) -> bool:
    """Until the worker logs ``ready.``; False when it exits first or the time runs out."""

    def settled() -> str | None:
        if any(" ready." in path.read_text(errors="replace") for path in logs):
            return "ready"
        return "exited" if worker.poll() is not None else None

    try:
        return wait_until(settled, timeout, "the worker to be ready", 0.1) == "ready"
    except AssertionError:  # the time ran out: the caller reports the worker's logs
        return False


@pytest.mark.slow  # about 10 s more than the fixture: a worker's start and shutdown
@pytest.mark.timeout(600)
def test_the_wheel_alone_runs_a_worker_on_a_redis_broker(
    tmp_path: Path, redis_server: RedisServer, installed_wheel: InstalledWheel
) -> None:
    """``pip install celery-singleton-lock`` is all a Redis-broker worker needs: kombu's Redis
    transport imports what its ``redis`` extra declares (kombu 5.7 imports ``packaging``, which
    only that extra lists)."""
    url = f"redis://127.0.0.1:{redis_server.port}"
    (tmp_path / "wheelapp.py").write_text(WHEEL_APP.format(url=url), encoding="utf-8")

    publish: subprocess.CompletedProcess[str] | None = None
    with _worker(installed_wheel, tmp_path, "wheelapp") as (worker, out_path, err_path):
        ready = _wait_ready(worker, (out_path, err_path), timeout=START_TIMEOUT)
        if ready:
            publish = subprocess.run(
                [str(installed_wheel.python), "-c", PUBLISHER],
                cwd=tmp_path,
                env=_env(),
                capture_output=True,
                text=True,
                timeout=120,
            )
    exit_code = worker.returncode

    report = (
        f"worker ready: {ready}, exit code: {exit_code}\n"
        f"--- worker stdout ---\n{out_path.read_text(errors='replace')[-4000:]}\n"
        f"--- worker stderr ---\n{err_path.read_text(errors='replace')[-6000:]}"
    )
    if publish is not None:
        report += (
            f"\n--- publisher (exit {publish.returncode}) ---\n"
            f"{publish.stdout[-2000:]}\n{publish.stderr[-4000:]}"
        )
    assert ready, report
    assert publish is not None and publish.returncode == 0, report
    assert publish.stdout.startswith("ok "), report
    assert exit_code == 0, report  # the warm shutdown went through


@pytest.mark.slow  # a pip install of the web extra into the fixture's venv, and a server start
@pytest.mark.timeout(600)
def test_the_web_extra_is_what_the_locks_page_needs(
    tmp_path: Path, redis_server: RedisServer, installed_wheel: InstalledWheel
) -> None:
    """Without the ``web`` extra, ``celery locks web`` (with its options) names the extra to
    install; with it (``pip install 'celery-singleton-lock[web]'``), the command serves the
    page on loopback, read-only."""
    url = f"redis://127.0.0.1:{redis_server.port}"
    (tmp_path / "wheelapp.py").write_text(WHEEL_APP.format(url=url), encoding="utf-8")
    celery = str(installed_wheel.bin / "celery")
    command = [celery, "-A", "wheelapp", "locks", "web", "--port", "0"]
    without = subprocess.run(
        command, cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=START_TIMEOUT
    )
    assert without.returncode != 0
    assert install_hint("web") in " ".join(without.stderr.split()), without.stderr

    pip = (installed_wheel.python, "-m", "pip", "install", "--disable-pip-version-check", "-q")
    _run(*pip, f"{installed_wheel.wheel}[web]", cwd=tmp_path)
    log_path = tmp_path / "web.log"
    with open(log_path, "wb") as log:
        server = subprocess.Popen(
            command,
            cwd=tmp_path,
            env=_env(),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        served = wait_until(
            lambda: re.search(r"served on (http://127\.0\.0\.1:\d+/)", log_path.read_text()),
            60,
            "the page's address in the log",
            0.1,
        )
        with urllib.request.urlopen(served.group(1), timeout=10) as answer:
            page = answer.read().decode()
        assert 'id="locks"' in page, page[:2000]
        assert "read-only" in log_path.read_text()
        assert 'class="release"' not in page  # no token: nobody may release
    finally:
        _stop(server)
