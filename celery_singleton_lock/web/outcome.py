"""What a change did, carried to the list it redirects to in a short-lived cookie (not in the
URL: a crafted link could put words of its own in the success banner, and a long key would
not fit in a URL). The cookie is signed with a key of this process, so another site on the
same host name (cookies do not keep ports apart) cannot set a banner either."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets

__all__ = ["COOKIE", "Outcomes"]

#: the cookie's name
COOKIE = "csl_done"
#: seconds the cookie lives: the redirect follows at once
MAX_AGE = 60
#: the characters of a key the banner shows at most
SHOWN = 300


class Outcomes:
    """Sign and read outcome cookies with a key made for this page's process."""

    def __init__(self) -> None:
        self._key = secrets.token_bytes(32)

    def _mac(self, payload: str) -> str:
        return hmac.new(self._key, payload.encode("ascii"), hashlib.sha256).hexdigest()[:32]

    def cookie(self, code: str, detail: str, path: str, secure: bool) -> tuple[str, str]:
        """The ``Set-Cookie`` header carrying ``code`` and ``detail`` (cut to a banner's size)."""
        shown = detail if len(detail) <= SHOWN else detail[:SHOWN] + "..."
        raw = json.dumps([code, shown]).encode("utf-8", "surrogatepass")
        payload = base64.urlsafe_b64encode(raw).decode("ascii").rstrip("=")
        value = f"{payload}.{self._mac(payload)}"
        attributes = f"{COOKIE}={value}; Path={path}; Max-Age={MAX_AGE}; HttpOnly; SameSite=Strict"
        return "Set-Cookie", attributes + ("; Secure" if secure else "")

    def read(self, value: str) -> tuple[str, str] | None:
        """``(code, detail)`` of a cookie this process signed, else ``None``."""
        payload, _, mac = value.partition(".")
        if not payload or not hmac.compare_digest(mac.encode(), self._mac(payload).encode()):
            return None
        try:
            raw = base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4))
            code, detail = json.loads(raw.decode("utf-8", "surrogatepass"))
        except ValueError:
            return None
        return (code, detail) if isinstance(code, str) and isinstance(detail, str) else None

    @staticmethod
    def clear(path: str) -> tuple[str, str]:
        """The ``Set-Cookie`` header that removes the cookie (its banner was shown)."""
        return "Set-Cookie", f"{COOKIE}=; Path={path}; Max-Age=0; HttpOnly; SameSite=Strict"
