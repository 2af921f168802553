"""Settings (``app.conf``; under Django's ``CELERY_`` namespace, ``CELERY_SINGLETON_LOCK_*``):
their one definition, and how they are read and validated.

Each setting is one :class:`Setting`: name, default, the README's description and a check.
An app's settings are read from ``app.conf`` once per process, through its public mapping
interface (``conf.get``, ``conf.keys()``), at the app's first use (a worker's or beat's start,
a publisher's first lock), checked, and kept per app (:class:`Settings`, in a
``WeakKeyDictionary``) until :func:`reload_settings`. A wrong value fails at its use with an
error that names the setting as the user wrote it and says what it must be (:mod:`.checks`
reports them all at once, and finds misspelt names).
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit

from .._lock import check_duration, check_prefix

__all__ = [
    "DEFAULTS",
    "REDIS_SCHEMES",
    "SETTINGS",
    "SentinelURL",
    "Setting",
    "Settings",
    "check_seconds",
    "is_set",
    "parse_sentinel_url",
    "peek_setting",
    "read_settings",
    "reload_settings",
    "scheme_of",
    "setting",
    "settings_of",
    "settings_table",
    "user_names",
]

REDIS_SCHEMES = ("redis", "rediss", "unix", "sentinel")


def scheme_of(url: object) -> str:
    """A URL shown without its host, credentials or path (``amqp://…``), for errors."""
    if not url or not isinstance(url, str):
        return "none configured"
    return url.split(":", 1)[0] + "://…"


#: the port of a ``sentinel://`` URL that gives none (Sentinel's, and kombu's default)
SENTINEL_PORT = 26379


@dataclass(frozen=True)
class SentinelURL:
    """What a ``sentinel://`` URL list says: the sentinels to ask, in order, and the user,
    password and database of the master's connections."""

    sentinels: tuple[tuple[str, int], ...]
    username: str | None
    password: str | None
    db: int


def parse_sentinel_url(url: str, name: str) -> SentinelURL:
    """Read ``sentinel://s1:26379;sentinel://s2:26379/0`` as Celery's broker (kombu's Redis
    transport) reads it: every ``;``-separated URL names a sentinel (empty ones, as after a
    trailing ``;``, are skipped), and the user, password and database come from the first
    URL (``sentinel://user:pw@s1:26379/2``); like the broker's, they are the master's, never
    the sentinels' (those take ``sentinel_kwargs``). ``name`` is where the URL came from, for
    the errors: a URL of another scheme in the list (kombu would drop it from the sentinels
    without a word), a later URL with a user, password or database that differs from the
    first's (kombu would use the first's), a port or database that is no number."""
    parts = [part.strip() for part in url.split(";")]
    parts = [part for part in parts if part]
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
    """``value`` as seconds of a lease (> 0, at most ten years), or an error naming ``name``
    and saying what it takes: :func:`check_duration` in a setting's ``check(name, value)``
    form."""
    return check_duration(value, name)


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
            "`ssl_*` keys along; a `;`-separated `sentinel://` list gives the locks every "
            "sentinel in it, read as the broker reads it",
            _url,
        ),
        Setting(
            "singleton_lock_redis_options",
            {},
            "`{}`",
            "extra redis-py client options (TLS files, socket timeouts); `master_name`, "
            "`sentinel_kwargs`, `min_other_sentinels` for `sentinel://` (else "
            "`broker_transport_options`' own); `cluster: True` for Redis Cluster",
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


#: what every setting's name starts with, under each of its spellings (lower-cased)
_PREFIXES = ("singleton_lock_", "celery_singleton_lock_")


def _raw(conf: Any, name: str) -> Any:
    """The value the user set for ``name`` under any of its spellings (``singleton_lock_ttl``,
    ``SINGLETON_LOCK_TTL``, Django's ``CELERY_SINGLETON_LOCK_TTL``), or ``None``: Celery's own
    ``conf.get``, which applies the app's namespace."""
    for candidate in (name, name.upper(), "CELERY_" + name.upper()):
        try:
            value = conf.get(candidate)
        except Exception:  # pragma: no cover - odd conf objects
            value = None
        if value is not None:
            return value
    return None


def user_names(conf: Any) -> dict[str, str]:
    """{setting name: the name the user wrote} for every configured name under this package's
    prefix (``singleton_lock_*``, ``SINGLETON_LOCK_*``, Django's ``CELERY_SINGLETON_LOCK_*``),
    known or not; the canonical name of ``CELERY_SINGLETON_LOCK_TTL`` is
    ``singleton_lock_ttl``. ``conf`` is read as the mapping it is (its keys, ``get``)."""
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


@dataclass(frozen=True)
class Settings:
    """One app's settings as read from ``app.conf`` at one time: its first use in the process
    (a worker's or beat's start, a publisher's first lock), or the first use after
    :func:`reload_settings`."""

    #: {setting: its checked value, or its default when unset} (a wrong value is left out)
    values: Mapping[str, Any]
    #: {setting: the value the user gave it}, for the settings the user set
    given: Mapping[str, Any]
    #: the settings whose value fails its check
    wrong: frozenset[str]
    #: {name: the name the user wrote} for every name under this package's prefix
    written: Mapping[str, str]
    #: what the app's lock client is made from (ours and the broker's settings): the client
    #: is made again when they change
    client_from: tuple[Any, ...] = ()

    def spelling(self, name: str) -> str:
        """``name`` as the user wrote it (``CELERY_SINGLETON_LOCK_TTL`` in Django's settings)."""
        return self.written.get(name, name)

    def get(self, name: str) -> Any:
        """The value of ``name``; a wrong value raises its check's error (``TypeError`` /
        ``ValueError``), naming the setting as the user wrote it."""
        if name in self.wrong:
            SETTINGS[name].check(self.spelling(name), self.given[name])  # raises
        return self.values[name]

    def problems(self) -> list[TypeError | ValueError]:
        """The error of every wrong value, in the order of the definition."""
        problems: list[TypeError | ValueError] = []
        for name in SETTINGS:
            try:
                self.get(name)
            except (TypeError, ValueError) as exc:
                problems.append(exc)
        return problems


def _check(name: str, value: Any, conf: Any, written: Mapping[str, str] | None) -> Any:
    check = SETTINGS[name].check
    if written is not None:
        return check(written.get(name, name), value)
    try:
        return check(name, value)
    except (TypeError, ValueError):
        # Only now look up how the user wrote it (a scan of the configuration's keys): the
        # same check raises again, naming CELERY_SINGLETON_LOCK_TTL rather than our name.
        spelling = user_names(conf).get(name, name)
        if spelling != name:
            check(spelling, value)
        raise


def read_settings(conf: Any) -> Settings:
    """Every setting of ``conf`` (an ``app.conf``), read and checked now."""
    written = user_names(conf)
    values: dict[str, Any] = {}
    given: dict[str, Any] = {}
    wrong: set[str] = set()
    for name, definition in SETTINGS.items():
        value = _raw(conf, name)
        if value is None:
            values[name] = definition.default
            continue
        given[name] = value
        try:
            values[name] = _check(name, value, conf, written)
        except (TypeError, ValueError):
            wrong.add(name)
    return Settings(values, given, frozenset(wrong), written, _client_from(conf))


#: the settings, ours and Celery's, that the app's lock client is made from (:mod:`.client`)
_CLIENT_SETTINGS = (
    "singleton_lock_client",
    "singleton_lock_redis_url",
    "singleton_lock_redis_options",
)
_BROKER_SETTINGS = ("broker_url", "broker_use_ssl", "broker_transport_options")


def _client_from(conf: Any) -> tuple[Any, ...]:
    """What the app's lock client is made from, as ``conf`` has it now."""
    ours = (_raw(conf, name) for name in _CLIENT_SETTINGS)
    broker = (conf.get(name) for name in _BROKER_SETTINGS)
    return (*ours, *broker)


#: app -> its settings, read at its first use in this process; gone with the app
_read: weakref.WeakKeyDictionary[Any, Settings] = weakref.WeakKeyDictionary()
#: app -> what its lock client is made from, as its settings were last read (kept across
#: reload_settings, which compares it with the configuration's)
_client_inputs: weakref.WeakKeyDictionary[Any, tuple[Any, ...]] = weakref.WeakKeyDictionary()
_read_lock = threading.Lock()


def settings_of(app: Any) -> Settings:
    """The app's settings: read from ``app.conf`` the first time they are needed in this
    process, then kept until :func:`reload_settings`."""
    try:
        found = _read.get(app)
    except TypeError:  # pragma: no cover - an app object that cannot be weakly referenced
        return read_settings(app.conf)
    if found is None:
        # Read outside the lock: reading may load the configuration (Django's settings), which
        # may run code of the user's that reads a setting too.
        fresh = read_settings(app.conf)
        with _read_lock:
            found = _read.setdefault(app, fresh)
            _client_inputs[app] = found.client_from
    return found


def reload_settings(app: Any) -> None:
    """Read the app's ``celery-singleton-lock`` settings from ``app.conf`` again.

    The settings are read once per app and process, when a worker or beat starts or at the
    first publish or lock; a change made to ``app.conf`` after that is seen once this is
    called. The next use reads and checks every setting again, as the first one did (a wrong
    value raises then, naming it; a misspelt name is reported by the next check). The lock
    client is made again when what it is made from changed (the lock URL, its options, an
    injected client, the broker's URL and TLS options); otherwise it is kept, with its
    connections."""
    with _read_lock:
        _read.pop(app, None)
        inputs = _client_inputs.get(app)
    if inputs is None or inputs != _client_from(app.conf):
        from .client import reset_client  # the client module reads the settings: imported late

        reset_client(app)


def setting(app: Any, name: str) -> Any:
    """A setting from ``app.conf``, under its own name or Django's ``CELERY_`` namespace, its
    default when unset, as read at the app's first use (see :func:`reload_settings`). A wrong
    value raises ``TypeError`` / ``ValueError`` naming the setting as the user wrote it."""
    return settings_of(app).get(name)


def peek_setting(app: Any, name: str) -> Any:
    """:func:`setting`, without reading all the settings for good when the app has not been
    used yet: for :func:`~celery_singleton_lock.install`, called while the app module is still
    being configured."""
    found = _read.get(app)
    if found is not None:
        return found.get(name)
    value = _raw(app.conf, name)
    return DEFAULTS[name] if value is None else _check(name, value, app.conf, None)


def is_set(app: Any, name: str) -> bool:
    """Whether the user set ``name`` (under any of its spellings), as opposed to its default
    (like :func:`peek_setting`, it does not read all the settings for good)."""
    found = _read.get(app)
    if found is not None:
        return name in found.given
    return _raw(app.conf, name) is not None


def settings_table() -> str:
    """The README's settings table (Markdown), made from the definition."""
    rows = ["| setting | default | meaning |", "| --- | --- | --- |"]
    for s in SETTINGS.values():
        rows.append(f"| `{s.name}` | {s.shown} | {s.doc} |")
    return "\n".join(rows)
