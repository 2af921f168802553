"""What the page checks before it routes a request, and how it logs a refusal.

- :class:`Hosts`: the names the standalone server answers to. A site the operator visits can
  point a name of its own at 127.0.0.1 (DNS rebinding): its pages are then same-origin with
  the locks page by the browser's rules, and their requests carry that name as ``Host``. So a
  request is answered only when its ``Host`` is a loopback name with the server's port, the
  ``--host`` it listens on, or a name given with ``--allowed-host`` (a proxy's); the CSRF
  origin check compares ``Origin`` with the same list (scheme included), never with ``Host``.
- :class:`Throttle`: wrong tokens slow down (after a few, each further try waits longer).
- :class:`RefusalLog`: refusals logged at most once every few seconds, with a count of those
  not logged, so a flood of wrong tries does not flood the log.
- :func:`printable`: a header or form value as a log line may show it (control characters
  escaped: a folded header cannot forge a line).
"""

from __future__ import annotations

import ipaddress
import logging
import threading
import time
from collections.abc import Iterable

__all__ = ["Hosts", "RefusalLog", "Throttle", "printable"]

#: loopback names a browser on the server's machine may use
LOOPBACK = ("127.0.0.1", "localhost", "[::1]")


def printable(value: object, limit: int = 200) -> str:
    """``value`` for a log line: control and other unprintable characters escaped
    (``\\n``, ``\\x1b``), cut at ``limit`` characters."""
    text = str(value)
    cut = len(text) > limit
    shown = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text[:limit])
    return shown + ("..." if cut else "")


def _bracketed(host: str) -> str:
    """An IPv6 address in brackets, as it appears in a ``Host`` header; other names as given."""
    try:
        return f"[{host}]" if ipaddress.ip_address(host).version == 6 else host
    except ValueError:
        return host


def _all_interfaces(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_unspecified
    except ValueError:
        return False


class Hosts:
    """The ``Host`` values and browser origins a server answers (lower-case)."""

    def __init__(self, hosts: Iterable[str], origins: Iterable[str]) -> None:
        self.hosts = frozenset(h.lower() for h in hosts)
        self.origins = frozenset(o.lower().rstrip("/") for o in origins)

    @classmethod
    def of_server(cls, host: str, port: int, allowed: Iterable[str] = ()) -> Hosts:
        """The names of a server listening on ``host:port``: the loopback names and ``host``
        with the port, and each of ``allowed``: ``name``, ``name:port`` (over http or https)
        or an origin ``https://name[:port]`` (over its scheme only)."""
        hosts: list[str] = []
        origins: list[str] = []
        names = [*LOOPBACK, *([] if _all_interfaces(host) else [_bracketed(host)])]
        for name in names:
            hosts.append(f"{name}:{port}")
            origins.append(f"http://{name}:{port}")
        for value in allowed:
            checked = check_allowed_host(value)
            if "://" in checked:
                hosts.append(checked.split("://", 1)[1])
                origins.append(checked)
            else:
                hosts.append(checked)
                origins.extend((f"http://{checked}", f"https://{checked}"))
        return cls(hosts, origins)

    def allows_host(self, host: str) -> bool:
        return host.lower() in self.hosts

    def allows_origin(self, origin: str) -> bool:
        return origin.lower().rstrip("/") in self.origins


def check_allowed_host(value: object) -> str:
    """An ``--allowed-host`` value checked: a name (``locks.example.com``), ``name:port`` or
    an origin (``https://locks.example.com``); a clear error otherwise."""
    text = value.strip().lower() if isinstance(value, str) else ""
    name = text.split("://", 1)[1] if text.startswith(("http://", "https://")) else text
    if not name or any(c in name for c in "/?#@ \t*") or not name.isascii():
        raise ValueError(
            "allowed_hosts (--allowed-host) must be a host name as a proxy sends it in Host, "
            "such as 'locks.example.com', 'locks.example.com:8443' or "
            f"'https://locks.example.com', got {value!r}"
        )
    return text


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
        self._failures = 0
        self._last = 0.0
        self._closed_until = 0.0

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
