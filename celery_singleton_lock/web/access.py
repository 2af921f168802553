"""Who may see the locks page and who may free locks from it: an :class:`Access` answers for
one request (its WSGI ``environ``). The standalone server uses :class:`TokenAccess`; the Flask
and Django mounts a :class:`CallableAccess` of the host framework's own login."""

from __future__ import annotations

import hmac
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol, runtime_checkable

__all__ = ["MIN_TOKEN", "Access", "CallableAccess", "Throttle", "TokenAccess"]

Environ = dict[str, Any]
#: the fewest characters a web token may have
MIN_TOKEN = 16
#: set in a request's environ once its form carried the right token
TOKEN_MATCHED = "celery_singleton_lock.token_matched"


@runtime_checkable
class Access(Protocol):
    """What the page asks before it shows or changes anything."""

    @property
    def needs_token(self) -> bool:
        """Whether a change needs a token typed into the confirm form."""

    def can_view(self, environ: Environ) -> bool:
        """Whether this request may see the locks."""

    def can_change(self, environ: Environ) -> bool:
        """Whether this request may release or purge (the token, if any, checked apart)."""

    def check_token(self, environ: Environ, form: Mapping[str, str]) -> bool:
        """Whether the posted ``form`` carries the right token (true when none is needed)."""

    def actor(self, environ: Environ) -> str:
        """Who acts, for the log line of a change."""


class Throttle:
    """Wrong tokens' price: after ``free`` wrong tries, each further one closes the gate for
    a delay that doubles (``first`` seconds, up to ``most``); a try while the gate is closed
    is refused without being compared. A right token opens it again; so do ``forget`` quiet
    seconds."""

    def __init__(
        self, free: int = 3, first: float = 1.0, most: float = 60.0, forget: float = 600.0
    ) -> None:
        self.free, self.first, self.most, self.forget = free, first, most, forget
        self._lock = threading.Lock()
        self._failures, self._last, self._closed_until = 0, 0.0, 0.0

    def wait_left(self) -> float:
        """Seconds before a token may be tried again (0.0: now)."""
        with self._lock:
            return max(0.0, self._closed_until - time.monotonic())

    def failed(self) -> None:
        with self._lock:
            now = time.monotonic()
            if now - self._last > self.forget:
                self._failures = 0
            self._failures += 1
            self._last = now
            over = self._failures - self.free
            if over >= 0:
                self._closed_until = now + min(self.most, self.first * 2.0**over)

    def passed(self) -> None:
        with self._lock:
            self._failures, self._closed_until = 0, 0.0


class TokenAccess:
    """The standalone server's access: everyone who reaches it may look (it listens on
    loopback by default); a change needs ``token`` (16 characters or more) typed into the
    confirm form. Without a token the page is read-only: no release link, every POST refused."""

    __slots__ = ("_token", "throttle")

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
        self.throttle = Throttle()

    @property
    def needs_token(self) -> bool:
        return self._token is not None

    def can_view(self, environ: Environ) -> bool:
        return True

    def can_change(self, environ: Environ) -> bool:
        return self._token is not None

    def check_token(self, environ: Environ, form: Mapping[str, str]) -> bool:
        if self._token is None:
            return False
        given = form.get("token", "")
        if hmac.compare_digest(given.encode("utf-8"), self._token.encode("utf-8")):
            self.throttle.passed()
            environ[TOKEN_MATCHED] = True
            return True
        self.throttle.failed()
        return False

    def actor(self, environ: Environ) -> str:
        return "holder of the web token" if environ.get(TOKEN_MATCHED) else "anonymous"


class CallableAccess:
    """Access decided by callables of the host framework, each given the request's
    ``environ``; ``can_change`` defaults to ``can_view``."""

    __slots__ = ("_actor", "_can_change", "_can_view")

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

    @property
    def needs_token(self) -> bool:
        return False

    def can_view(self, environ: Environ) -> bool:
        return bool(self._can_view(environ))

    def can_change(self, environ: Environ) -> bool:
        return bool(self._can_change(environ))

    def check_token(self, environ: Environ, form: Mapping[str, str]) -> bool:
        return True

    def actor(self, environ: Environ) -> str:
        return (str(self._actor(environ)) if self._actor else "") or "unknown user"
