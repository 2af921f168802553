"""The locks page in a real browser (headless Chromium), against real processes: a redis-server,
a ``celery worker`` running the fault app's tasks, a ``celery beat`` with the leader scheduler,
and the standalone page (``celery -A tests.faultapp locks web``), as :mod:`web_world` starts
them, with locks taken by real calls: a running job, a queued copy, a cooldown, two slots of
three, a rate limiter and the beat leader.

Each kind shows as the page's contract says (ids, classes, ``data-*``); the running job's page
shows its holder, host, pid, fence, holds, lease and result state; a release from the page (the
token typed into the confirm form) frees the lock and the job's next call runs on the worker; a
POST without the token, without the CSRF value or from another origin is refused (403,
``#error``) and frees nothing; no page requests anything from another origin; no page is wider
than the 1280 px window, even with a long key.
"""

from __future__ import annotations

import socket
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from browser_fixtures import WIDTH, Browser, attribute, element_text, open_browser
from celery_procs import new_job, redis_base
from lock_helpers import START_TIMEOUT, wait_until
from selenium.webdriver.common.by import By
from selenium.webdriver.support.wait import WebDriverWait
from web_page import Session, cell, clean, field, lock_rows, open_confirm, pid_of, seconds_in
from web_world import BEAT_KEY, PARKED, TOKEN, WebServer, World, locks_world, populate

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.timeout(3 * START_TIMEOUT + 240)]

#: a job name with no break in it: its key is longer than any table cell is wide
LONG_JOB = "unbroken-" + "k" * 110


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    with locks_world(tmp_path_factory.mktemp("web")) as made:
        populate(made, long_job=LONG_JOB)
        yield made


# -- the list --------------------------------------------------------------------------------


def test_the_list_shows_each_kind_of_lock(world: World, browser: Browser) -> None:
    jobs, host = world.jobs, socket.gethostname()
    browser.get(world.web.url)
    driver = browser.driver
    rows = lock_rows(driver)

    running = rows[world.key("fault.web_work", jobs["running"])]
    run_id = world.task_ids[jobs["running"]][0]
    assert attribute(running, "data-state") == "running"
    assert (cell(running, "task"), cell(running, "state")) == ("fault.web_work", "running")
    assert run_id in cell(running, "holder")
    assert cell(running, "host") == host
    assert cell(running, "pid") == str(pid_of(world, jobs["running"], run_id))
    assert 0 < seconds_in(cell(running, "lease")) <= 30

    queued = rows[world.queued_key("fault.web_queued", jobs["queued"])]
    assert attribute(queued, "data-state") == cell(queued, "state") == "queued"

    cooled = rows[world.key("fault.cooled_long", jobs["cooled"])]
    assert attribute(cooled, "data-state") == cell(cooled, "state") == "cooldown"
    assert 0 < seconds_in(cell(cooled, "lease")) <= 60

    first_slot = world.key("fault.web_slots", jobs["slots"])
    slots = [row for key, row in rows.items() if key.startswith(first_slot)]
    assert len(slots) == 2
    assert [cell(row, "slots") for row in slots] == ["2/3", "2/3"]
    assert {cell(row, "state") for row in slots} == {"running"}

    assert BEAT_KEY in rows  # held, as `celery locks list` shows it (and in a table of its own)
    assert cell(rows[BEAT_KEY], "task") == "celery beat"

    limiters = driver.find_elements(By.CSS_SELECTOR, "#limiters tr.limiter")
    rated = [r for r in limiters if f"fault-impatient:{jobs['rated']}" in attribute(r, "data-key")]
    assert len(rated) == 1, [attribute(r, "data-key") for r in limiters]
    assert cell(rated[0], "used") and cell(rated[0], "rule")

    assert int(element_text(driver, "#total")) == len(rows)
    for name in ("duplicates", "refusals-limit", "refusals-cooldown", "refusals-rate", "lost"):
        assert element_text(driver, f'#counts [data-count="{name}"]').isdigit(), name
    assert driver.find_elements(By.CSS_SELECTOR, 'meta[http-equiv="refresh"]') == []  # --refresh 0
    clean(browser, world)


