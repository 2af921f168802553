"""Settings (``app.conf``) and the Redis client the Celery integration uses."""

from __future__ import annotations

import logging
import os
import threading
from typing import Any
from urllib.parse import parse_qsl, unquote, urlparse

from ._errors import LockBackendError

__all__ = ["DEFAULTS", "get_client", "setting"]

log = logging.getLogger("celery_singleton_lock.settings")

DEFAULTS: dict[str, Any] = {
    "singleton_lock_redis_url": None,
    "singleton_lock_redis_options": {},
    "singleton_lock_client": None,
    "singleton_lock_prefix": "lock",
    "singleton_lock_ttl": 30.0,
    "singleton_lock_queue_ttl": 3600.0,
    "singleton_lock_on_backend_error": "raise",
    "singleton_lock_tasks": {},
}

_REDIS_SCHEMES = ("redis", "rediss", "unix", "sentinel")


class MisconfiguredError(LockBackendError):
    """No usable Redis is configured: a setting to fix, never an outage to "proceed" past."""


def _plain_maps() -> tuple[type, ...]:
    from celery.utils.collections import DictAttribute

    # dict, and DictAttribute (a config object or module, Django's settings): `key in m`
    # and `m[key]` are what conf.get() asks of them, minus the exception on a miss.
    return (dict, DictAttribute)


_PLAIN_MAPS = _plain_maps()


def _lookup_plan(conf: Any, name: str) -> tuple[tuple[Any, ...], ...] | None:
    """For each spelling of ``name``, the keys ``conf.get(spelling)`` tries, in its order; or
    ``None`` when ``conf`` is not a plain Celery ``ConfigurationView`` over dicts. Kept in the
    conf object's own ``__dict__`` (its ``__setattr__`` would write a setting)."""
    from celery.utils.collections import ConfigurationView

    if type(conf).__getitem__ is not ConfigurationView.__getitem__:
        return None
    plans = conf.__dict__.get("_singleton_lock_plans")
    if plans is None:
        plans = conf.__dict__["_singleton_lock_plans"] = {}
    plan = plans.get(name)
    if plan is None:
        spellings = (name, name.upper(), "CELERY_" + name.upper())
        plan = plans[name] = tuple(tuple(conf._key(k) for k in conf._to_keys(s)) for s in spellings)
    return plan  # type: ignore[no-any-return]


def setting(app: Any, name: str) -> Any:
    """A setting from ``app.conf``, under its own name or Django's ``CELERY_`` namespace."""
    conf = app.conf
    # The hot path (every publish and run reads a few settings): the same lookup as
    # conf.get(spelling) below, without the KeyError that conf.get raises and catches for every
    # key it tries in every map (about 12 us per setting that is not set, against 1 us here).
    plan = _lookup_plan(conf, name)
    maps = conf.__dict__.get("maps") if plan is not None else None
    for mapping in maps or ():
        if type(mapping) not in _PLAIN_MAPS:
            maps = None
            break
    if plan is not None and maps is not None:
        for keys in plan:
            found = False
            for mapping in maps:
                for key in keys:
                    if key in mapping:
                        value, found = mapping[key], True
                        break
                if found:
                    break
            if found and value is not None:
                return value
        return DEFAULTS[name]
    for candidate in (name, name.upper(), "CELERY_" + name.upper()):
        try:
            value = conf.get(candidate)
        except Exception:  # pragma: no cover - odd conf objects
            value = None
        if value is not None:
            return value
    return DEFAULTS[name]


def _resolve_url(app: Any) -> str:
    url = setting(app, "singleton_lock_redis_url")
    if url:
        if not isinstance(url, str):
            raise TypeError(
                f"singleton_lock_redis_url must be a str such as 'redis://host:6379/1', got {url!r}"
            )
        if url.split(":", 1)[0].lower() not in _REDIS_SCHEMES:
            raise ValueError(
                f"singleton_lock_redis_url must be a Redis URL (redis://, rediss://, unix:// or "
                f"sentinel://), got {_scheme_of(url)}"
            )
        return url
    broker = app.conf.broker_url or ""
    if isinstance(broker, (list, tuple)):
        broker = broker[0] if broker else ""
    if isinstance(broker, str) and broker.split(":", 1)[0].lower() in _REDIS_SCHEMES:
        return broker.split(";")[0] if broker.startswith("sentinel") else broker
    raise MisconfiguredError(
        "celery-singleton-lock needs Redis: set app.conf.singleton_lock_redis_url "
        "(e.g. 'redis://127.0.0.1:6379/1'), or app.conf.singleton_lock_client to a redis-py "
        f"client; the broker ({_scheme_of(broker)}) is not Redis, so it cannot be used"
    )


def _scheme_of(url: object) -> str:
    if not url or not isinstance(url, str):
        return "none configured"
    return url.split(":", 1)[0] + "://…"


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
    opts.setdefault("socket_timeout", 5)
    opts.setdefault("socket_connect_timeout", 5)
    if password and "password" not in opts:
        opts["password"] = password
    sentinel = Sentinel(hosts, sentinel_kwargs=sentinel_kwargs, **opts)  # type: ignore[no-untyped-call]
    return sentinel.master_for(master, db=db)  # type: ignore[no-untyped-call]


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
    options = setting(app, "singleton_lock_redis_options") or {}
    if not isinstance(options, dict):
        raise TypeError(f"singleton_lock_redis_options must be a dict, got {options!r}")
    options = dict(options)
    if url.startswith("sentinel"):
        return _sentinel_client(url, options, app)
    cluster = options.pop("cluster", False)
    # Bounded waits: a lock call must fail with LockBackendError, never hang on a dead server.
    # (redis-py's default resends a command 10 times; ours 3 times, within about a second.
    # Resending is safe: every script is idempotent per request.)
    options.setdefault("socket_timeout", 5)
    options.setdefault("socket_connect_timeout", 5)
    if "retry" not in options:
        from redis.backoff import ExponentialBackoff
        from redis.retry import Retry

        options["retry"] = Retry(ExponentialBackoff(cap=0.5, base=0.05), 3)
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
            f"cannot make the lock client from {where} ({_scheme_of(url)}) and "
            f"singleton_lock_redis_options: {exc}"
        ) from exc


_clients: dict[int, tuple[int, Any]] = {}
_clients_lock = threading.Lock()


def get_client(app: Any) -> Any:
    """The app's lock client, made once per process (a forked child makes its own)."""
    pid = os.getpid()
    entry = _clients.get(id(app))
    if entry is not None and entry[0] == pid:
        return entry[1]
    with _clients_lock:
        entry = _clients.get(id(app))
        if entry is None or entry[0] != pid:
            entry = (pid, make_client(app))
            _clients[id(app)] = entry
        return entry[1]


def reset_client(app: Any) -> None:
    """Forget the app's cached client (after changing the settings in tests)."""
    with _clients_lock:
        _clients.pop(id(app), None)
