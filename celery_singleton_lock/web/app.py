"""The page as a WSGI app (:class:`LocksWeb`, made by :func:`make_app`): a request within
its deadline, checked (:mod:`.access`) and routed to :mod:`.views`."""

from __future__ import annotations

import logging
import re
import secrets
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from http import HTTPStatus
from typing import TYPE_CHECKING, Any

from redis.exceptions import RedisError

from .._errors import LockError
from .._lock import check_prefix, operation_deadline
from . import access as guard
from . import views
from .access import Access, Environ, TokenAccess
from .data import MAX_AT_ONCE, REQUEST_SECONDS, Source, own_client
from .views import BadRequest, Request, Response, error_page

if TYPE_CHECKING:
    from .serve import Hosts

__all__ = ["LocksWeb", "make_app"]

log = logging.getLogger("celery_singleton_lock.web")

#: on every answer: no script, style or form target of another origin, no framing, no
#: sniffing, no Referer to other sites (a lock page's URL carries its key), no caching
HEADERS = {
    "Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'; "
    "form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
    "X-Frame-Options": "DENY",
}


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
        self.source, self.access, self.link_pattern = source, access, link_pattern
        self.refresh, self.page_size = refresh, page_size
        # half a reload (a second at least): Redis is read about twice a refresh however many
        # tabs are open, and no tab sees a list older than its own reload
        source.shared.fresh = max(1.0, refresh / 2)
        #: the standalone server's names (:func:`.serve.make_server`); mounted, ``None``
        self.hosts: Hosts | None = None
        #: seconds between two log lines of refusals at most: a flood does not flood the log
        self.refusal_every = 5.0
        self._refusals = threading.Lock()
        self._last_refusal, self._quiet = -float("inf"), 0
        self._at_once = threading.BoundedSemaphore(MAX_AT_ONCE)
        self.outcomes = guard.Outcomes()

    def __call__(self, environ: Environ, start_response: Callable[..., Any]) -> Iterable[bytes]:
        response = self.handle(Request(environ))
        start_response(f"{response.status} {HTTPStatus(response.status).phrase}", response.headers)
        return [response.body]

    def refused(self, message: str) -> None:
        """Log a refusal, unless one was logged less than ``refusal_every`` seconds ago: then
        the next line says how many were not logged meanwhile."""
        with self._refusals:
            now = time.monotonic()
            if now - self._last_refusal < self.refusal_every:
                self._quiet += 1
                return
            quiet, self._quiet, self._last_refusal = self._quiet, 0, now
        more = f" (and {quiet} more refused since the last such line)" if quiet else ""
        log.warning("%s%s", message, more)

    def handle_mounted(
        self, environ: Environ, full: str, sub: str, form: dict[str, str]
    ) -> Response:
        """A request Flask or Django routed to ``sub`` ("", "lock", ...) of the page at the
        path ``full``, its ``form`` read."""
        mount = full[: len(full) - len(sub)] if sub and full.endswith(sub) else full
        return self.handle(Request(environ, sub, mount, form))

    def handle(self, request: Request) -> Response:
        """Route ``request``; every answer sets the CSRF cookie when it was missing."""
        fresh = not request.cookies.get(guard.CSRF_COOKIE)
        token = secrets.token_urlsafe(32) if fresh else request.cookies[guard.CSRF_COOKIE]
        # the others answered at once, not piled up behind a slow Redis
        if not self._at_once.acquire(blocking=False):
            response = error_page(
                HTTPStatus.SERVICE_UNAVAILABLE,
                f"the page is serving {MAX_AT_ONCE} requests already: try again shortly",
            )
            response.headers.append(("Retry-After", "2"))
        else:
            try:
                with operation_deadline(REQUEST_SECONDS):
                    response = self._route(request, token)
            except BadRequest as exc:
                response = error_page(HTTPStatus.BAD_REQUEST, str(exc))
            except views.NotHeld as exc:
                response = error_page(HTTPStatus.NOT_FOUND, str(exc))
            except (LockError, RedisError) as exc:  # Redis down, slow or hung: no traceback
                log.warning("the locks page could not read Redis: %s", guard.printable(exc, 500))
                response = error_page(HTTPStatus.SERVICE_UNAVAILABLE, str(exc))
            except Exception:  # anything else: the page's own 500, with its headers
                log.exception("the locks page failed on a %s", guard.printable(request.method))
                response = error_page(
                    HTTPStatus.INTERNAL_SERVER_ERROR,
                    "the page failed unexpectedly: its log (celery_singleton_lock.web) says why",
                )
            finally:
                self._at_once.release()
        response.headers.extend(HEADERS.items())
        if fresh:
            csrf_cookie = guard.cookie(guard.CSRF_COOKIE, token, request.mount, request.secure)
            response.headers.append(("Set-Cookie", csrf_cookie))
        return response

    def _route(self, request: Request, token: str) -> Response:
        # first, whatever the method: a name it does not answer to is a rebinding site's
        if self.hosts is not None and request.host.lower() not in self.hosts.hosts:
            self.refused(
                f"refused a {guard.printable(request.method)} by "
                f"{self.access.actor(request.environ)} for a Host the page does not answer to "
                f"{guard.where(request)}"
            )
            return error_page(
                HTTPStatus.MISDIRECTED_REQUEST,
                "this server does not answer to that name: open it at http://127.0.0.1:PORT/, "
                "or start it with --allowed-host NAME for the name a proxy sends",
            )
        if request.form_problem is not None:
            return error_page(*request.form_problem)
        if not self.access.can_view(request.environ):
            return error_page(HTTPStatus.FORBIDDEN, "you may not see the locks")
        if request.path not in ROUTES:
            return error_page(HTTPStatus.NOT_FOUND, f"no page {request.path!r} here")
        get, post = ROUTES[request.path]
        posted = request.method == "POST" and post is not None
        if not posted and request.method not in ("GET", "HEAD"):
            allowed = "GET or POST only" if post else "GET only"
            return error_page(HTTPStatus.METHOD_NOT_ALLOWED, allowed)
        if post is None:
            return get(self, request, token)
        # a change's confirmation and its POST: refused before anything is read or freed
        refused = guard.change_refused(self, request, posted)
        if refused is not None:
            return error_page(*refused)
        return post(self, request) if posted else get(self, request, token)