def test_the_beat_leader_shows_in_its_own_table_and_as_held(world: World, browser: Browser) -> None:
    browser.get(world.web.url)
    leaders = browser.driver.find_elements(By.CSS_SELECTOR, "#beat tr.leader")
    assert [attribute(row, "data-key") for row in leaders] == [BEAT_KEY]
    leader = leaders[0]
    assert cell(leader, "app") == "faultapp"
    assert f":{world.beat.pid}:" in cell(leader, "holder")  # the beat's owner token
    assert 0 < seconds_in(cell(leader, "lease")) <= 30
    assert cell(leader, "since")
    assert (cell(leader, "host"), cell(leader, "pid")) == (
        socket.gethostname(),
        str(world.beat.pid),
    )
    clean(browser, world)


def test_the_counts_show_a_refused_call(world: World, browser: Browser) -> None:
    """The second call of the rated job was refused (one start a minute): the last hour's
    counts say so once the worker's buffer reached Redis."""

    def refused() -> int:
        browser.get(world.web.url)
        return int(element_text(browser.driver, '#counts [data-count="refusals-rate"]'))

    assert wait_until(refused, 30, "the rate refusal in the counts", 0.5) >= 1


def test_the_filter_form_narrows_the_list(world: World, browser: Browser) -> None:
    browser.get(world.web.url)
    driver = browser.driver
    query = driver.find_element(By.CSS_SELECTOR, "form#filter input[name=q]")
    query.send_keys(world.jobs["slots"])
    query.submit()
    WebDriverWait(driver, 10).until(lambda d: "q=" in d.current_url)
    first_slot = world.key("fault.web_slots", world.jobs["slots"])
    assert lock_rows(driver) and all(k.startswith(first_slot) for k in lock_rows(driver))
    assert element_text(driver, "#total") == "2"

    browser.get(world.web.url + "?state=cooldown")
    assert list(lock_rows(driver)) == [world.key("fault.cooled_long", world.jobs["cooled"])]
    clean(browser, world)


# -- one lock --------------------------------------------------------------------------------


def test_the_page_of_the_running_job(world: World, browser: Browser) -> None:
    job = world.jobs["running"]
    key, run_id = world.key("fault.web_work", job), world.task_ids[job][0]
    browser.get(world.web.url)
    driver = browser.driver
    lock_rows(driver)[key].find_element(By.CSS_SELECTOR, "td.key a.detail").click()
    WebDriverWait(driver, 10).until(lambda d: d.find_elements(By.CSS_SELECTOR, "dl#lock"))

    held = world.space.inspect(key)
    assert (field(driver, "task"), field(driver, "key")) == ("fault.web_work", key)
    assert field(driver, "state") == "running"
    assert run_id in field(driver, "holder")
    assert field(driver, "host") == socket.gethostname()
    assert field(driver, "pid") == str(pid_of(world, job, run_id))
    assert field(driver, "fence") == str(held.fence)
    assert field(driver, "holds") == "1"
    assert 0 < seconds_in(field(driver, "lease")) <= 30
    assert field(driver, "result") == "STARTED"  # fault.web_work has track_started
    clean(browser, world)


def test_the_page_of_a_slot_names_the_other_permit(world: World, browser: Browser) -> None:
    first = world.key("fault.web_slots", world.jobs["slots"])
    held = sorted(k for k in world.locks.scan_iter(f"{first}*") if not k.endswith((":meta",)))
    assert len(held) == 2, held
    browser.get(world.web.url + "lock?" + urllib.parse.urlencode({"key": held[0]}))
    assert field(browser.driver, "slots") == "2/3"
    assert held[1] in browser.driver.find_element(By.TAG_NAME, "body").text
    clean(browser, world)


def test_a_lock_that_is_gone_is_a_404(world: World, browser: Browser) -> None:
    url = world.web.url + "lock?key=" + urllib.parse.quote("lock:{fault.web_work:nobody}")
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(url, timeout=10)
    assert refused.value.code == 404
    browser.get(url)
    assert element_text(browser.driver, "#error")
    clean(browser, world)


# -- release ---------------------------------------------------------------------------------


def test_a_release_from_the_page_frees_the_lock_and_the_next_call_runs(
    world: World, browser: Browser
) -> None:
    job = new_job("release-me")
    first_id = world.start_run(job)
    key = world.key("fault.web_work", job)
    assert world.space.inspect(key).holder is not None

    open_confirm(browser, world, key)
    driver = browser.driver
    page = driver.find_element(By.TAG_NAME, "body").text
    assert key in page and "fault.web_work" in page and first_id in page
    token = driver.find_element(By.CSS_SELECTOR, "form#confirm input[name=token]")
    assert attribute(token, "type") == "password"
    token.send_keys(TOKEN)
    driver.find_element(By.CSS_SELECTOR, "#do-release").click()
    WebDriverWait(driver, 10).until(lambda d: d.find_elements(By.CSS_SELECTOR, "#message"))
    assert element_text(driver, "#message") == f"Released {key}."
    assert not world.space.inspect(key).held
    logged = [line for line in world.web.log().splitlines() if key in line]
    assert any("WARNING" in line and "127.0.0.1" in line for line in logged), logged

    second_id = world.start_run(job)  # waits until the worker started it
    assert second_id != first_id
    assert world.space.inspect(key).holder is not None
    clean(browser, world)


