"""A request of the locks page, read from a WSGI environ (or handed over by Flask or Django),
its list's filter and paging checked, and its response."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from http import HTTPStatus
from http.cookies import CookieError, SimpleCookie
from typing import Any
from urllib.parse import parse_qsl

from .data import STATES

__all__ = ["MAX_FORM_BYTES", "BadRequest", "Request", "Response", "filters", "paging"]

#: a POSTed form larger than this is refused (a confirm form is a few hundred bytes)
MAX_FORM_BYTES = 64 * 1024


class BadRequest(ValueError):
    """A query the page cannot answer (400), its message naming the parameter."""


@dataclass
class Request:
    """One request, as the page needs it."""

    method: str
    #: the path below the mount: "", "lock", "release" or "purge"
    path: str
    #: the absolute path of the mount, ending with "/" (the CSRF cookie's path)
    mount: str
    query: dict[str, str] = field(default_factory=dict)
    form: dict[str, str] = field(default_factory=dict)
    cookies: dict[str, str] = field(default_factory=dict)
    host: str = ""
    origin: str = ""
    referer: str = ""
    remote: str = ""
    secure: bool = False
    environ: dict[str, Any] = field(default_factory=dict)
    #: the status and reason when the POSTed form could not be read (``None``: it was)
    form_problem: tuple[int, str] | None = None


@dataclass
class Response:
    """One answer: a status, a body and headers."""

    status: int
    body: bytes = b""
    headers: list[tuple[str, str]] = field(default_factory=list)

    @property
    def status_line(self) -> str:
        return f"{self.status} {HTTPStatus(self.status).phrase}"


def _read_form(environ: dict[str, Any]) -> tuple[dict[str, str], tuple[int, str] | None]:
    if environ.get("REQUEST_METHOD") != "POST":
        return {}, None
    given = str(environ.get("CONTENT_LENGTH") or "0").strip()
    if not (given.isascii() and given.isdecimal()) or len(given) > 12:
        return {}, (HTTPStatus.BAD_REQUEST, "the Content-Length is not a number of bytes")
    length = int(given)
    if length > MAX_FORM_BYTES:
        return {}, (
            HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
            f"the form has {length} bytes, more than the {MAX_FORM_BYTES} a confirm form may "
            "have: a long key is released through its link (which names it by a digest)",
        )
    body = environ["wsgi.input"].read(length).decode("utf-8", "replace") if length else ""
    return dict(parse_qsl(body, keep_blank_values=True)), None


def request_from_environ(
    environ: dict[str, Any],
    path: str | None = None,
    mount: str | None = None,
    form: dict[str, str] | None = None,
) -> Request:
    """The request of a WSGI ``environ``; ``path``, ``mount`` and ``form`` when the host
    framework already routed it and read its body."""
    cookies: dict[str, str] = {}
    # another app's malformed cookie: ours is then missing (a new one is set), not fatal
    with contextlib.suppress(CookieError):
        cookies = {k: m.value for k, m in SimpleCookie(environ.get("HTTP_COOKIE", "")).items()}
    if path is None:
        path = environ.get("PATH_INFO", "").lstrip("/")
    if mount is None:
        mount = environ.get("SCRIPT_NAME", "").rstrip("/") + "/"
    problem = None
    if form is None:
        form, problem = _read_form(environ)
    return Request(
        method=environ.get("REQUEST_METHOD", "GET").upper(),
        path=path,
        mount=mount,
        query=dict(parse_qsl(environ.get("QUERY_STRING", ""), keep_blank_values=True)),
        form=form,
        cookies=cookies,
        host=environ.get("HTTP_HOST") or environ.get("SERVER_NAME", ""),
        origin=environ.get("HTTP_ORIGIN", ""),
        referer=environ.get("HTTP_REFERER", ""),
        remote=environ.get("REMOTE_ADDR", ""),
        secure=environ.get("wsgi.url_scheme") == "https",
        environ=environ,
        form_problem=problem,
    )


def filters(query: dict[str, str]) -> tuple[str, str]:
    """The list's filter: a text and a state."""
    q, state = query.get("q", "").strip(), query.get("state", "")
    if state and state not in STATES:
        raise BadRequest(f"state must be one of {', '.join(STATES)} (or empty), got {state!r}")
    return q, state


def paging(query: dict[str, str]) -> tuple[int, bool]:
    """The page number asked for, and whether newest first."""
    page_text, sort = query.get("page", "1") or "1", query.get("sort", "age") or "age"
    # (int() of thousands of digits is refused by Python itself: a 500 before this check)
    if not (page_text.isascii() and page_text.isdecimal()) or len(page_text) > 9:
        raise BadRequest(f"page must be a whole number >= 1, got {page_text[:20]!r}")
    if int(page_text) < 1:
        raise BadRequest(f"page must be a whole number >= 1, got {page_text!r}")
    if sort not in ("age", "-age"):
        raise BadRequest(
            f"sort must be 'age' (oldest first) or '-age' (newest first), got {sort!r}"
        )
    return int(page_text), sort == "-age"
