"""The Redis client of an app's locks, from its settings: a URL (``redis://``, ``rediss://``,
``unix://``, a ``sentinel://`` list), the broker's when that is Redis, or the user's client."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, urlparse

from .._errors import MisconfiguredError
from .._lock import DeadlineRetry
from .settings import REDIS_SCHEMES, parse_sentinel_url, scheme_of

if TYPE_CHECKING:
    from .config import LockConfig


def _resolve_url(config: LockConfig, conf: Any) -> tuple[str, str]:
    """The URL of the locks' Redis, and the setting it came from (for errors)."""
    if config.redis_url:
        return config.redis_url, "singleton_lock_redis_url"
    broker = conf.broker_url or ""
    if isinstance(broker, (list, tuple)):
        # kombu reads a list as a ';'-separated string (alternates, or sentinels to ask)
        if broker and isinstance(broker[0], str) and broker[0].startswith("sentinel"):
            broker = ";".join(broker)
        else:
            broker = broker[0] if broker else ""
    if isinstance(broker, str) and broker.split(":", 1)[0].lower() in REDIS_SCHEMES:
        # all of a sentinel:// list: the locks fail over as the broker does
        return broker, "broker_url"
    raise MisconfiguredError(
        "celery-singleton-lock needs Redis: set app.conf.singleton_lock_redis_url "
        "(e.g. 'redis://127.0.0.1:6379/1'), or app.conf.singleton_lock_client to a redis-py "
        f"client; the broker ({scheme_of(broker)}) is not Redis, so it cannot be used"
    )


#: the ``broker_use_ssl`` keys that mean the same to redis-py (Celery passes them on as is)
_SSL_KEYS = ("ssl_cert_reqs", "ssl_ca_certs", "ssl_certfile", "ssl_keyfile")


#: seconds: the socket and connect timeouts of the clients made here (unless the options set
#: them, or the backend timeout is shorter), and the default ``singleton_lock_backend_timeout``
SOCKET_TIMEOUT = 5


def _sentinel_client(url: str, where: str, opts: dict[str, Any], timeout: float, conf: Any) -> Any:
    """A client of the master of the ``sentinel://`` list ``url`` (from setting ``where``),
    with ``master_name``, ``sentinel_kwargs``, ``min_other_sentinels`` from ``options`` or
    else the broker's transport options; ``timeout``: the master's."""
    from redis.backoff import NoBackoff
    from redis.retry import Retry
    from redis.sentinel import Sentinel

    parsed = parse_sentinel_url(url, where)
    transport = conf.broker_transport_options or {}
    master = opts.pop("master_name", None) or transport.get("master_name")
    if not master:
        if where == "broker_url":
            fix = (
                "app.conf.broker_transport_options = {'master_name': 'mymaster'} (which the "
                "broker needs as well), or singleton_lock_redis_options' master_name"
            )
        else:
            fix = "app.conf.singleton_lock_redis_options = {'master_name': 'mymaster'}"
        raise ValueError(
            f"{where} is a sentinel:// URL, and the locks need the name of the master to ask "
            f"the sentinels for: set {fix}"
        )
    sentinel_kwargs = opts.pop("sentinel_kwargs", None) or transport.get("sentinel_kwargs")
    min_other = opts.pop("min_other_sentinels", None)
    if min_other is None:
        min_other = transport.get("min_other_sentinels", 0)
    if parsed.username and "username" not in opts:
        opts["username"] = parsed.username
    if parsed.password and "password" not in opts:
        opts["password"] = parsed.password
    # redis-py would give the sentinels the master's timeouts and up to 10 resends: a hung
    # first sentinel would hold every lock call far past the backend timeout. Here each
    # sentinel gets one try, bounded so all of them and the command fit in the master's
    # timeout (discover_master then asks the next one).
    share = len(parsed.sentinels) + 1
    if sentinel_kwargs is None:
        sentinel_opts = {k: v for k, v in opts.items() if k.startswith("socket_")}
        for key in ("socket_timeout", "socket_connect_timeout"):
            if sentinel_opts.get(key):  # None: the user's own choice of no timeout
                sentinel_opts[key] = sentinel_opts[key] / share
    else:  # the user's (a password for the sentinels), with bounded waits unless they say
        sentinel_opts = dict(sentinel_kwargs)
        sentinel_opts.setdefault("socket_timeout", timeout / share)
        sentinel_opts.setdefault("socket_connect_timeout", sentinel_opts["socket_timeout"])
    sentinel_opts.setdefault("retry", Retry(NoBackoff(), 0))
    sentinel = Sentinel(  # type: ignore[no-untyped-call]  # redis-py: unannotated
        list(parsed.sentinels),
        min_other_sentinels=min_other,
        sentinel_kwargs=sentinel_opts,
        **opts,
    )
    return sentinel.master_for(master, db=parsed.db)  # type: ignore[no-untyped-call]  # redis-py: unannotated


def make_client(config: LockConfig, conf: Any) -> Any:
    """A new redis-py client from the settings (an injected client wins); ``conf``: the app's
    configuration."""
    injected = config.client_setting
    if injected is not None:
        client = injected() if callable(injected) and not hasattr(injected, "evalsha") else injected
        if not hasattr(client, "evalsha"):
            raise TypeError(
                "singleton_lock_client must be a redis-py client or a callable returning one, "
                f"got {type(client).__name__}"
            )
        return client
    url, where = _resolve_url(config, conf)
    options = dict(config.redis_options)
    use_ssl = conf.broker_use_ssl
    if where == "broker_url" and url.lower().startswith("rediss:") and isinstance(use_ssl, Mapping):
        # the broker's TLS options, for a client sharing its URL (a private CA)
        options = {**{k: use_ssl[k] for k in _SSL_KEYS if k in use_ssl}, **options}
    # A lock call fails within the backend timeout, never hangs: the timeouts default to
    # SOCKET_TIMEOUT or the backend timeout when shorter (only the socket timeout bounds one wait
    # for a reply), the resends to 3 within about a second (scripts are idempotent), none past
    # the operation's deadline.
    from redis.backoff import ExponentialBackoff

    timeout = min(SOCKET_TIMEOUT, config.backend_timeout)
    options.setdefault("socket_timeout", timeout)
    options.setdefault("socket_connect_timeout", timeout)
    options.setdefault("retry", DeadlineRetry(ExponentialBackoff(cap=0.5, base=0.05), 3))
    if url.split(":", 1)[0].lower() == "sentinel":
        return _sentinel_client(url, where, options, timeout, conf)
    cluster = options.pop("cluster", False)
    try:
        if cluster:
            from redis.cluster import RedisCluster

            return RedisCluster.from_url(url, **options)
        import redis

        if "socket_timeout" in dict(parse_qsl(urlparse(url).query)):
            options.pop("socket_timeout")
        return redis.Redis.from_url(url, **options)
    except (ValueError, TypeError) as exc:
        # name the setting: redis-py's message does not say where the URL came from
        if where == "broker_url":
            where = "broker_url (used for the locks: set singleton_lock_redis_url)"
        raise type(exc)(
            f"cannot make the lock client from {where} ({scheme_of(url)}) and "
            f"singleton_lock_redis_options: {exc}"
        ) from exc
