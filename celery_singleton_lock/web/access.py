"""Who may see the locks page and free locks from it (an :class:`Access` answers for one
request's WSGI ``environ``), and what the page checks before a change: a CSRF cookie the form
repeats and an ``Origin`` (else ``Referer``) among the page's own (standalone: its allowed
names, never the ``Host`` a rebinding site chooses), the token's throttle, an outcome cookie
signed by this process (a link, or another site on the same host name, cannot forge it)."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
import threading
import time
from collections.abc import Callable, Mapping
from http import HTTPStatus
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable
from urllib.parse import urlsplit

if TYPE_CHECKING:
    from .app import LocksWeb
    from .serve import Hosts
    from .views import Request

__all__ = ["MIN_TOKEN", "Access", "CallableAccess", "Outcomes", "TokenAccess"]

Environ = dict[str, Any]
#: the fewest characters a web token may have
MIN_TOKEN = 16
#: set in a request's environ once its form carried the right token
TOKEN_MATCHED = "celery_singleton_lock.token_matched"
CSRF_COOKIE = "csl_csrf"
OUTCOME_COOKIE = "csl_done"
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


@runtime_checkable
class Access(Protocol):
    """What the page asks before it shows or changes anything."""

    needs_token: bool
    """Whether a change needs a token typed into the confirm form."""

    def can_view(self, environ: Environ) -> bool:
        """Whether this request may see the locks."""

    def can_change(self, environ: Environ) -> bool:
        """Whether this request may release or purge (the token, if any, checked apart)."""

    def check_token(self, environ: Environ, form: Mapping[str, str]) -> bool:
        """Whether the posted ``form`` carries the right token (true when none is needed)."""

    def actor(self, environ: Environ) -> str:
        """Who acts, for the log line of a change."""


class TokenAccess:
    """The standalone server's access: whoever reaches it may look; a change needs ``token``
    (16 characters or more) typed into the confirm form. Without one the page is read-only.
    After 3 wrong tokens each one more closes the gate (no token compared) for a delay that
    doubles from 1 s to 60 s; a right token or 10 quiet minutes open it."""

    __slots__ = ("_closed_until", "_failures", "_last", "_lock", "_token", "needs_token")

    def __init__(self, token: str | None) -> None:
        if token is not None and not isinstance(token, str):
            raise TypeError(f"token must be a str or None, got {type(token).__name__}")
        # An empty token (an empty environment variable) must not open the page to changes.
        self._token = token or None
        if self._token is not None and len(self._token) < MIN_TOKEN:
            raise ValueError(
                f"the web token (CELERY_SINGLETON_LOCK_WEB_TOKEN) must have at least "
                f"{MIN_TOKEN} characters, got {len(self._token)}: make one with "
                "`python -c 'import secrets; print(secrets.token_urlsafe(24))'`"
            )
        self.needs_token = self._token is not None
        self._lock = threading.Lock()
        self._failures, self._last, self._closed_until = 0, 0.0, 0.0

    def can_view(self, environ: Environ) -> bool:
        return True

    def can_change(self, environ: Environ) -> bool:
        return self.needs_token

    def wait_left(self) -> float:
        """Seconds before a token may be tried again (0.0: now)."""
        with self._lock:
            return max(0.0, self._closed_until - time.monotonic())

    def check_token(self, environ: Environ, form: Mapping[str, str]) -> bool:
        if self._token is None:
            return False
        given = form.get("token", "").encode("utf-8")
        right = hmac.compare_digest(given, self._token.encode("utf-8"))
        with self._lock:
            now = time.monotonic()
            if right or now - self._last > 600.0:
                self._failures, self._closed_until = 0, 0.0
            if not right:
                self._failures += 1
                self._last = now
                if self._failures >= 3:
                    self._closed_until = now + min(60.0, 2.0 ** (self._failures - 3))
        if right:
            environ[TOKEN_MATCHED] = True
        return right

    def actor(self, environ: Environ) -> str:
        return "holder of the web token" if environ.get(TOKEN_MATCHED) else "anonymous"


class CallableAccess:
    """Access decided by callables of the host framework, each given the request's
    ``environ``; ``can_change`` defaults to ``can_view``."""

    __slots__ = ("_actor", "_can_change", "_can_view")

    needs_token = False

    def __init__(
        self,
        can_view: Callable[[Environ], bool],
        can_change: Callable[[Environ], bool] | None = None,
        actor: Callable[[Environ], str] | None = None,
    ) -> None:
        for name, value in (("can_view", can_view), ("can_change", can_change), ("actor", actor)):
            if value is not None and not callable(value):
                raise TypeError(f"{name} must be a callable, got {value!r}")
        self._can_view = can_view
        self._can_change = can_change or can_view
        self._actor = actor

    def can_view(self, environ: Environ) -> bool:
        return bool(self._can_view(environ))

    def can_change(self, environ: Environ) -> bool:
        return bool(self._can_change(environ))

    def check_token(self, environ: Environ, form: Mapping[str, str]) -> bool:
        return True

    def actor(self, environ: Environ) -> str:
        return (str(self._actor(environ)) if self._actor else "") or "unknown user"


def printable(value: object, limit: int = 200) -> str:
    """``value`` for a log line, cut at ``limit``, unprintable characters escaped (a folded
    header cannot forge a line)."""
    text = str(value)
    shown = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text[:limit])
    return shown + ("..." if len(text) > limit else "")


def where(request: Request) -> str:
    return (
        f"from {printable(request.remote or '?')} (Host {printable(request.host or '-')}, "
        f"Origin {printable(request.origin or '-')})"
    )


def cookie(name: str, value: str, path: str, secure: bool, max_age: int | None = None) -> str:
    """A ``Set-Cookie`` value of the page (its path only, HttpOnly, SameSite=Strict)."""
    age = "" if max_age is None else f"; Max-Age={max_age}"
    https = "; Secure" if secure else ""
    return f"{name}={value}; Path={path}{age}; HttpOnly; SameSite=Strict{https}"


def _is_own(origin: str, request: Request, hosts: Hosts | None) -> bool:
    if hosts is not None:
        return origin.lower().rstrip("/") in hosts.origins
    scheme = "https" if request.secure else "http"
    return bool(request.host) and origin.lower() == f"{scheme}://{request.host}".lower()


def _csrf_problem(request: Request, hosts: Hosts | None) -> str | None:
    """Why a POST fails the CSRF check; ``hosts``: the standalone server's (``None``: mounted)."""
    cookie_value, posted = request.cookies.get(CSRF_COOKIE), request.form.get("csrf", "")
    if not cookie_value or not posted:
        return "the form carries no CSRF token (reload the page and try again)"
    if not hmac.compare_digest(cookie_value.encode("utf-8"), posted.encode("utf-8")):
        return "the form's CSRF token does not match the cookie (reload the page and try again)"
    # Origin wins when present ("null" from a sandboxed frame is refused too).
    if request.origin and not _is_own(request.origin, request, hosts):
        return "the request comes from another origin (its Origin is not one of the page's)"
    if not request.origin and request.referer:
        try:
            parts = urlsplit(request.referer)
            referer = f"{parts.scheme}://{parts.netloc}" if parts.scheme and parts.netloc else ""
        except ValueError:
            referer = ""
        if not _is_own(referer, request, hosts):
            return "the request comes from another site (its Referer names another host)"
    return None


