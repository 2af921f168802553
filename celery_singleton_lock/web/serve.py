"""``celery -A proj locks web``: the page on the stdlib's WSGI server, a thread per request.
The token is read from the environment only (a command line shows in ``ps``). The server
answers only its own names (:class:`Hosts`): a site the operator visits can point a name of
its own at 127.0.0.1 (DNS rebinding) and send it as ``Host``, its pages then same-origin
with the locks page by the browser's rules."""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import os
import socketserver
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple
from wsgiref import simple_server
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

import click

from .._ops.target import prefix_option, target, url_option
from .access import TokenAccess
from .app import LocksWeb, make_app

__all__ = ["TOKEN_ENV", "Hosts", "make_server", "web"]

log = logging.getLogger("celery_singleton_lock.web")

#: the environment variable holding the token that allows releases and purges
TOKEN_ENV = "CELERY_SINGLETON_LOCK_WEB_TOKEN"


def _ip(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None


def check_allowed_host(value: object) -> str:
    """An ``--allowed-host`` value checked: ``name``, ``name:port`` or ``https://name``."""
    text = value.strip().lower() if isinstance(value, str) else ""
    name = text.split("://", 1)[1] if text.startswith(("http://", "https://")) else text
    if not name or any(c in name for c in "/?#@ \t*") or not name.isascii():
        raise ValueError(
            "allowed_hosts (--allowed-host) must be a host name as a proxy sends it in Host, "
            "such as 'locks.example.com', 'locks.example.com:8443' or "
            f"'https://locks.example.com', got {value!r}"
        )
    return text


class Hosts(NamedTuple):
    """The ``Host`` values and browser origins a server answers (lower-case)."""

    hosts: frozenset[str]
    origins: frozenset[str]

    @classmethod
    def of_server(cls, host: str, port: int, allowed: Iterable[str] = ()) -> Hosts:
        """The loopback names and ``host`` with ``port``, and each of ``allowed``: ``name``
        or ``name:port`` (over http or https), or an origin ``https://name[:port]``."""
        ip = _ip(host)
        names = ["127.0.0.1", "localhost", "[::1]"]
        if not (ip and ip.is_unspecified):
            names.append(f"[{host}]" if ip and ip.version == 6 else host)
        hosts = [f"{name}:{port}" for name in names]
        origins = [f"http://{name}:{port}" for name in names]
        for value in allowed:
            scheme, _, name = check_allowed_host(value).rpartition("://")
            hosts.append(name)
            origins += [f"{scheme}://{name}"] if scheme else [f"http://{name}", f"https://{name}"]
        return cls(frozenset(h.lower() for h in hosts), frozenset(o.lower() for o in origins))


class _ThreadingServer(socketserver.ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s %s", self.address_string(), format % args)


def make_server(
    app: LocksWeb, host: str = "127.0.0.1", port: int = 8600, allowed_hosts: Sequence[str] = ()
) -> WSGIServer:
    """A server of ``app`` bound to ``host:port`` (port 0: a free one) that answers only
    requests sent to its own names (:meth:`Hosts.of_server`)."""
    server = simple_server.make_server(
        host, port, app, server_class=_ThreadingServer, handler_class=_QuietHandler
    )
    app.hosts = Hosts.of_server(host, server.server_port, allowed_hosts)
    return server


@click.command(name="web")
@click.option("--host", default="127.0.0.1", show_default=True, help="address to listen on")
@click.option("--port", default=8600, show_default=True, type=click.IntRange(0, 65535))
@click.option(
    "--refresh", default=5, show_default=True, type=click.IntRange(0), help="seconds; 0: never"
)
@click.option(
    "--link-pattern", default=None, help="a holder's link, e.g. http://flower:5555/task/{task_id}"
)
@click.option("--page-size", default=100, show_default=True, type=click.IntRange(1))
@click.option(
    "--max-locks",
    default=2000,
    show_default=True,
    type=click.IntRange(1),
    help="the most locks one read of the list looks at (beyond, a filter finds the others)",
)
@click.option(
    "--allowed-host",
    "allowed_hosts",
    multiple=True,
    help="a name a proxy in front sends as Host (repeatable): NAME, NAME:PORT or https://NAME; "
    "the page answers only its loopback names and --host otherwise",
)
@url_option
@prefix_option
def web(
    host: str,
    port: int,
    allowed_hosts: tuple[str, ...],
    url: str | None,
    prefix: str | None,
    **options: Any,
) -> None:
    """Serve a web page of the locks (read-only unless CELERY_SINGLETON_LOCK_WEB_TOKEN is set:
    then a release or purge asks for that token)."""
    package = logging.getLogger("celery_singleton_lock")
    if not package.handlers and not logging.getLogger().handlers:  # nothing configured any
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("[%(asctime)s] %(levelname)s %(name)s: %(message)s"))
        package.addHandler(handler)
        package.setLevel(logging.INFO)
    ctx = click.get_current_context()
    try:  # before anything is read: a short token or a wrong name is refused at start
        access = TokenAccess(os.environ.get(TOKEN_ENV))
        Hosts.of_server(host, port, allowed_hosts)  # each --allowed-host checked
    except ValueError as exc:
        raise click.UsageError(str(exc)) from exc
    with target(ctx, url, prefix) as (_client, prefixes):
        app = None if url else getattr(ctx.obj, "app", None)
        try:
            made = make_app(app, url=url, access=access, prefixes=prefixes, **options)
        except (TypeError, ValueError) as exc:
            raise click.UsageError(str(exc)) from exc
    server = make_server(made, host, port, allowed_hosts)
    shown = f"[{host}]" if ":" in host else host
    log.info("the locks page is served on http://%s:%d/", shown, server.server_port)
    ip = _ip(host)
    if host != "localhost" and not (ip and ip.is_loopback):
        log.warning(
            "the locks page listens on %s, not on loopback: anyone who reaches it sees the locks "
            "(put it behind a proxy with its own login, or keep --host 127.0.0.1)",
            host,
        )
    if not made.access.needs_token:
        log.info("read-only: set %s to allow releases with that token", TOKEN_ENV)
    with server, contextlib.suppress(KeyboardInterrupt):
        server.serve_forever()
