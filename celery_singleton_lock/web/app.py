"""The page as a WSGI app (:class:`LocksWeb`, made by :func:`make_app`): a request read from
the WSGI environ (or handed over by Flask or Django), routed to :mod:`.views`, answered with
the stdlib only."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from http import HTTPStatus
from http.cookies import CookieError, SimpleCookie
from typing import Any
from urllib.parse import parse_qsl

from .._errors import LockError
from .._lock import check_prefix
from . import csrf, views
from .access import Access, TokenAccess
from .data import Source

__all__ = ["LocksWeb", "Request", "Response", "make_app", "request_from_environ"]

log = logging.getLogger("celery_singleton_lock.web")

#: a POSTed form larger than this is refused (a confirm form is a few hundred bytes)
MAX_FORM_BYTES = 64 * 1024


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


@dataclass
class Response:
    """One answer: a status, headers and a body."""

    status: int
    body: bytes = b""
    headers: list[tuple[str, str]] = field(default_factory=list)

    @property
    def status_line(self) -> str:
        return f"{self.status} {HTTPStatus(self.status).phrase}"


def _read_form(environ: dict[str, Any]) -> dict[str, str]:
    if environ.get("REQUEST_METHOD") != "POST":
        return {}
    try:
        length = int(environ.get("CONTENT_LENGTH") or 0)
    except ValueError:
        length = 0
    if length <= 0 or length > MAX_FORM_BYTES:
        return {}
    body = environ["wsgi.input"].read(length).decode("utf-8", "replace")
    return dict(parse_qsl(body, keep_blank_values=True))


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
    return Request(
        method=environ.get("REQUEST_METHOD", "GET").upper(),
        path=path,
        mount=mount,
        query=dict(parse_qsl(environ.get("QUERY_STRING", ""), keep_blank_values=True)),
        form=_read_form(environ) if form is None else form,
        cookies=cookies,
        host=environ.get("HTTP_HOST") or environ.get("SERVER_NAME", ""),
        origin=environ.get("HTTP_ORIGIN", ""),
        referer=environ.get("HTTP_REFERER", ""),
        remote=environ.get("REMOTE_ADDR", ""),
        secure=environ.get("wsgi.url_scheme") == "https",
        environ=environ,
    )


class LocksWeb:
    """The locks page, a WSGI app (made by :func:`make_app`)."""

    def __init__(
        self,
        source: Source,
        access: Access,
        *,
        link_pattern: str | None,
        refresh: int,
        page_size: int,
    ) -> None:
        self.source = source
        self.access = access
        self.link_pattern = link_pattern
        self.refresh = refresh
        self.page_size = page_size

    def __call__(
        self, environ: dict[str, Any], start_response: Callable[..., Any]
    ) -> Iterable[bytes]:
        response = self.handle(request_from_environ(environ))
        start_response(response.status_line, response.headers)
        return [response.body]

    def handle(self, request: Request) -> Response:
        """Route ``request``; every answer sets the CSRF cookie when it was missing."""
        token = request.cookies.get(csrf.COOKIE) or ""
        fresh = not token
        if fresh:
            token = csrf.new_token()
        try:
            response = self._route(request, token)
        except views.BadRequest as exc:
            response = views.error_page(HTTPStatus.BAD_REQUEST, str(exc))
        except LockError as exc:  # Redis is down: say so, no traceback
            log.warning("the locks page could not read Redis: %s", exc)
            response = views.error_page(HTTPStatus.SERVICE_UNAVAILABLE, str(exc))
        response.headers.append(("Cache-Control", "no-store"))
        response.headers.append(("X-Frame-Options", "DENY"))
        if fresh:
            response.headers.append(csrf.set_cookie_header(token, request.mount, request.secure))
        return response

    def _route(self, request: Request, token: str) -> Response:
        if not self.access.can_view(request.environ):
            return views.error_page(HTTPStatus.FORBIDDEN, "you may not see the locks")
        pages = {"": views.listing, "lock": views.lock_page}
        actions = {"release": (views.release_confirm, views.release_post)}
        actions["purge"] = (views.purge_confirm, views.purge_post)
        if request.path in pages:
            if request.method not in ("GET", "HEAD"):
                return views.error_page(HTTPStatus.METHOD_NOT_ALLOWED, "GET only")
            return pages[request.path](self, request, token)
        if request.path in actions:
            get, post = actions[request.path]
            if request.method == "POST":
                return post(self, request)
            if request.method in ("GET", "HEAD"):
                return get(self, request, token)
            return views.error_page(HTTPStatus.METHOD_NOT_ALLOWED, "GET or POST only")
        return views.error_page(HTTPStatus.NOT_FOUND, f"no page {request.path!r} here")


def _whole(name: str, value: object, least: int) -> int:
    if type(value) is not int or value < least:
        raise ValueError(f"{name} must be an int >= {least}, got {value!r}")
    return value


def make_app(
    celery_app: Any = None,
    *,
    url: str | None = None,
    prefixes: Sequence[str] | None = None,
    access: Access | None = None,
    link_pattern: str | None = None,
    refresh: int = 5,
    page_size: int = 100,
) -> LocksWeb:
    """The locks page of ``celery_app`` (its Redis client and every prefix its locked tasks
    use, as ``celery locks list``) or of the Redis at ``url`` (prefix ``lock`` unless
    ``prefixes`` says otherwise). ``access``: who may look and change (default: everyone
    looks, nobody changes). ``link_pattern``: where a holder's task id links to, with
    ``{task_id}``. ``refresh``: seconds between reloads of the list (0: none). ``page_size``:
    locks per page."""
    if (celery_app is None) == (url is None):
        raise ValueError("give exactly one of celery_app or url (redis://host:port/db)")
    refresh = _whole("refresh", refresh, 0)
    page_size = _whole("page_size", page_size, 1)
    if link_pattern is not None:
        try:
            ok = isinstance(link_pattern, str) and "{task_id}" in link_pattern
            ok = ok and bool(link_pattern.format(task_id="x"))
        except (KeyError, IndexError, ValueError):
            ok = False
        if not ok:
            raise ValueError(
                "link_pattern must be a str with {task_id} and no other field, such as "
                f"'http://flower:5555/task/{{task_id}}', got {link_pattern!r}"
            )
    if prefixes is not None:
        if isinstance(prefixes, str) or not prefixes:
            raise ValueError(f"prefixes must be a non-empty list of str, got {prefixes!r}")
        prefixes = [check_prefix(p, "prefixes") for p in prefixes]
    if access is None:
        access = TokenAccess(None)
    elif not isinstance(access, Access):
        raise TypeError(f"access must be an Access (see TokenAccess), got {access!r}")
    if url is not None:
        import redis

        client = redis.Redis.from_url(url, socket_timeout=5, socket_connect_timeout=5)
        source = Source(client, prefixes or ["lock"])
    else:
        from .._celery.config import LockConfig
        from .._ops.cli import _prefixes

        client = LockConfig.of(celery_app).client
        source = Source(client, prefixes or _prefixes(celery_app), celery_app)
    return LocksWeb(source, access, link_pattern=link_pattern, refresh=refresh, page_size=page_size)