def test_a_post_without_the_token_or_the_csrf_value_frees_nothing(
    world: World, browser: Browser
) -> None:
    job = new_job("keep-me")
    run_id = world.start_run(job)
    key = world.key("fault.web_work", job)
    session = Session(world.web.url)
    csrf = session.confirm_csrf(key)
    stranger = Session(world.web.url)  # no cookie of its own: the form's value alone
    refusals: list[tuple[Session, dict[str, str], dict[str, str]]] = [
        (session, {"key": key, "csrf": csrf}, {}),
        (session, {"key": key, "csrf": csrf, "token": "wrong"}, {}),
        (session, {"key": key, "token": TOKEN}, {}),
        (session, {"key": key, "csrf": "forged", "token": TOKEN}, {}),
        (stranger, {"key": key, "csrf": csrf, "token": TOKEN}, {}),
        (session, {"key": key, "csrf": csrf, "token": TOKEN}, {"Origin": "http://evil.test"}),
    ]
    for who, form, headers in refusals:
        status, html = who.post(form, headers)
        assert status == 403 and 'id="error"' in html, (form, headers, status)
        assert world.space.inspect(key).holder is not None, (form, headers)

    # In the browser: the confirm form without its hidden CSRF field.
    open_confirm(browser, world, key)
    driver = browser.driver
    driver.execute_script("document.querySelector('form#confirm input[name=csrf]').remove()")
    driver.find_element(By.CSS_SELECTOR, "form#confirm input[name=token]").send_keys(TOKEN)
    driver.find_element(By.CSS_SELECTOR, "#do-release").click()
    WebDriverWait(driver, 10).until(lambda d: d.find_elements(By.CSS_SELECTOR, "#error"))
    assert browser.responses()[-1] == (world.web.url + "release", 403)
    assert world.space.inspect(key).holder is not None
    assert run_id in world.starts(job) and len(world.starts(job)) == 1

    # The same session with everything in place is let through: the refusals were the
    # missing parts', not the harness's.
    status, _ = session.post({"key": key, "csrf": csrf, "token": TOKEN})
    assert status in (200, 303)
    assert not world.space.inspect(key).held
    clean(browser, world)


def test_a_purge_from_the_page_frees_the_matching_locks_only(
    world: World, browser: Browser
) -> None:
    job = new_job("purge-me")
    world.app.tasks["fault.web_queued"].apply_async((job,), queue=PARKED)
    key = world.queued_key("fault.web_queued", job)
    kept = [
        world.key("fault.web_work", world.jobs["running"]),
        world.queued_key("fault.web_queued", world.jobs["queued"]),
        world.queued_key("fault.web_queued", LONG_JOB),
        BEAT_KEY,
    ]
    assert world.space.inspect(key).held

    driver = browser.driver

    def listed() -> bool:  # the list is one read shared by every viewer: a second old at most
        browser.get(world.web.url + "?" + urllib.parse.urlencode({"q": job}))
        return list(lock_rows(driver)) == [key]

    wait_until(listed, 10, "the new queued copy in the list", 0.2)
    driver.find_element(By.CSS_SELECTOR, "a#purge").click()
    WebDriverWait(driver, 10).until(lambda d: d.find_elements(By.CSS_SELECTOR, "#do-purge"))
    assert job in driver.find_element(By.TAG_NAME, "body").text
    driver.find_element(By.CSS_SELECTOR, "form#confirm input[name=token]").send_keys(TOKEN)
    driver.find_element(By.CSS_SELECTOR, "#do-purge").click()
    WebDriverWait(driver, 10).until(lambda d: d.find_elements(By.CSS_SELECTOR, "#message"))
    assert not world.space.inspect(key).held
    assert all(world.space.inspect(k).held for k in kept)
    clean(browser, world)


