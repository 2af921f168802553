"""A real browser for the web page's tests: Debian's headless Chromium, driven by selenium
through the system's chromedriver, with every network request the page made kept for the test.

- :func:`open_browser`: a :class:`Browser` (a context manager; ``scripts/screenshots`` uses it
  too); :func:`browser` is the pytest fixture of it.
- :meth:`Browser.requests`: the URL of every request the pages made since the browser started
  (Chrome's performance log, ``Network.requestWillBeSent``), so a test can assert that none
  left the site's origin (:meth:`Browser.foreign_requests`).
- :meth:`Browser.page_width`: how wide the page is (``scrollWidth``), at a 1280 px window.

Without a browser the tests marked ``browser`` are skipped, each saying what is missing and how
to install it (:func:`skip_without_a_browser`, from ``conftest.py``): on a machine where
``scripts/test`` could not install Chromium (no root, no sudo) the rest of the suite still
passes. In CI (``CI=true``) they are never skipped: a missing browser fails them, saying the
same, since the page is only checked when a browser draws it.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import pytest

if TYPE_CHECKING:
    from selenium.webdriver.chrome.webdriver import WebDriver
    from selenium.webdriver.remote.webdriver import WebDriver as AnyDriver

#: Debian's packages (apt-get install chromium chromium-driver), what scripts/test installs
CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
#: the window the page must fit: never wider than this
WIDTH, HEIGHT = 1280, 900

#: Chromium's own traffic (updates, field trials, safe browsing) is off: what the performance
#: log shows is the page's, and a test needs no network beyond loopback.
_ARGS = (
    "--headless=new",
    f"--window-size={WIDTH},{HEIGHT}",
    # a container's root user has no user namespace for the sandbox, and a small /dev/shm
    "--no-sandbox",
    "--disable-dev-shm-usage",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-default-apps",
    "--disable-extensions",
    "--disable-sync",
    "--no-first-run",
    "--hide-scrollbars",
    "--force-device-scale-factor=1",
)


def missing_browser() -> str | None:
    """What is missing to drive a browser, with how to install it; ``None`` when nothing is."""
    missing = [str(p) for p in (CHROMIUM, CHROMEDRIVER) if not p.exists()]
    if missing:
        return (
            f"{' and '.join(missing)} not found: the browser tests drive Debian's Chromium "
            "through its chromedriver; install them with `apt-get install -y chromium "
            "chromium-driver` (scripts/test does when it runs as root or with sudo), or "
            "deselect these tests with -m 'not browser'"
        )
    try:
        import selenium  # noqa: F401 - only whether it is there
    except ImportError:
        return "selenium is not installed: pip install -e '.[test]' (the test extra brings it)"
    return None


def in_ci() -> bool:
    """Whether this run is CI's (``CI=true``, as CI services set it for ``.ci/run``)."""
    return os.environ.get("CI") == "true"


def skip_without_a_browser(items: list[pytest.Item]) -> None:
    """Mark the ``browser`` tests among ``items`` skipped, with what is missing and how to get
    it, when there is no browser to drive, unless in CI (there they run, and fail saying so).
    Marked before anything of theirs starts: no worker, beat or page is started for them."""
    browser_tests = [item for item in items if item.get_closest_marker("browser") is not None]
    if not browser_tests or in_ci():
        return
    problem = missing_browser()
    if problem is not None:
        skip = pytest.mark.skip(reason=f"no browser to drive: {problem}")
        for item in browser_tests:
            item.add_marker(skip)


