"""The settings: their one definition (name, default, the README's words, a check), and how
``app.conf`` is read for them: with Celery's own ``conf.get``, whose namespace mapping gives a
Django project's ``CELERY_SINGLETON_LOCK_*`` names. :mod:`.config` keeps what is read, per app.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from .._lock import check_duration, check_prefix
from .urls import REDIS_SCHEMES, SentinelURL, parse_sentinel_url, scheme_of

__all__ = [
    "DEFAULTS",
    "ENVIRONMENT",
    "REDIS_SCHEMES",
    "SETTINGS",
    "SentinelURL",
    "Setting",
    "check_seconds",
    "given",
    "parse_sentinel_url",
    "read",
    "scheme_of",
    "settings_table",
    "spelling",
]


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


def _app_path(name: str, value: Any) -> str:
    if not isinstance(value, str) or not all(value.partition(":")[::2]):
        raise ValueError(
            f"{name} must be 'module:attribute', such as 'proj.celery:app', got {value!r}"
        )
    return value


def _bool(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False, got {value!r}")
    return value


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
            "(e.g. `django_celery_beat.schedulers:DatabaseScheduler`, `redbeat.RedBeatScheduler`)",
            _class_path,
        ),
        Setting(
            "singleton_lock_tasks",
            {},
            "`{}`",
            "`{task name: options}`, as `install(app, tasks=...)`: read by `install(app)`, and "
            "by a worker or beat whose app has a `LockedTask` even without that call "
            "(publish-time dedup needs `install(app)` in the processes that publish); an app "
            "that neither calls `install(app)` nor has a `LockedTask` never reads it",
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
        Setting(
            "singleton_lock_counts",
            True,
            "`True`",
            "count duplicates, refusals and lost locks per minute in Redis "
            "(`<prefix>:counts:<minute>` hashes, kept 2 h) for the locks web page's last hour; "
            "a task pays a dict increment on those paths only, a thread writes them each second",
            _bool,
        ),
        Setting(
            "singleton_lock_web_app",
            None,
            "Celery's current app",
            "Django only: the Celery app of the locks page mounted in the project "
            '(`celery_singleton_lock.web.django`), as `"proj.celery:app"`',
            _app_path,
        ),
        Setting(
            "singleton_lock_web_options",
            {},
            "`{}`",
            "Django only: the page's options (`make_app`'s: `link_pattern`, `refresh`, "
            "`page_size` ...)",
            _dict,
        ),
    )
}
DEFAULTS: dict[str, Any] = {name: s.default for name, s in SETTINGS.items()}

#: the environment variables the package reads, with the settings table's words
ENVIRONMENT: dict[str, tuple[str, str]] = {
    "CELERY_SINGLETON_LOCK_WEB_TOKEN": (
        "unset: read-only",
        "environment variable, not a setting: the token that `celery locks web` asks for "
        "before a release or a purge (never on the command line, where `ps` shows it)",
    ),
}


#: names under this package's prefix that no Celery setting reads, never a misspelling of
#: ours: celery-singleton's lease setting, which its drop-in (compat.singleton) reads
_OTHER_PACKAGES_NAMES = frozenset({"singleton_lock_expiry"})


def given(conf: Any, name: str) -> Any:
    """The value the user gave the setting ``name`` in ``conf`` (an ``app.conf``), or ``None``:
    Celery's ``conf.get``, which applies the app's namespace (Django's ``CELERY_``)."""
    return conf.get(name)


def _ours(key: object) -> str | None:
    """The setting a configuration key means (``CELERY_SINGLETON_LOCK_TTL`` means
    ``singleton_lock_ttl``), when it is under this package's prefix."""
    if not isinstance(key, str):
        return None
    lowered = key.lower()
    lowered = lowered.removeprefix("celery_")
    return lowered if lowered.startswith("singleton_lock_") else None


def spelling(conf: Any, name: str) -> str:
    """``name`` as the user wrote it in ``conf`` (looked up only for an error's sake)."""
    return next((key for key in list(conf.keys()) if _ours(key) == name), name)


def read(conf: Any) -> tuple[dict[str, Any], list[TypeError | ValueError]]:
    """Every setting of ``conf`` (an ``app.conf``), checked: its value or default, and every
    problem in words: a value its setting cannot take (named as the user wrote it), and a name
    under this package's prefix that no setting reads (a misspelling, with the closest
    setting; or a spelling this app's configuration does not read, such as an upper-case name
    without Django's ``CELERY`` namespace)."""
    values: dict[str, Any] = {}
    problems: list[TypeError | ValueError] = []
    for name, definition in SETTINGS.items():
        value = given(conf, name)
        if value is None:
            values[name] = definition.default
            continue
        try:
            values[name] = definition.check(name, value)
        except (TypeError, ValueError):
            values[name] = definition.default
            try:
                definition.check(spelling(conf, name), value)
            except (TypeError, ValueError) as exc:
                problems.append(exc)
    for key in list(conf.keys()):
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
        elif given(conf, meant) is None:
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
    for s in SETTINGS.values():
        rows.append(f"| `{s.name}` | {s.shown} | {s.doc} |")
    for name, (shown, doc) in ENVIRONMENT.items():
        rows.append(f"| `{name}` | {shown} | {doc} |")
    return "\n".join(rows)
