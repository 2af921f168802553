"""The page's own CSRF protection: a double-submit cookie and a same-origin check.

Every page sets a random cookie (HttpOnly, SameSite=Strict) when the browser has none; a
confirm form carries its value in a hidden field. A POST is accepted only when both are there
and equal (compared in constant time), and when its ``Origin`` (or else ``Referer``) header,
if the browser sent one, names the host the request was sent to. Another site can neither read
the cookie nor make a browser send it with a cross-site POST.
"""

from __future__ import annotations

import hmac
import secrets
from collections.abc import Mapping
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


def _same_host(url: str, host: str) -> bool:
    try:
        return urlsplit(url).netloc.lower() == host.lower()
    except ValueError:
        return False


def check(
    cookie: str | None, form: Mapping[str, str], host: str, origin: str, referer: str
) -> str | None:
    """Why a POST is refused, or ``None`` when it passes. ``host`` is the request's Host
    header; ``origin`` and ``referer`` its headers ("" when absent)."""
    posted = form.get(FIELD, "")
    if not cookie or not posted:
        return "the form carries no CSRF token (reload the page and try again)"
    if not hmac.compare_digest(cookie.encode("utf-8"), posted.encode("utf-8")):
        return "the form's CSRF token does not match the cookie (reload the page and try again)"
    # Origin wins when present ("null" from a sandboxed frame is refused too).
    if origin and not _same_host(origin, host):
        return f"the request comes from another origin ({origin})"
    if not origin and referer and not _same_host(referer, host):
        return "the request comes from another site (its Referer names another host)"
    return None
