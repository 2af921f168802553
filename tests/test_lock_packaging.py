"""The wheel: built from this checkout, installed (with its dependencies) into a fresh venv, and
used there to take a lock, its Lua scripts loaded from the installed package."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _run(*cmd: str | Path, cwd: Path, timeout: float = 300) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    done = subprocess.run(
        [str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )
    assert done.returncode == 0, f"{cmd} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout


@pytest.mark.slow  # about 10 s with a warm pip cache; more when pip has to download
@pytest.mark.timeout(600)
def test_the_wheel_installs_and_takes_a_lock(tmp_path: Path, redis_server: Any) -> None:
    _run(sys.executable, "-m", "build", "--wheel", "--outdir", tmp_path / "dist", ROOT, cwd=ROOT)
    (wheel,) = (tmp_path / "dist").glob("celery_singleton_lock-*.whl")

    names = set(zipfile.ZipFile(wheel).namelist())
    assert "celery_singleton_lock/py.typed" in names
    for script in (ROOT / "lua").glob("*.lua"):
        assert f"celery_singleton_lock/lua/{script.name}" in names

    venv = tmp_path / "venv"
    _run(sys.executable, "-m", "venv", venv, cwd=tmp_path)
    python = venv / "bin" / "python"
    _run(python, "-m", "pip", "install", "--disable-pip-version-check", "-q", wheel, cwd=tmp_path)

    snippet = textwrap.dedent(
        f"""
        import pathlib, sys, sysconfig
        from importlib import resources

        import redis
        import celery_singleton_lock
        from celery_singleton_lock import ReentrantLock, _scripts

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
    out = _run(python, "-c", snippet, cwd=tmp_path, timeout=60)
    assert out.startswith("ok ")
    assert str(venv.resolve()) in out
