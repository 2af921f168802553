"""Settings (``app.conf``; under Django's ``CELERY_`` namespace, ``CELERY_SINGLETON_LOCK_*``):
their one definition, and how they are read and validated.

Each setting is one :class:`Setting`: name, default, the README's description and a check.
:func:`setting` reads one and checks it the first time it sees that value, so a wrong value
fails at its first use with an error that names the setting as the user wrote it and says what
it must be (:mod:`.checks` checks them all at once, and finds misspelt names).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from celery.utils.collections import ConfigurationView, DictAttribute

from .._lock import MAX_LEASE_SECONDS, check_prefix

__all__ = [
    "DEFAULTS",
    "REDIS_SCHEMES",
    "SETTINGS",
    "Setting",
    "check_seconds",
    "is_set",
    "scheme_of",
    "setting",
    "settings_table",
    "user_names",
]

REDIS_SCHEMES = ("redis", "rediss", "unix", "sentinel")


def scheme_of(url: object) -> str:
    """A URL shown without its host, credentials or path (``amqp://…``), for errors."""
    if not url or not isinstance(url, str):
        return "none configured"
    return url.split(":", 1)[0] + "://…"


def _url(name: str, value: Any) -> Any:
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a str such as 'redis://host:6379/1', got {value!r}")
    if value and value.split(":", 1)[0].lower() not in REDIS_SCHEMES:
        raise ValueError(
            f"{name} must be a Redis URL (redis://, rediss://, unix:// or sentinel://), "
            f"got {scheme_of(value)}"
        )
    return value


def _dict(name: str, value: Any) -> Any:
    if not isinstance(value, dict):
        raise TypeError(f"{name} must be a dict, got {value!r}")
    return value


def _mapping(name: str, value: Any) -> Any:
    if not isinstance(value, Mapping):
        raise TypeError(f"{name} must be a dict of {{task name: options}}, got {value!r}")
    return value


def _client(name: str, value: Any) -> Any:
    if not (hasattr(value, "evalsha") or callable(value)):
        raise TypeError(
            f"{name} must be a redis-py client or a callable returning one, "
            f"got {type(value).__name__}"
        )
    return value


def _prefix(name: str, value: Any) -> str:
    return check_prefix(value, name)


def _class_path(name: str, value: Any) -> Any:
    if isinstance(value, type):
        return value
    if not isinstance(value, str) or not value.strip(". :"):
        raise TypeError(f"{name} must be a class or its path ('module:Class'), got {value!r}")
    return value


def check_seconds(name: str, value: Any) -> float:
    """``value`` as seconds of a lease, or an error naming ``name`` and saying what it takes."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise TypeError(f"{name} must be a number of seconds such as 30, got {value!r}")
    if not 0 < value <= MAX_LEASE_SECONDS:
        raise ValueError(
            f"{name} must be > 0 and at most {MAX_LEASE_SECONDS} seconds (ten years), got {value!r}"
        )
    return float(value)


def _port(name: str, value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value < 65536:
        raise ValueError(f"{name} must be a TCP port (1-65535) or None (off), got {value!r}")
    return value


def _address(name: str, value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise TypeError(f"{name} must be an address to listen on, such as '0.0.0.0', got {value!r}")
    return value


def _policy(name: str, value: Any) -> str:
    if value not in ("raise", "proceed"):
        raise ValueError(f"{name} must be 'raise' or 'proceed', got {value!r}")
    return str(value)


@dataclass(frozen=True)
class Setting:
    name: str
    default: Any
    #: the default as the README shows it
    shown: str
    #: the README's description
    doc: str
    #: ``check(name, value) -> value``: raises naming the setting
    check: Callable[[str, Any], Any]


SETTINGS: dict[str, Setting] = {
    s.name: s
    for s in (
        Setting(
            "singleton_lock_redis_url",
            None,
            "`broker_url` when it is `redis://`, `rediss://`, `unix://` or `sentinel://`",
            "where locks live; with any other broker (RabbitMQ, SQS) it is required, and the "
            "first use says so; a `rediss://` broker URL brings `broker_use_ssl`'s "
            "`ssl_*` keys along",
            _url,
        ),
        Setting(
            "singleton_lock_redis_options",
            {},
            "`{}`",
            "extra redis-py client options (TLS files, socket timeouts); `master_name`, "
            "`sentinel_kwargs` for `sentinel://`; `cluster: True` for Redis Cluster",
            _dict,
        ),
        Setting(
            "singleton_lock_client",
            None,
            "`None`",
            "a ready redis-py client, or a callable returning one; wins over the URL",
            _client,
        ),
        Setting("singleton_lock_prefix", "lock", '`"lock"`', "first part of every key", _prefix),
        Setting(
            "singleton_lock_ttl",
            30.0,
            "`30` s",
            "lease of a running lock, renewed about every ttl/3",
            check_seconds,
        ),
        Setting(
            "singleton_lock_queue_ttl",
            3600.0,
            "`3600` s (or the message's `expires`)",
            "lease of a publish-time lock while the message waits",
            check_seconds,
        ),
        Setting(
            "singleton_lock_on_backend_error",
            "raise",
            '`"raise"`',
            '`"proceed"`: publish / run anyway and log at ERROR; never a silent drop',
            _policy,
        ),
        Setting(
            "singleton_lock_backend_timeout",
            5.0,
            "`5` s (the socket timeout the package gives its clients)",
            "how long a publish's lock, a run's start and a run's release may wait for Redis "
            'in all, resends included; then `LockBackendError` (or `"proceed"`), and what is '
            "left to undo goes on in the background",
            check_seconds,
        ),
        Setting(
            "singleton_lock_beat_scheduler",
            "celery.beat:PersistentScheduler",
            '`"celery.beat:PersistentScheduler"`',
            "the scheduler `celery_singleton_lock.beat:LeaderScheduler` runs while it leads "
            "(e.g. `django_celery_beat.schedulers:DatabaseScheduler`)",
            _class_path,
        ),
        Setting(
            "singleton_lock_tasks",
            {},
            "`{}`",
            "`{task name: options}`, as `install(app, tasks=...)`: read by `install(app)`, and "
            "by a worker or beat started with the `celery` command even without that call "
            "(publish-time dedup needs `install(app)` in the processes that publish)",
            _mapping,
        ),
        Setting(
            "singleton_lock_metrics_port",
            None,
            "`None` (off)",
            "serve Prometheus metrics from every worker process that runs tasks (the "
            "`prometheus` extra): a solo or threads worker on this port; prefork: the main "
            "process on it, pool child *i* on port + *i*",
            _port,
        ),
        Setting(
            "singleton_lock_metrics_address",
            "0.0.0.0",
            '`"0.0.0.0"`',
            "the address the metrics listen on",
            _address,
        ),
    )
}
DEFAULTS: dict[str, Any] = {name: s.default for name, s in SETTINGS.items()}


#: dict, and DictAttribute (a config object or module, Django's settings): `key in m` and
#: `m[key]` are what conf.get() asks of them, minus the exception on a miss
_PLAIN_MAPS = (dict, DictAttribute)


def _conf_cache(conf: Any, name: str) -> dict[str, Any]:
    """A dict of ours in the conf object's own ``__dict__`` (its ``__setattr__`` would write a
    setting): it lives and dies with the app's configuration."""
    cache: dict[str, Any] | None = conf.__dict__.get(name)
    if cache is None:
        cache = conf.__dict__[name] = {}
    return cache


