"""What the page checks before a change, the cookies it trusts, and how it logs a refusal.

CSRF: a double-submit cookie and a same-origin check. Every page sets a random cookie
(HttpOnly, SameSite=Strict) when the browser has none; a confirm form repeats its value in a
hidden field. A POST passes only when both are there and equal (compared in constant time),
and when its ``Origin`` (else ``Referer``) header, if the browser sent one, is an origin the
page is served at: standalone, one of its allowed names (:class:`~.serve.Hosts`, scheme
included), never the request's own ``Host``, which a rebinding site chooses; behind Flask or
Django, the scheme and host the framework accepted. Another site can neither read the cookie
nor make a browser send it with a cross-site POST.

A change's outcome reaches the list it redirects to in a short-lived cookie signed with a key
of this process (:class:`Outcomes`), not in the URL: a crafted link could put words of its own
in the banner, and another site on the same host name (cookies do not keep ports apart) could
set the cookie.

Log lines escape every value a client sends (:func:`printable`: a folded header cannot forge
a line), and refusals are logged at most once every few seconds (:class:`RefusalLog`), so a
flood of wrong tries does not flood the log.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import logging
import secrets
import threading
import time
from http import HTTPStatus
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from .access import TokenAccess
from .messages import Request

if TYPE_CHECKING:
    from .app import LocksWeb
    from .serve import Hosts

__all__ = ["CSRF_COOKIE", "OUTCOME_COOKIE", "Outcomes", "RefusalLog", "change_refused"]

log = logging.getLogger("celery_singleton_lock.web")

CSRF_COOKIE = "csl_csrf"
OUTCOME_COOKIE = "csl_done"
#: seconds the outcome cookie lives: the redirect follows at once
OUTCOME_SECONDS = 60
#: the characters of a key the banner shows at most
SHOWN = 300
#: the banner of each outcome code: only these texts are shown
BANNERS = {
    "released": "Released {}.",
    "not-held": "{} was not held: nothing released.",
    "reset": "Reset the rate limiter {}.",
    "not-in-use": "The rate limiter {} was not in use: nothing reset.",
    "purged": "Released {} lock(s).",
}


def printable(value: object, limit: int = 200) -> str:
    """``value`` for a log line: unprintable characters escaped, cut at ``limit``."""
    text = str(value)
    shown = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text[:limit])
    return shown + ("..." if len(text) > limit else "")


def where(request: Request) -> str:
    """Where a request came from, for a log line."""
    return (
        f"from {printable(request.remote or '?')} (Host {printable(request.host or '-')}, "
        f"Origin {printable(request.origin or '-')})"
    )


class RefusalLog:
    """Refusals logged as WARNINGs, at most one line each ``every`` seconds; the next line
    says how many were not logged meanwhile."""

    def __init__(self, log: logging.Logger, every: float = 5.0) -> None:
        self.log, self.every = log, every
        self._lock = threading.Lock()
        self._last = -float("inf")
        self._quiet = 0

    def refused(self, message: str) -> None:
        with self._lock:
            now = time.monotonic()
            if now - self._last < self.every:
                self._quiet += 1
                return
            quiet, self._quiet, self._last = self._quiet, 0, now
        more = f" (and {quiet} more refused since the last such line)" if quiet else ""
        self.log.warning("%s%s", message, more)


def cookie(name: str, value: str, path: str, secure: bool, max_age: int | None = None) -> str:
    """A ``Set-Cookie`` value of the page (its path only, HttpOnly, SameSite=Strict)."""
    age = "" if max_age is None else f"; Max-Age={max_age}"
    https = "; Secure" if secure else ""
    return f"{name}={value}; Path={path}{age}; HttpOnly; SameSite=Strict{https}"


def new_csrf_token() -> str:
    return secrets.token_urlsafe(32)


def origin_of(url: str) -> str:
    """``scheme://host[:port]`` of ``url`` ("" when it has none)."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return ""
    return f"{parts.scheme}://{parts.netloc}".lower() if parts.scheme and parts.netloc else ""


