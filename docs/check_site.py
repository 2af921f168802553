"""Look at the built site in a headless Chromium at 1280 px, as a reader on a laptop would.

    scripts/docs-check          # builds the site, then runs this

For each page checked: nothing wider than the window (no sideways scrolling of the page), every
table fits its column (none needs its own scroll bar), every image loaded, and no request left
the site (no CDN, no web font). A screenshot of each page goes to ``site-check/`` to look at.
Chromium: ``$CHROMIUM``, else ``chromium`` on PATH (``apt install chromium``); driven through
Playwright's Python API, which ``scripts/docs-check`` installs (no browser download).
"""

from __future__ import annotations

import importlib
import os
import shutil
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SITE, SHOTS = ROOT / "site", ROOT / "site-check"
PAGES = ["", "configuration", "production", "limits", "api", "benchmarks", "what-happens-when"]
WIDTH = 1280

_MEASURE = """() => {
  const tables = [...document.querySelectorAll('.md-typeset table')].map(t => ({
    overflow: (t.closest('.md-typeset__scrollwrap') || t.parentElement).scrollWidth
      - (t.closest('.md-typeset__scrollwrap') || t.parentElement).clientWidth,
    head: (t.querySelector('th') || {}).textContent || '',
  }));
  const images = [...document.querySelectorAll('.md-typeset img')].map(i => ({
    src: i.getAttribute('src'), loaded: i.complete && i.naturalWidth > 0,
  }));
  return {page: document.documentElement.scrollWidth, tables, images};
}"""


def check(page: Any, name: str) -> list[str]:
    """What is wrong with one page (empty: nothing)."""
    path = SITE / name / "index.html"
    outside: list[str] = []
    page.on("request", lambda r: outside.append(r.url) if not r.url.startswith("file:") else None)
    page.goto(path.as_uri())
    page.wait_for_load_state("load")
    found = page.evaluate(_MEASURE)
    problems = [f"the page is {found['page']} px wide"] if found["page"] > WIDTH else []
    problems += [
        f"a table ({t['head']!r}...) is {t['overflow']} px too wide"
        for t in found["tables"]
        if t["overflow"] > 1
    ]
    problems += [f"image {i['src']} did not load" for i in found["images"] if not i["loaded"]]
    problems += [f"request to {url}" for url in outside]
    page.screenshot(path=str(SHOTS / f"{name or 'index'}.png"), full_page=True)
    tables, images = len(found["tables"]), len(found["images"])
    print(f"{name or 'home'}: {tables} tables, {images} images, {len(problems)} problems")
    return problems


def main() -> int:
    # Not a dependency of the package or its extras: scripts/docs-check installs it.
    sync_playwright = importlib.import_module("playwright.sync_api").sync_playwright
    chromium = os.environ.get("CHROMIUM") or shutil.which("chromium")
    if not chromium:
        print("no Chromium: set CHROMIUM or `apt install chromium`", file=sys.stderr)
        return 2
    SHOTS.mkdir(exist_ok=True)
    problems: list[str] = []
    with sync_playwright() as driver:
        browser = driver.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        for name in PAGES:
            page = browser.new_page(viewport={"width": WIDTH, "height": 900})
            problems += [f"{name or 'home'}: {p}" for p in check(page, name)]
            page.close()
        browser.close()
    for problem in problems:
        print(problem, file=sys.stderr)
    print(f"screenshots in {SHOTS.relative_to(ROOT)}/")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