def _lookup_plan(conf: Any, name: str) -> tuple[tuple[Any, ...], ...] | None:
    """For each spelling of ``name``, the keys ``conf.get(spelling)`` tries, in its order; or
    ``None`` when ``conf`` is not a plain Celery ``ConfigurationView`` over dicts."""
    if type(conf).__getitem__ is not ConfigurationView.__getitem__:
        return None
    plans = _conf_cache(conf, "_singleton_lock_plans")
    plan = plans.get(name)
    if plan is None:
        spellings = (name, name.upper(), "CELERY_" + name.upper())
        # Celery's own key mapping (what conf.get() does), without the KeyErrors it raises
        key, to_keys = conf._key, conf._to_keys  # noqa: SLF001  # no public API for it
        plan = plans[name] = tuple(tuple(key(k) for k in to_keys(s)) for s in spellings)
    return plan


def _first(maps: Any, keys: tuple[Any, ...]) -> Any:
    """The value of the first of ``keys`` found, in the first map that has one."""
    for mapping in maps:
        for key in keys:
            if key in mapping:
                return mapping[key]
    return None


def _raw(conf: Any, name: str) -> Any:
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
            value = _first(maps, keys)
            if value is not None:
                return value
        return None
    for candidate in (name, name.upper(), "CELERY_" + name.upper()):
        try:
            value = conf.get(candidate)
        except Exception:  # pragma: no cover - odd conf objects
            value = None
        if value is not None:
            return value
    return None


