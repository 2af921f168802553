"""The Redis client the Celery layer uses: made from the settings once per app and process."""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Mapping
from typing import Any
from urllib.parse import parse_qsl, unquote, urlparse

from .._errors import MisconfiguredError
from .._lock import DeadlineRetry, LockSpace
from .checks import check_settings
from .settings import REDIS_SCHEMES, scheme_of, setting

__all__ = ["get_client", "lock_space", "make_client", "reset_client"]


def _resolve_url(app: Any) -> str:
    url: str | None = setting(app, "singleton_lock_redis_url")  # checked: a Redis URL
    if url:
        return url
    broker = app.conf.broker_url or ""
    if isinstance(broker, (list, tuple)):
        broker = broker[0] if broker else ""
    if isinstance(broker, str) and broker.split(":", 1)[0].lower() in REDIS_SCHEMES:
        return broker.split(";")[0] if broker.startswith("sentinel") else broker
    raise MisconfiguredError(
        "celery-singleton-lock needs Redis: set app.conf.singleton_lock_redis_url "
        "(e.g. 'redis://127.0.0.1:6379/1'), or app.conf.singleton_lock_client to a redis-py "
        f"client; the broker ({scheme_of(broker)}) is not Redis, so it cannot be used"
    )


#: the ``broker_use_ssl`` keys that mean the same to redis-py's client (Celery's Redis
#: transport passes them on as they are)
_SSL_KEYS = ("ssl_cert_reqs", "ssl_ca_certs", "ssl_certfile", "ssl_keyfile")


def _broker_ssl(app: Any, url: str) -> dict[str, Any]:
    """The broker's TLS options, for a lock client that shares the broker's ``rediss://``
    URL: without them it could not verify a server the broker can (a private CA)."""
    if setting(app, "singleton_lock_redis_url") or not url.lower().startswith("rediss:"):
        return {}
    use_ssl = app.conf.broker_use_ssl
    if not isinstance(use_ssl, Mapping):
        return {}
    return {k: use_ssl[k] for k in _SSL_KEYS if k in use_ssl}


#: seconds: the socket and connect timeouts of the clients made here (unless set in
#: ``singleton_lock_redis_options``, or ``singleton_lock_backend_timeout`` is shorter), and the
#: default of ``singleton_lock_backend_timeout``
SOCKET_TIMEOUT = 5


def _socket_timeout(app: Any) -> float:
    """The socket and connect timeouts of the clients made here: :data:`SOCKET_TIMEOUT`, or
    the backend timeout when that is shorter. One wait for a reply is bounded by the socket
    timeout only (redis-py offers no public bound on it below that), so a backend timeout
    shorter than the socket timeout would otherwise not bound a call to a Redis that hangs."""
    backend: float | None = setting(app, "singleton_lock_backend_timeout")
    return SOCKET_TIMEOUT if backend is None else min(SOCKET_TIMEOUT, backend)


def _retry() -> DeadlineRetry:
    """The resend policy of the clients made here: 3 resends within about a second
    (redis-py's default is up to 10 s of them; resending is safe, every script is idempotent
    per request), none started past the deadline of the lock operation in progress
    (``singleton_lock_backend_timeout``)."""
    from redis.backoff import ExponentialBackoff

    return DeadlineRetry(ExponentialBackoff(cap=0.5, base=0.05), 3)


def _sentinel_client(url: str, options: dict[str, Any], app: Any) -> Any:
    from redis.sentinel import Sentinel

    hosts = []
    password = None
    db = 0
    for part in url.split(";"):
        parsed = urlparse(part.strip())
        if parsed.scheme != "sentinel":
            raise ValueError(f"singleton_lock_redis_url: {part!r} is not a sentinel:// URL")
        hosts.append((parsed.hostname or "127.0.0.1", parsed.port or 26379))
        if parsed.password:
            password = unquote(parsed.password)
        if parsed.path.strip("/"):
            db = int(parsed.path.strip("/"))
    opts = dict(options)
    transport = app.conf.broker_transport_options or {}
    master = opts.pop("master_name", None) or transport.get("master_name")
    if not master:
        raise ValueError(
            "a sentinel:// URL needs the master's name: set "
            "app.conf.singleton_lock_redis_options = {'master_name': 'mymaster'}"
        )
    sentinel_kwargs = opts.pop("sentinel_kwargs", None) or transport.get("sentinel_kwargs")
    opts.setdefault("socket_timeout", _socket_timeout(app))
    opts.setdefault("socket_connect_timeout", _socket_timeout(app))
    opts.setdefault("retry", _retry())
    if password and "password" not in opts:
        opts["password"] = password
    sentinel = Sentinel(hosts, sentinel_kwargs=sentinel_kwargs, **opts)  # type: ignore[no-untyped-call]  # redis-py: unannotated
    return sentinel.master_for(master, db=db)  # type: ignore[no-untyped-call]  # redis-py: unannotated


