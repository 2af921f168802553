"""Screenshots of the locks page for the docs (run by ``scripts/screenshots``): a real
deployment as the browser tests start it (``tests/web_world.py``: a redis-server, a worker, a
beat with the leader scheduler, ``celery locks web``), a realistic set of locks taken by real
task calls, and headless Chromium (``tests/browser_fixtures.py``) writing
``docs/img/web-list.png`` (the list) and ``docs/img/web-lock.png`` (the running job's page).
"""

from __future__ import annotations

import sys
import tempfile
import time
import urllib.parse
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "tests"), str(ROOT)]

from browser_fixtures import missing_browser, open_browser  # noqa: E402
from lock_helpers import server_time, wait_until  # noqa: E402
from web_world import World, locks_world, populate  # noqa: E402

OUT = ROOT / "docs" / "img"
#: a PNG larger than this is refused (the docs' images stay small)
MAX_BYTES = 300 * 1024
#: where the holder's task id links to, as a deployment with Flower would set it
LINK = "http://flower.internal:5555/task/{task_id}"


def aged(world: World, key: str, seconds: float) -> bool:
    """Whether ``key`` has been held ``seconds`` by Redis's clock (the screenshot shows ages
    that read as a running system's, not all 0.0 s)."""
    state = world.space.inspect(key)
    return state.since is not None and server_time(world.space.client) - state.since >= seconds


def main() -> int:
    problem = missing_browser()
    if problem:
        print(f"scripts/screenshots: {problem}", file=sys.stderr)
        return 1
    OUT.mkdir(parents=True, exist_ok=True)
    with (
        tempfile.TemporaryDirectory(prefix="csl-screenshots-") as tmp,
        locks_world(Path(tmp), web_args=("--link-pattern", LINK)) as world,
    ):
        populate(world)
        running = world.key("fault.web_work", world.jobs["running"])
        wait_until(lambda: aged(world, running, 4.0), 30, "the locks to age a little", 0.2)
        with open_browser() as browser:
            started = time.monotonic()
            browser.get(world.web.url)
            browser.screenshot(OUT / "web-list.png")
            browser.get(world.web.url + "lock?" + urllib.parse.urlencode({"key": running}))
            browser.screenshot(OUT / "web-lock.png")
            foreign = browser.foreign_requests(world.web.url)
            took = time.monotonic() - started
    if foreign:
        print(f"scripts/screenshots: the page requested other origins: {foreign}", file=sys.stderr)
        return 1
    for name in ("web-list.png", "web-lock.png"):
        size = (OUT / name).stat().st_size
        print(f"scripts/screenshots: wrote docs/img/{name} ({size // 1024} KB)")
        if size > MAX_BYTES:
            print(f"scripts/screenshots: docs/img/{name} is over 300 KB", file=sys.stderr)
            return 1
    print(f"scripts/screenshots: two pages drawn in {took:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