def _is_own(origin: str, request: Request, hosts: Hosts | None) -> bool:
    if hosts is not None:
        return hosts.allows_origin(origin)
    scheme = "https" if request.secure else "http"
    return bool(request.host) and origin.lower() == f"{scheme}://{request.host}".lower()


def csrf_problem(request: Request, hosts: Hosts | None) -> str | None:
    """Why a POST fails the CSRF check, or ``None``; ``hosts``: the standalone server's names
    (``None``: mounted)."""
    cookie_value, posted = request.cookies.get(CSRF_COOKIE), request.form.get("csrf", "")
    if not cookie_value or not posted:
        return "the form carries no CSRF token (reload the page and try again)"
    if not hmac.compare_digest(cookie_value.encode("utf-8"), posted.encode("utf-8")):
        return "the form's CSRF token does not match the cookie (reload the page and try again)"
    # Origin wins when present ("null" from a sandboxed frame is refused too).
    if request.origin and not _is_own(request.origin, request, hosts):
        return "the request comes from another origin (its Origin is not one of the page's)"
    referer = origin_of(request.referer)
    if not request.origin and request.referer and not _is_own(referer, request, hosts):
        return "the request comes from another site (its Referer names another host)"
    return None


def change_refused(web: LocksWeb, request: Request, posted: bool) -> tuple[int, str] | None:
    """403 and why when this request may not change (or, ``posted``, its form fails a check);
    429 while wrong tokens have closed the gate (the token is then not compared at all)."""
    access, environ = web.access, request.environ
    status = HTTPStatus.FORBIDDEN
    why = None if access.can_change(environ) else "you may not release or purge locks"
    if why is None and posted:
        why = csrf_problem(request, web.hosts)
        wait = access.throttle.wait_left() if isinstance(access, TokenAccess) else 0.0
        if why is None and wait > 0:
            status = HTTPStatus.TOO_MANY_REQUESTS
            why = f"too many wrong tokens: try again in {wait:.0f} s"
        elif why is None and access.needs_token and not access.check_token(environ, request.form):
            why = "the token is missing or wrong"
    if why is None:
        return None
    if posted:
        web.refusals.refused(
            f"refused a {printable(request.path)} by {access.actor(environ)} "
            f"{where(request)}: {why}"
        )
    return status, why


class Outcomes:
    """Sign and read outcome cookies with a key made for this page's process."""

    def __init__(self) -> None:
        self._key = secrets.token_bytes(32)

    def _mac(self, payload: str) -> str:
        return hmac.new(self._key, payload.encode("ascii"), hashlib.sha256).hexdigest()[:32]

    def cookie(self, code: str, detail: str, path: str, secure: bool) -> str:
        """The ``Set-Cookie`` value carrying ``code`` and ``detail`` (cut to a banner's size)."""
        shown = detail if len(detail) <= SHOWN else detail[:SHOWN] + "..."
        raw = json.dumps([code, shown]).encode("utf-8", "surrogatepass")
        payload = base64.urlsafe_b64encode(raw).decode("ascii").rstrip("=")
        value = f"{payload}.{self._mac(payload)}"
        return cookie(OUTCOME_COOKIE, value, path, secure, OUTCOME_SECONDS)

    def banner(self, value: str) -> str | None:
        """The banner of a cookie this process signed, else ``None``."""
        payload, _, mac = value.partition(".")
        if not payload or not hmac.compare_digest(mac.encode(), self._mac(payload).encode()):
            return None
        try:
            raw = base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4))
            code, detail = json.loads(raw.decode("utf-8", "surrogatepass"))
        except ValueError:
            return None
        if not isinstance(code, str) or code not in BANNERS or not isinstance(detail, str):
            return None
        if not detail or (code == "purged" and not detail.isdecimal()):
            return None
        return BANNERS[code].format(detail)