def change_refused(web: LocksWeb, request: Request, posted: bool) -> tuple[int, str] | None:
    """403 and why when this request may not change (or, ``posted``, its form fails a check);
    429 while wrong tokens have closed the gate (the token is then not compared at all)."""
    access, environ = web.access, request.environ
    status = HTTPStatus.FORBIDDEN
    why = None if access.can_change(environ) else "you may not release or purge locks"
    if why is None and posted:
        why = _csrf_problem(request, web.hosts)
        wait = access.wait_left() if isinstance(access, TokenAccess) else 0.0
        if why is None and wait > 0:
            status = HTTPStatus.TOO_MANY_REQUESTS
            why = f"too many wrong tokens: try again in {wait:.0f} s"
        elif why is None and access.needs_token and not access.check_token(environ, request.form):
            why = "the token is missing or wrong"
    if why is None:
        return None
    if posted:
        web.refused(
            f"refused a {printable(request.path)} by {access.actor(environ)} "
            f"{where(request)}: {why}"
        )
    return status, why


class Outcomes:
    """Sign and read outcome cookies with a key made for this page's process."""

    def __init__(self) -> None:
        self._key = secrets.token_bytes(32)

    def _mac(self, payload: str) -> str:
        return hmac.new(self._key, payload.encode(), hashlib.sha256).hexdigest()[:32]

    def cookie(self, code: str, detail: str, path: str, secure: bool) -> str:
        """The ``Set-Cookie`` value carrying ``code`` and ``detail`` (cut to a banner's size);
        it lives a minute: the redirect follows at once."""
        shown = detail if len(detail) <= SHOWN else detail[:SHOWN] + "..."
        raw = json.dumps([code, shown]).encode("utf-8", "surrogatepass")
        payload = base64.urlsafe_b64encode(raw).decode("ascii").rstrip("=")
        return cookie(OUTCOME_COOKIE, f"{payload}.{self._mac(payload)}", path, secure, 60)

    def banner(self, value: str) -> str | None:
        """The banner of a cookie this process signed (only :meth:`cookie` makes one), else
        ``None``."""
        payload, _, mac = value.partition(".")
        if not payload or not hmac.compare_digest(mac.encode(), self._mac(payload).encode()):
            return None
        raw = base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4))
        code, detail = json.loads(raw.decode("utf-8", "surrogatepass"))
        return BANNERS[code].format(detail)
