"""Reading the locks page in the browser tests (``tests/test_web_browser.py``): its rows,
cells and fields by the contract's ids and classes, what every page must be, and a client that
posts a form as a script would (a cookie jar, no browser).
"""

from __future__ import annotations

import re
import urllib.error
import urllib.parse
import urllib.request
from http.cookiejar import CookieJar

from browser_fixtures import WIDTH, Browser, attribute, element_text
from faultapp import records_of
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.remote.webelement import WebElement
from selenium.webdriver.support.wait import WebDriverWait
from web_world import World


def lock_rows(driver: WebDriver) -> dict[str, WebElement]:
    """The rows of ``#locks`` by their ``data-key``."""
    rows = driver.find_elements(By.CSS_SELECTOR, "#locks tr.lock")
    return {attribute(row, "data-key"): row for row in rows}


def cell(row: WebElement, name: str) -> str:
    """The text of a row's ``td.<name>``."""
    return str(row.find_element(By.CSS_SELECTOR, f"td.{name}").text).strip()


def field(driver: WebDriver, name: str) -> str:
    """The text of the lock page's ``dd[data-field=<name>]``."""
    return element_text(driver, f'#lock dd[data-field="{name}"]')


def seconds_in(text: str) -> float:
    """The first number of a lease or age as the page writes it ("59 s", "59.2s", "1m 5s")."""
    found = re.findall(r"\d+(?:\.\d+)?", text)
    assert found, f"no number in {text!r}"
    return float(found[0])


def pid_of(world: World, job: str, task_id: str) -> int:
    """The pid of the pool process that started run ``task_id`` of ``job`` (its record)."""
    return next(int(s["pid"]) for s in records_of(world.app, "starts", job) if s["id"] == task_id)


def clean(browser: Browser, world: World) -> None:
    """What every page must be: no request to another origin, no wider than the window."""
    assert browser.foreign_requests(world.web.url) == []
    assert browser.page_width() <= WIDTH, browser.driver.current_url
    # all CSS inline, no script to fetch: the page is whole as it arrives
    assets = "link[rel=stylesheet], script[src], img[src^=http]"
    assert browser.driver.find_elements(By.CSS_SELECTOR, assets) == []


def open_confirm(browser: Browser, world: World, key: str) -> None:
    """From the lock's page, follow its release link to the confirm page."""
    browser.get(world.web.url + "lock?" + urllib.parse.urlencode({"key": key}))
    browser.driver.find_element(By.CSS_SELECTOR, "a.release").click()
    WebDriverWait(browser.driver, 10).until(
        lambda d: d.find_elements(By.CSS_SELECTOR, "form#confirm")
    )


class Session:
    """A client of the page with a cookie jar, as a script (not a browser) would post."""

    def __init__(self, base: str) -> None:
        self.base = base
        self.jar = CookieJar()
        self.opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(self.jar))

    def confirm_csrf(self, key: str) -> str:
        """GET the release confirm page (which sets the cookie); the form's CSRF value."""
        url = self.base + "release?" + urllib.parse.urlencode({"key": key})
        with self.opener.open(url, timeout=10) as reply:
            html = reply.read().decode()
        found = re.search(r'name="csrf"[^>]*value="([^"]+)"|value="([^"]+)"[^>]*name="csrf"', html)
        assert found, html
        return found.group(1) or found.group(2)

    def post(self, form: dict[str, str], headers: dict[str, str] | None = None) -> tuple[int, str]:
        data = urllib.parse.urlencode(form).encode()
        request = urllib.request.Request(self.base + "release", data, headers or {})
        try:
            with self.opener.open(request, timeout=10) as reply:
                return int(reply.status), reply.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()