def make_client(app: Any) -> Any:
    """A new redis-py client from the settings (the injected client wins)."""
    injected = setting(app, "singleton_lock_client")
    if injected is not None:
        client = injected() if callable(injected) and not hasattr(injected, "evalsha") else injected
        if not hasattr(client, "evalsha"):
            raise TypeError(
                "singleton_lock_client must be a redis-py client or a callable returning one, "
                f"got {type(client).__name__}"
            )
        return client
    url = _resolve_url(app)
    options = {**_broker_ssl(app, url), **setting(app, "singleton_lock_redis_options")}
    if url.startswith("sentinel"):
        return _sentinel_client(url, options, app)
    cluster = options.pop("cluster", False)
    # Bounded waits: a lock call must fail with LockBackendError, never hang on a dead server,
    # and within the backend timeout.
    options.setdefault("socket_timeout", _socket_timeout(app))
    options.setdefault("socket_connect_timeout", _socket_timeout(app))
    options.setdefault("retry", _retry())
    try:
        if cluster:
            from redis.cluster import RedisCluster

            return RedisCluster.from_url(url, **options)
        import redis

        query = dict(parse_qsl(urlparse(url).query))
        if "socket_timeout" in query:
            options.pop("socket_timeout")
        return redis.Redis.from_url(url, **options)
    except (ValueError, TypeError) as exc:
        # name the setting: redis-py's own message does not say where the URL came from
        where = (
            "singleton_lock_redis_url"
            if setting(app, "singleton_lock_redis_url")
            else "broker_url (used for the locks: set singleton_lock_redis_url)"
        )
        raise type(exc)(
            f"cannot make the lock client from {where} ({scheme_of(url)}) and "
            f"singleton_lock_redis_options: {exc}"
        ) from exc


#: app -> (pid, the socket timeout it was made with, its lock client): made once per process
#: (a forked child makes its own) and again when a new backend timeout changes its socket
#: timeout (see _socket_timeout), and gone with the app (a new app that happens to get a dead
#: app's id must not get its client)
_clients: weakref.WeakKeyDictionary[Any, tuple[int, float, Any]] = weakref.WeakKeyDictionary()
_clients_lock = threading.Lock()


def get_client(app: Any) -> Any:
    """The app's lock client, made once per process (a forked child makes its own)."""
    pid = os.getpid()
    entry = _clients.get(app)
    if entry is not None and entry[0] == pid and entry[1] == _socket_timeout(app):
        return entry[2]
    with _clients_lock:
        entry = _clients.get(app)
        if entry is None or entry[0] != pid:
            # The first lock client of a process checks every setting: a publisher finds a
            # wrong or misspelt one at its first publish, before a worker fails on it.
            check_settings(app)
        timeout = _socket_timeout(app)
        if entry is None or entry[0] != pid or entry[1] != timeout:
            entry = (pid, timeout, make_client(app))
            _clients[app] = entry
        return entry[2]


def reset_client(app: Any) -> None:
    """Forget the app's cached client (after changing its settings, in tests)."""
    with _clients_lock:
        _clients.pop(app, None)


def lock_space(app: Any, prefix: str | None = None) -> LockSpace:
    """The app's locks under ``prefix`` (``None``: ``singleton_lock_prefix``; a task class's
    own is :meth:`TaskLocking.space`): its lock client and ``singleton_lock_backend_timeout``
    (every lock operation of the Celery layer, each of its locks' included, is bounded by
    it)."""
    client = get_client(app)
    if prefix is None:
        prefix = setting(app, "singleton_lock_prefix")
    timeout: float = setting(app, "singleton_lock_backend_timeout")
    spaces = _spaces.get(app)
    if spaces is None:
        spaces = _spaces[app] = {}
    space = spaces.get(prefix)
    if space is None or space.client is not client or space.backend_timeout != timeout:
        space = spaces[prefix] = LockSpace(client, prefix, backend_timeout=timeout)
    return space


#: app -> {prefix: its LockSpace} (made again when the client or backend timeout changes)
_spaces: weakref.WeakKeyDictionary[Any, dict[str, LockSpace]] = weakref.WeakKeyDictionary()