ROUTES: dict[str, tuple[Callable[..., Response], Callable[..., Response] | None]] = {
    "": (views.listing, None),
    "lock": (views.lock_page, None),
    "release": (views.release_confirm, views.release_post),
    "purge": (views.purge_confirm, views.purge_post),
}


def make_app(
    celery_app: Any = None,
    *,
    url: str | None = None,
    prefixes: Sequence[str] | None = None,
    access: Access | None = None,
    link_pattern: str | None = None,
    refresh: int = 5,
    page_size: int = 100,
    max_locks: int = 2000,
) -> LocksWeb:
    """The locks page of ``celery_app`` (its Redis and every prefix its locked tasks use) or
    of the Redis at ``url`` (prefix ``lock`` unless ``prefixes`` says otherwise). ``access``:
    who may look and change (default: everyone looks, nobody changes). ``link_pattern``: a
    holder's link, with ``{task_id}``. ``refresh``: seconds between reloads of the list (0:
    none). ``page_size``: locks per page. ``max_locks``: the most locks one read looks at
    (beyond, a filter by text finds the others)."""
    if (celery_app is None) == (url is None):
        raise ValueError("give exactly one of celery_app or url (redis://host:port/db)")
    whole = (("refresh", refresh, 0), ("page_size", page_size, 1), ("max_locks", max_locks, 1))
    for name, value, least in whole:
        if type(value) is not int or value < least:
            raise ValueError(f"{name} must be an int >= {least}, got {value!r}")
    if link_pattern is not None:
        # the task id alone, or another scheme, would let a task id (``javascript:``) be the link
        text = link_pattern.lower() if isinstance(link_pattern, str) else ""
        try:
            ok = "{task_id}" in text and bool(str(link_pattern).format(task_id="x"))
        except (KeyError, IndexError, ValueError):
            ok = False
        if not ok or not re.match(r"https?://(?!\{)|/(?!/)", text):
            raise ValueError(
                "link_pattern must be an http:// or https:// URL, or a path starting with /, "
                "with {task_id} and no other field, such as "
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
        source = Source(own_client(url), prefixes or ["lock"], max_locks=max_locks)
    else:
        from .._celery.config import LockConfig
        from .._ops.target import app_prefixes

        client = own_client(LockConfig.of(celery_app).client)
        source = Source(client, prefixes or app_prefixes(celery_app), celery_app, max_locks)
    return LocksWeb(source, access, link_pattern=link_pattern, refresh=refresh, page_size=page_size)
