"""Helpers of the web page tests: a WSGI app served by a real wsgiref server in a thread, and
a small HTTP client over http.client that keeps cookies and reads the page's forms."""

from __future__ import annotations

import http.client
import socketserver
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from html.parser import HTMLParser
from http.cookies import SimpleCookie
from typing import Any
from urllib.parse import urlencode, urljoin, urlsplit
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from celery_singleton_lock.web import LocksWeb
from celery_singleton_lock.web.serve import make_server as make_page_server


class ThreadingServer(socketserver.ThreadingMixIn, WSGIServer):
    """wsgiref's server, a thread per request (as ``locks web`` serves the page): a slow client
    does not stall the others."""

    daemon_threads = True


class QuietHandler(WSGIRequestHandler):
    """Requests not printed on stderr, among the tests' output."""

    def log_message(self, format: str, *args: Any) -> None:
        return None


@contextmanager
def served(app: Any, allowed_hosts: tuple[str, ...] = ()) -> Iterator[str]:
    """``app`` served on a free loopback port in a thread; yields its base URL (ends "/").
    The page itself (a :class:`LocksWeb`) is served as ``locks web`` serves it (answering its
    own names only); another WSGI app (Flask, Django) by wsgiref's plain server."""
    if isinstance(app, LocksWeb):
        server = make_page_server(app, "127.0.0.1", 0, allowed_hosts)
    else:
        server = make_server(
            "127.0.0.1", 0, app, server_class=ThreadingServer, handler_class=QuietHandler
        )
    thread = threading.Thread(target=server.serve_forever, name="web-test-server", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}/"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    body: str

    def forms(self) -> dict[str, dict[str, str]]:
        """The page's forms by id: their inputs' names and values (action, method too)."""
        parser = _Forms()
        parser.feed(self.body)
        return parser.forms


class _Forms(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.forms: dict[str, dict[str, str]] = {}
        self._current: dict[str, str] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = {k: v or "" for k, v in attrs}
        if tag == "form":
            self._current = {"@action": found.get("action", ""), "@method": found.get("method", "")}
            self.forms[found.get("id", "")] = self._current
        elif tag == "input" and self._current is not None and "name" in found:
            self._current[found["name"]] = found.get("value", "")

    def handle_endtag(self, tag: str) -> None:
        if tag == "form":
            self._current = None


class Client:
    """A browser-like client of one site: keeps its cookies, follows no redirect."""

    def __init__(self, base: str) -> None:
        self.base = base
        self.cookies: dict[str, str] = {}

    def request(
        self,
        method: str,
        path: str,
        form: dict[str, str] | None = None,
        headers: dict[str, str] | None = None,
    ) -> Reply:
        url = urlsplit(urljoin(self.base, path))
        connection = http.client.HTTPConnection(url.hostname or "", url.port, timeout=30)
        sent = dict(headers or {})
        if self.cookies:
            sent["Cookie"] = "; ".join(f"{k}={v}" for k, v in self.cookies.items())
        body = None
        if form is not None:
            body = urlencode(form)
            sent["Content-Type"] = "application/x-www-form-urlencoded"
        target = url.path + (f"?{url.query}" if url.query else "")
        try:
            connection.request(method, target, body=body, headers=sent)
            response = connection.getresponse()
            text = response.read().decode("utf-8")
            for value in response.headers.get_all("Set-Cookie") or []:
                for name, morsel in SimpleCookie(value).items():
                    self.cookies[name] = morsel.value
            return Reply(response.status, dict(response.headers.items()), text)
        finally:
            connection.close()

    def get(self, path: str) -> Reply:
        return self.request("GET", path)

    def post(self, path: str, form: dict[str, str], **headers: str) -> Reply:
        return self.request("POST", path, form, headers)

    def confirm(self, path: str, **extra: str) -> Reply:
        """GET a confirm page at ``path`` and POST its form (with ``extra`` fields)."""
        page = self.get(path)
        assert page.status == 200, page.body
        form = dict(page.forms()["confirm"])
        action = form.pop("@action")
        form.pop("@method")
        form.update(extra)
        return self.post(urljoin(urljoin(self.base, path), action), form)


class _Rows(HTMLParser):
    """The ``tr`` rows of one table: their ``data-*`` attributes and cell texts by class."""

    def __init__(self, table: str) -> None:
        super().__init__()
        self.table, self.inside = table, False
        self.rows: list[dict[str, str]] = []
        self._row: dict[str, str] | None = None
        self._cell: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = {k: v or "" for k, v in attrs}
        if tag == "table":
            self.inside = found.get("id") == self.table
        elif self.inside and tag == "tr" and "data-key" in found:
            self._row = {k: v for k, v in found.items() if k.startswith("data-")}
            self._row["@class"] = found.get("class", "")
            self.rows.append(self._row)
        elif self._row is not None and tag == "td":
            self._cell = found.get("class", "")
            self._row.setdefault(self._cell, "")
        elif self._row is not None and tag == "a":
            self._row[f"@{found.get('class', '')}"] = found.get("href", "")

    def handle_endtag(self, tag: str) -> None:
        if tag == "td":
            self._cell = None
        elif tag == "tr":
            self._row = None
        elif tag == "table":
            self.inside = False

    def handle_data(self, data: str) -> None:
        if self._row is not None and self._cell:
            self._row[self._cell] += data.strip()


def table_rows(body: str, table: str) -> list[dict[str, str]]:
    """The rows of ``table`` (an id) that carry a ``data-key``."""
    parser = _Rows(table)
    parser.feed(body)
    return parser.rows


def text_of(body: str, attribute: str, value: str) -> str | None:
    """The text of the first element whose ``attribute`` is ``value`` (``id``, ``data-field``,
    ``data-count``), or ``None``."""

    class Find(HTMLParser):
        def __init__(self) -> None:
            super().__init__()
            self.depth, self.text, self.found = 0, "", False

        def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
            if self.depth:
                self.depth += 1
            elif dict(attrs).get(attribute) == value and not self.found:
                self.depth, self.found = 1, True

        def handle_endtag(self, tag: str) -> None:
            if self.depth:
                self.depth -= 1

        def handle_data(self, data: str) -> None:
            if self.depth:
                self.text += data

    finder = Find()
    finder.feed(body)
    return " ".join(finder.text.split()) if finder.found else None