def setting(app: Any, name: str) -> Any:
    """A setting from ``app.conf``, under its own name or Django's ``CELERY_`` namespace, its
    default when unset. A value is checked the first time it is read (``TypeError`` /
    ``ValueError`` naming the setting)."""
    conf = app.conf
    value = _raw(conf, name)
    if value is None:
        return DEFAULTS[name]
    checked = _conf_cache(conf, "_singleton_lock_checked")
    seen = checked.get(name)
    if seen is not None and seen[0] is value:
        return seen[1]
    check = SETTINGS[name].check
    try:
        result = check(name, value)
    except (TypeError, ValueError):
        # Only now look up how the user wrote it (a scan of the configuration's keys): the
        # same check raises again, naming CELERY_SINGLETON_LOCK_TTL rather than our name.
        spelling = _spelling(conf, name)
        if spelling != name:
            check(spelling, value)
        raise
    checked[name] = (value, result)
    return result


#: what every setting's name starts with, under each of its spellings (lower-cased)
_PREFIXES = ("singleton_lock_", "celery_singleton_lock_")


def user_names(conf: Any) -> dict[str, str]:
    """{setting name: the name the user wrote} for every configured name under this package's
    prefix (``singleton_lock_*``, ``SINGLETON_LOCK_*``, Django's ``CELERY_SINGLETON_LOCK_*``),
    known or not; the canonical name of ``CELERY_SINGLETON_LOCK_TTL`` is
    ``singleton_lock_ttl``."""
    names: dict[str, str] = {}
    try:
        keys = list(conf.keys())
    except Exception:  # pragma: no cover - a conf object that cannot list its keys
        return names
    for key in keys:
        if not isinstance(key, str):
            continue
        lowered = key.lower()
        if lowered.startswith(_PREFIXES[1]):
            lowered = lowered[len("celery_") :]
        if lowered.startswith(_PREFIXES[0]) and conf.get(key) is not None:
            names.setdefault(lowered, key)
    return names


def _spelling(conf: Any, name: str) -> str:
    """``name`` as the user wrote it (``CELERY_SINGLETON_LOCK_TTL`` in Django's settings)."""
    return user_names(conf).get(name, name)


def is_set(app: Any, name: str) -> bool:
    """Whether the user set ``name`` (under any of its spellings), as opposed to its default."""
    return _raw(app.conf, name) is not None


def settings_table() -> str:
    """The README's settings table (Markdown), made from the definition."""
    rows = ["| setting | default | meaning |", "| --- | --- | --- |"]
    for s in SETTINGS.values():
        rows.append(f"| `{s.name}` | {s.shown} | {s.doc} |")
    return "\n".join(rows)
