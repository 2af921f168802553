"""The settings: their one definition (name, default, the README's words, a check), how
``app.conf`` is read for them (Celery's ``conf.get``, whose namespace mapping gives a Django
project's ``CELERY_SINGLETON_LOCK_*`` names), and the Redis URLs they may give.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit

from .._lock import check_duration, check_prefix

REDIS_SCHEMES = ("redis", "rediss", "unix", "sentinel")
#: the port of a ``sentinel://`` URL that gives none (Sentinel's, and kombu's default)
SENTINEL_PORT = 26379


def scheme_of(url: object) -> str:
    """A URL shown without its host, credentials or path (``amqp://…``), for errors."""
    if not url or not isinstance(url, str):
        return "none configured"
    return url.split(":", 1)[0] + "://…"


@dataclass(frozen=True)
class SentinelURL:
    """A ``sentinel://`` list: the sentinels in order; the master's user, password, db."""

    sentinels: tuple[tuple[str, int], ...]
    username: str | None
    password: str | None
    db: int


def parse_sentinel_url(url: str, name: str) -> SentinelURL:
    """Read ``sentinel://s1:26379;sentinel://s2/0`` as kombu's Redis transport does (user,
    password and database from the first URL, the master's). ``ValueError`` naming ``name``
    where kombu would go on in silence: another scheme in the list (kombu drops it), a later
    URL whose user, password or database differ (kombu uses the first's), a bad number."""
    parts = [part.strip() for part in url.split(";") if part.strip()]
    if not parts:
        raise ValueError(f"{name} names no sentinel: give 'sentinel://host:26379;...'")
    sentinels: list[tuple[str, int]] = []
    first: tuple[str | None, str | None, int | None] | None = None
    for part in parts:
        parsed = urlsplit(part)
        if parsed.scheme.lower() != "sentinel":
            raise ValueError(
                f"{name} mixes {scheme_of(part)} into a sentinel:// list: every URL separated "
                "by ';' must be a sentinel:// URL (give the locks a URL of their own in "
                "singleton_lock_redis_url if the broker's cannot be one)"
            )
        try:
            port = parsed.port or SENTINEL_PORT
        except ValueError:
            raise ValueError(
                f"{name}: the port of sentinel {parsed.hostname or '?'} is not a number"
            ) from None
        host = parsed.hostname or "127.0.0.1"
        sentinels.append((host, port))
        path = parsed.path.strip("/")
        try:
            db = int(path) if path else None
        except ValueError:
            raise ValueError(
                f"{name}: the database of sentinel {host}:{port} must be a number "
                "(sentinel://host:26379/0)"
            ) from None
        given = (
            unquote(parsed.username) if parsed.username else None,
            unquote(parsed.password) if parsed.password else None,
            db,
        )
        if first is None:
            first = given
        elif any(
            value is not None and value != wanted
            for value, wanted in zip(given, first, strict=True)
        ):
            raise ValueError(
                f"{name}: sentinel {host}:{port} gives another user, password or database "
                "than the first URL (the broker uses the first URL's for the master): give "
                "them in the first URL only, or the same in every URL"
            )
    username, password, db = first or (None, None, None)
    return SentinelURL(tuple(sentinels), username, password, db or 0)


def _url(name: str, value: Any) -> Any:
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a str such as 'redis://host:6379/1', got {value!r}")
    if value and value.split(":", 1)[0].lower() not in REDIS_SCHEMES:
        raise ValueError(
            f"{name} must be a Redis URL (redis://, rediss://, unix:// or sentinel://), "
            f"got {scheme_of(value)}"
        )
    if value.split(":", 1)[0].lower() == "sentinel":
        parse_sentinel_url(value, name)  # a list that mixes schemes fails here, named
    return value


def _of(kind: type, words: str) -> Callable[[str, Any], Any]:
    def check(name: str, value: Any) -> Any:
        if not isinstance(value, kind):
            raise TypeError(f"{name} must be {words}, got {value!r}")
        return value

    return check


def _client(name: str, value: Any) -> Any:
    if not (hasattr(value, "evalsha") or callable(value)):
        raise TypeError(
            f"{name} must be a redis-py client or a callable returning one, "
            f"got {type(value).__name__}"
        )
    return value


def _class_path(name: str, value: Any) -> Any:
    if isinstance(value, type):
        return value
    if not isinstance(value, str) or not value.strip(". :"):
        raise TypeError(f"{name} must be a class or its path ('module:Class'), got {value!r}")
    return value


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


def _app_path(name: str, value: Any) -> str:
    if not isinstance(value, str) or not all(value.partition(":")[::2]):
        raise ValueError(
            f"{name} must be 'module:attribute', such as 'proj.celery:app', got {value!r}"
        )
    return value


_dict = _of(dict, "a dict")


def _seconds(name: str, value: Any) -> float:
    return check_duration(value, name)


@dataclass(frozen=True)
class Setting:
    default: Any
    shown: str  # the default as the README shows it
    doc: str  # the README's description
    check: Callable[[str, Any], Any]  # check(name, value) -> value, raises naming the setting


SETTINGS: dict[str, Setting] = {
    "singleton_lock_redis_url": Setting(
        None,
        "`broker_url` when it is `redis://`, `rediss://`, `unix://` or `sentinel://`",
        "where locks live; with any other broker (RabbitMQ, SQS) it is required, and the "
        "first use says so; a `rediss://` broker URL brings `broker_use_ssl`'s "
        "`ssl_*` keys along; a `;`-separated `sentinel://` list gives the locks every "
        "sentinel in it, read as the broker reads it",
        _url,
    ),
    "singleton_lock_redis_options": Setting(
        {},
        "`{}`",
        "extra redis-py client options (TLS files, socket timeouts); `master_name`, "
        "`sentinel_kwargs`, `min_other_sentinels` for `sentinel://` (else "
        "`broker_transport_options`' own); `cluster: True` for Redis Cluster",
        _dict,
    ),
    "singleton_lock_client": Setting(
        None,
        "`None`",
        "a ready redis-py client, or a callable returning one; wins over the URL",
        _client,
    ),
    "singleton_lock_prefix": Setting(
        "lock", '`"lock"`', "first part of every key", lambda n, v: check_prefix(v, n)
    ),
    "singleton_lock_ttl": Setting(
        30.0, "`30` s", "lease of a running lock, renewed about every ttl/3", _seconds
    ),
    "singleton_lock_queue_ttl": Setting(
        3600.0,
        "`3600` s (or the message's `expires`)",
        "lease of a publish-time lock while the message waits",
        _seconds,
    ),
    "singleton_lock_on_backend_error": Setting(
        "raise",
        '`"raise"`',
        '`"proceed"`: publish / run anyway and log at ERROR; never a silent drop',
        _policy,
    ),
    "singleton_lock_backend_timeout": Setting(
        5.0,
        "`5` s (the socket timeout the package gives its clients)",
        "how long a publish's lock, a run's start and a run's release may wait for Redis "
        'in all, resends included; then `LockBackendError` (or `"proceed"`), and what is '
        "left to undo goes on in the background",
        _seconds,
    ),
    "singleton_lock_beat_scheduler": Setting(
        "celery.beat:PersistentScheduler",
        '`"celery.beat:PersistentScheduler"`',
        "the scheduler `celery_singleton_lock.beat:LeaderScheduler` runs while it leads "
        "(e.g. `django_celery_beat.schedulers:DatabaseScheduler`, `redbeat.RedBeatScheduler`)",
        _class_path,
    ),
    "singleton_lock_tasks": Setting(
        {},
        "`{}`",
        "`{task name: options}`, as `install(app, tasks=...)`: read by `install(app)`, and "
        "by a worker or beat whose app has a `LockedTask` even without that call "
        "(publish-time dedup needs `install(app)` in the processes that publish); an app "
        "that neither calls `install(app)` nor has a `LockedTask` never reads it",
        _of(Mapping, "a dict of {task name: options}"),
    ),
    "singleton_lock_metrics_port": Setting(
        None,
        "`None` (off)",
        "serve Prometheus metrics from every worker process that runs tasks (the "
        "`prometheus` extra): a solo or threads worker on this port; prefork: the main "
        "process on it, pool child *i* on port + *i*",
        _port,
    ),
    "singleton_lock_metrics_address": Setting(
        "0.0.0.0", '`"0.0.0.0"`', "the address the metrics listen on", _address
    ),
    "singleton_lock_counts": Setting(
        True,
        "`True`",
        "count duplicates, refusals and lost locks per minute in Redis "
        "(`<prefix>:counts:<minute>` hashes, kept 2 h) for the locks web page's last hour; "
        "a task pays a dict increment on those paths only, a thread writes them each second",
        _of(bool, "True or False"),
    ),
    "singleton_lock_web_app": Setting(
        None,
        "Celery's current app",
        "Django only: the Celery app of the locks page mounted in the project "
        '(`celery_singleton_lock.web.django`), as `"proj.celery:app"`',
        _app_path,
    ),
    "singleton_lock_web_options": Setting(
        {},
        "`{}`",
        "Django only: the page's options (`make_app`'s: `link_pattern`, `refresh`, "
        "`page_size` ...)",
        _dict,
    ),
}

#: the environment variables the package reads, with the settings table's words
ENVIRONMENT: dict[str, tuple[str, str]] = {
    "CELERY_SINGLETON_LOCK_WEB_TOKEN": (
        "unset: read-only",
        "environment variable, not a setting: the token that `celery locks web` asks for "
        "before a release or a purge (never on the command line, where `ps` shows it)",
    )
}


#: not a misspelling: celery-singleton's lease setting, which compat.singleton reads
_OTHER_PACKAGES_NAMES = frozenset({"singleton_lock_expiry"})


def _ours(key: object) -> str | None:
    """The setting a key under this package's prefix means (``CELERY_SINGLETON_LOCK_TTL``)."""
    if not isinstance(key, str):
        return None
    lowered = key.lower().removeprefix("celery_")
    return lowered if lowered.startswith("singleton_lock_") else None


def read(conf: Any) -> tuple[dict[str, Any], list[TypeError | ValueError]]:
    """Every setting of ``conf`` (an ``app.conf``, read with ``conf.get``), checked, and every
    problem: a wrong value (named as the user wrote it), a name under our prefix that no setting
    reads (a misspelling, or upper case without Django's ``CELERY`` namespace)."""
    values: dict[str, Any] = {}
    problems: list[TypeError | ValueError] = []
    keys = list(conf.keys())
    for name, definition in SETTINGS.items():
        value = conf.get(name)
        values[name] = definition.default
        if value is not None:
            spelt = next((key for key in keys if _ours(key) == name), name)
            try:
                values[name] = definition.check(spelt, value)
            except (TypeError, ValueError) as exc:
                problems.append(exc)
    for key in keys:
        meant = _ours(key)
        if meant is None or meant in _OTHER_PACKAGES_NAMES or conf.get(key) is None:
            continue
        if f"celery_{meant}".upper() in ENVIRONMENT:
            problems.append(
                ValueError(
                    f"{key} is an environment variable, not a setting: set "
                    f"CELERY_{meant.upper()} in the environment of `celery locks web`"
                )
            )
        elif meant not in SETTINGS:
            close = difflib.get_close_matches(meant, list(SETTINGS), 1)
            hint = f" (did you mean {_respelled(key, close[0])}?)" if close else ""
            known = ", ".join(_respelled(key, s) for s in SETTINGS)
            problems.append(
                ValueError(
                    f"{key} is not a celery-singleton-lock setting{hint}; the settings are {known}"
                )
            )
        elif conf.get(meant) is None:
            problems.append(
                ValueError(
                    f"{key} is not read by this app: write {meant} (or, in a Django project "
                    f"whose Celery app reads the settings with namespace='CELERY', "
                    f"CELERY_{meant.upper()})"
                )
            )
    return values, problems


def _respelled(written: str, name: str) -> str:
    """The setting ``name`` spelt as ``written`` is (upper case, Django's ``CELERY_``)."""
    spelt = "celery_" + name if written.lower().startswith("celery_") else name
    return spelt.upper() if written.isupper() else spelt


def settings_table() -> str:
    """The README's settings table (Markdown), made from the definition."""
    rows = ["| setting | default | meaning |", "| --- | --- | --- |"]
    for name, s in SETTINGS.items():
        rows.append(f"| `{name}` | {s.shown} | {s.doc} |")
    for name, (shown, doc) in ENVIRONMENT.items():
        rows.append(f"| `{name}` | {shown} | {doc} |")
    return "\n".join(rows)