class Browser:
    """One headless Chromium window, 1280 x 900, and the requests its pages made."""

    def __init__(self, driver: WebDriver) -> None:
        self.driver = driver
        self._requests: list[str] = []
        self._responses: list[tuple[str, int]] = []

    def get(self, url: str) -> None:
        """Open ``url`` and wait for it to load (selenium's ``get`` returns once it has)."""
        self.driver.get(url)

    def _read_log(self) -> None:
        """Move what Chromium logged since the last read (it hands each entry out once)."""
        # selenium's get_log has no type hints: its entries are dicts with a JSON "message"
        log: list[dict[str, Any]] = self.driver.get_log("performance")  # type: ignore[no-untyped-call]
        for entry in log:
            message = json.loads(entry["message"])["message"]
            params = message.get("params", {})
            if message.get("method") == "Network.requestWillBeSent":
                self._requests.append(str(params["request"]["url"]))
            elif message.get("method") == "Network.responseReceived":
                reply = params["response"]
                self._responses.append((str(reply["url"]), int(reply["status"])))

    def requests(self) -> list[str]:
        """Every URL the pages requested since the browser started, in order."""
        self._read_log()
        return list(self._requests)

    def responses(self) -> list[tuple[str, int]]:
        """(URL, HTTP status) of every response the pages got, in order (a redirect's 303 is
        not one: Chromium follows it before it reports a response)."""
        self._read_log()
        return list(self._responses)

    def foreign_requests(self, base: str) -> list[str]:
        """The requests that did not go to ``base``'s origin (scheme, host and port)."""
        origin = urlsplit(base)[:2]
        return [
            url
            for url in self.requests()
            if not url.startswith(("data:", "about:")) and urlsplit(url)[:2] != origin
        ]

    def page_width(self) -> int:
        """How wide the page is, in CSS pixels (its whole scrollable width, not the window's)."""
        return int(
            self.driver.execute_script(
                "return Math.max(document.documentElement.scrollWidth,"
                " document.body ? document.body.scrollWidth : 0)"
            )
        )

    def screenshot(self, path: Path) -> None:
        """The whole page (1280 wide, as tall as its content) as a PNG at ``path``: captured
        by Chromium beyond the window (DevTools ``Page.captureScreenshot``)."""
        height = int(
            self.driver.execute_script(
                "return Math.ceil(document.querySelector('main, body').getBoundingClientRect()"
                ".bottom + window.scrollY) + 16"
            )
        )
        clip = {"x": 0, "y": 0, "width": WIDTH, "height": min(height, 4000), "scale": 1}
        shot = self.driver.execute_cdp_cmd(
            "Page.captureScreenshot",
            {"format": "png", "captureBeyondViewport": True, "clip": clip},
        )
        path.write_bytes(base64.b64decode(shot["data"]))


def make_driver(extra_args: tuple[str, ...] = ()) -> WebDriver:
    """A headless Chromium driven by the system's chromedriver (selenium's own manager, which
    would download a browser, is never asked: both paths are given); ``extra_args``: more
    command-line switches (``--host-resolver-rules=...``)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for arg in (*_ARGS, *extra_args):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"performance": "ALL"})
    driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
    driver.set_page_load_timeout(30)
    return driver


@contextlib.contextmanager
def open_browser(extra_args: tuple[str, ...] = ()) -> Iterator[Browser]:
    """A :class:`Browser`, quit at the end; fails (with how to install it) when there is none."""
    problem = missing_browser()
    if problem:
        raise RuntimeError(problem)
    driver = make_driver(extra_args)
    try:
        yield Browser(driver)
    finally:
        driver.quit()


@pytest.fixture
def browser() -> Iterator[Browser]:
    """A fresh headless Chromium for the test; without one it fails saying what is missing (in
    CI; elsewhere :func:`skip_without_a_browser` has skipped the test already)."""
    problem = missing_browser()
    if problem:
        pytest.fail(f"{problem} (not skipped: CI=true)" if in_ci() else problem, pytrace=False)
    with open_browser() as made:
        yield made


def element_text(driver: AnyDriver, css: str) -> str:
    """The text of the first element ``css`` selects (fails naming ``css`` when none does)."""
    from selenium.webdriver.common.by import By

    found = driver.find_elements(By.CSS_SELECTOR, css)
    assert found, f"no element {css!r} on {driver.current_url}"
    return str(found[0].text).strip()


def attribute(element: Any, name: str) -> str:
    """An element's attribute as a string ("" when absent)."""
    return str(element.get_attribute(name) or "")
