"""The page's own CSRF protection: a double-submit cookie and a same-origin check.

Every page sets a random cookie (HttpOnly, SameSite=Strict) when the browser has none; a
confirm form carries its value in a hidden field. A POST is accepted only when both are there
and equal (compared in constant time), and when its ``Origin`` (or else ``Referer``) header,
if the browser sent one, is an origin the page is served at: for the standalone server, one of
its allowed names (:class:`~.guard.Hosts`, scheme included), never the request's own ``Host``,
which a rebinding site chooses; behind Flask or Django, the scheme and host the framework
accepted. Another site can neither read the cookie nor make a browser send it with a
cross-site POST.
"""

from __future__ import annotations

import hmac
import secrets
from collections.abc import Callable, Mapping
from urllib.parse import urlsplit

__all__ = ["COOKIE", "FIELD", "check", "new_token", "set_cookie_header"]

#: the cookie's name
COOKIE = "csl_csrf"
#: the form field that carries the cookie's value
FIELD = "csrf"


def new_token() -> str:
    """A fresh random token (URL-safe, 256 bits)."""
    return secrets.token_urlsafe(32)


def set_cookie_header(token: str, path: str, secure: bool) -> tuple[str, str]:
    """The ``Set-Cookie`` header of ``token``, scoped to the page's ``path``."""
    attributes = f"{COOKIE}={token}; Path={path}; HttpOnly; SameSite=Strict"
    return "Set-Cookie", attributes + ("; Secure" if secure else "")


def origin_of(url: str) -> str:
    """``scheme://host[:port]`` of ``url`` ("" when it has none)."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return ""
    return f"{parts.scheme}://{parts.netloc}".lower() if parts.scheme and parts.netloc else ""


def check(
    cookie: str | None,
    form: Mapping[str, str],
    allows: Callable[[str], bool],
    origin: str,
    referer: str,
) -> str | None:
    """Why a POST is refused, or ``None`` when it passes. ``allows``: whether an origin
    (``scheme://host[:port]``) is the page's own; ``origin`` and ``referer`` the request's
    headers ("" when absent)."""
    posted = form.get(FIELD, "")
    if not cookie or not posted:
        return "the form carries no CSRF token (reload the page and try again)"
    if not hmac.compare_digest(cookie.encode("utf-8"), posted.encode("utf-8")):
        return "the form's CSRF token does not match the cookie (reload the page and try again)"
    # Origin wins when present ("null" from a sandboxed frame is refused too).
    if origin and not allows(origin):
        return "the request comes from another origin (its Origin is not one of the page's)"
    if not origin and referer and not allows(origin_of(referer)):
        return "the request comes from another site (its Referer names another host)"
    return None
