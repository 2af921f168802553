"""Who may see the locks page and who may free locks from it.

An :class:`Access` answers for one request (its WSGI ``environ``). The standalone server uses
:class:`TokenAccess`; the Flask blueprint and the Django views use :class:`CallableAccess`
with the host framework's own login.
"""

from __future__ import annotations

import hmac
from collections.abc import Callable, Mapping
from typing import Any, Protocol, runtime_checkable

from .guard import Throttle

__all__ = ["MIN_TOKEN", "Access", "CallableAccess", "TokenAccess"]

#: a request's WSGI environ
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


class TokenAccess:
    """The standalone server's access: everyone who reaches it may look (it listens on
    loopback by default); a change needs ``token`` (16 characters or more) typed into the
    confirm form. Without a token the page is read-only: no release link, every POST refused.
    Wrong tokens slow down: after a few, each further try waits longer (:class:`Throttle`)."""

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
        """Who acts: "anonymous" until this request's form carried the right token."""
        return "holder of the web token" if environ.get(TOKEN_MATCHED) else "anonymous"


class CallableAccess:
    """Access decided by callables of the host framework, each given the request's
    ``environ`` (the blueprint's and the Django views' wrap their own callables in these)."""

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
        if self._actor is None:
            return "unknown user"
        return str(self._actor(environ)) or "unknown user"