def test_without_a_token_the_page_is_read_only(
    world: World, browser: Browser, tmp_path: Path
) -> None:
    """``locks web`` with no token in its environment shows no release or purge link, and
    refuses a release posted with a valid CSRF value."""
    key = world.key("fault.web_work", world.jobs["running"])
    reader = WebServer(redis_base(world.server.port), tmp_path, token=None)
    try:
        browser.get(reader.url)
        driver = browser.driver
        assert key in lock_rows(driver)
        assert driver.find_elements(By.CSS_SELECTOR, "a.release, a#purge") == []
        session = Session(reader.url)
        with session.opener.open(reader.url, timeout=10):
            pass  # the cookie
        csrf = next(str(c.value) for c in session.jar)  # the page set one cookie: its CSRF
        status, html = session.post({"key": key, "csrf": csrf})
        assert status == 403 and 'id="error"' in html
        assert world.space.inspect(key).held
        assert browser.foreign_requests(reader.url) == []
    finally:
        reader.stop()


# -- width -----------------------------------------------------------------------------------


def test_no_page_is_wider_than_the_window_even_with_a_long_key(
    world: World, browser: Browser
) -> None:
    long_key = world.queued_key("fault.web_queued", LONG_JOB)
    assert len(long_key) > 100 and world.space.inspect(long_key).held
    quoted = urllib.parse.urlencode({"key": long_key})
    pages = [
        "",
        "?" + urllib.parse.urlencode({"q": LONG_JOB}),
        "lock?" + quoted,
        "release?" + quoted,
        "purge?" + urllib.parse.urlencode({"q": LONG_JOB}),
        "lock?key=" + urllib.parse.quote("lock:{gone}"),
    ]
    for page in pages:
        browser.get(world.web.url + page)
        assert browser.page_width() <= WIDTH, page
        for element in browser.driver.find_elements(By.CSS_SELECTOR, "td.key, dd, h1, h2, p"):
            right = float(element.rect["x"]) + float(element.rect["width"])
            assert right <= WIDTH, (page, element.text[:60], right)
    assert browser.foreign_requests(world.web.url) == []
    assert any(LONG_JOB in url or "unbroken" in url for url in browser.requests())


def test_screenshot_helper_writes_a_png(world: World, browser: Browser, tmp_path: Path) -> None:
    browser.get(world.web.url)
    shot = tmp_path / "list.png"
    browser.screenshot(shot)
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# -- DNS rebinding ---------------------------------------------------------------------------

#: a script of a page at the rebinding name: read the list and the confirm form, then post a
#: release with what it read (and the token, when it is given one)
_REBIND_SCRIPT = """
const [key, token, done] = arguments;
(async () => {
  const list = await fetch('./');
  const body = await list.text();
  const confirm = await fetch('release?key=' + encodeURIComponent(key));
  const found = (await confirm.text()).match(/name="csrf" value="([^"]+)"/);
  const form = new URLSearchParams({key: key, holder: '', csrf: found ? found[1] : 'x',
                                    token: token});
  const post = await fetch('release', {method: 'POST', body: form, redirect: 'manual'});
  done({list: list.status, listed: body.includes(key), confirm: confirm.status,
        post: post.status, type: post.type});
})().catch((e) => done({error: String(e)}));
"""


@pytest.mark.parametrize("token", ["", TOKEN])
def test_a_rebinding_site_can_neither_read_nor_release(world: World, token: str) -> None:
    """Chromium resolves evil.example to 127.0.0.1 (as a rebinding site's DNS would, after its
    page loaded): a script at http://evil.example:PORT/ is same-origin with the page by the
    browser's rules. The page answers no request for that name (421), so the script reads no
    lock and frees none, with or without the token. (The answers' CSP is bypassed here: what
    is checked is the server's refusal, not the browser's.)"""
    key = world.key("fault.web_work", world.jobs["running"])  # held while the module runs
    port = world.web.port
    rules = "--host-resolver-rules=MAP evil.example 127.0.0.1"
    with open_browser((rules,)) as browser:
        driver = browser.driver
        driver.execute_cdp_cmd("Page.setBypassCSP", {"enabled": True})
        browser.get(f"http://evil.example:{port}/")
        assert driver.current_url.startswith("http://evil.example:")
        driver.set_script_timeout(30)
        seen = driver.execute_async_script(_REBIND_SCRIPT, key, token)
    assert "error" not in seen, seen
    assert (seen["list"], seen["listed"], seen["confirm"], seen["post"]) == (421, False, 421, 421)
    assert world.space.inspect(key).holder is not None
