"""One configuration object per app (:meth:`LockConfig.of`): its settings, read and checked
at its first use in the process (a wrong value or a misspelt name fails that use, naming each
problem) and kept until :func:`reload_settings`, its lock client (made at the first lock, kept
across a fork: redis-py's pool reconnects in the child) and its lock spaces.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any, NamedTuple

from .._lock import LockSpace
from .counts import RecentCounter
from .settings import SETTINGS, read

#: what an app's lock client is made from: ours and the broker's settings
_CLIENT_INPUTS = (
    "singleton_lock_client",
    "singleton_lock_redis_url",
    "singleton_lock_redis_options",
    "singleton_lock_backend_timeout",
    "broker_url",
    "broker_use_ssl",
    "broker_transport_options",
)


class LockConfig:
    """An app's settings (``ttl`` is ``singleton_lock_ttl``), lock client and lock spaces."""

    def __init__(self, app: Any, previous: LockConfig | None = None) -> None:
        conf = app.conf
        values, problems = read(conf)
        self.problems: tuple[TypeError | ValueError, ...] = tuple(problems)
        self.redis_url: str | None = values["singleton_lock_redis_url"]
        self.redis_options: dict[str, Any] = values["singleton_lock_redis_options"]
        self.client_setting: Any = values["singleton_lock_client"]
        self.prefix: str = values["singleton_lock_prefix"]
        self.ttl: float = values["singleton_lock_ttl"]
        self.queue_ttl: float = values["singleton_lock_queue_ttl"]
        self.on_backend_error: str = values["singleton_lock_on_backend_error"]
        self.proceed_on_backend_error = self.on_backend_error == "proceed"
        self.backend_timeout: float = values["singleton_lock_backend_timeout"]
        self.beat_scheduler: Any = values["singleton_lock_beat_scheduler"]
        self.tasks: dict[str, Any] = dict(values["singleton_lock_tasks"])
        self.metrics_port: int | None = values["singleton_lock_metrics_port"]
        self.metrics_address: str = values["singleton_lock_metrics_address"]
        self.counts: bool = values["singleton_lock_counts"]
        self._app = weakref.ref(app)
        self._inputs = tuple(conf.get(name) for name in _CLIENT_INPUTS)
        self._mutex = threading.Lock()
        self._spaces: dict[str, LockSpace] = {}
        # a reload keeps the client unless what it is made from changed, and with it the
        # counts not written yet
        self._client: Any = previous.client_if_made_from(self._inputs) if previous else None
        #: the app's recent counts not written yet, if counted yet
        self.counter_if_made: RecentCounter | None = None
        counted = previous.counter_if_made if previous is not None else None
        if counted is not None:
            if self._client is not None:
                self.counter_if_made = counted
            else:  # a new client: the old one's counts are written now, its thread stopped
                counted.close()

    def client_if_made_from(self, inputs: tuple[Any, ...]) -> Any:
        """This config's client when it was made from ``inputs`` too (else ``None``)."""
        return self._client if inputs == self._inputs else None

    def check(self) -> None:
        """Raise the one problem as it is, several as one ``ValueError`` listing them all."""
        if len(self.problems) == 1:
            raise self.problems[0]
        if self.problems:
            listed = "; ".join(map(str, self.problems))
            raise ValueError(f"celery-singleton-lock settings: {listed}")

    @property
    def client(self) -> Any:
        """The app's lock client, made (and the settings checked) at its first use."""
        if self._client is None:
            with self._mutex:
                if self._client is None:
                    self.check()
                    from .client import make_client  # redis-py's client classes, when needed

                    app = self._app()
                    assert app is not None, "a config outlives its app only while unused"
                    self._client = make_client(self, app.conf)
        return self._client

    @property
    def counter(self) -> RecentCounter:
        """The app's recent counts not written yet, made at the first count."""
        if self.counter_if_made is None:
            client = self.client  # made under the same mutex: taken before it
            with self._mutex:
                if self.counter_if_made is None:
                    self.counter_if_made = RecentCounter(client)
        return self.counter_if_made

    def space(self, prefix: str | None = None) -> LockSpace:
        """The app's locks under ``prefix`` (``None``: ``singleton_lock_prefix``), every
        operation bounded by ``singleton_lock_backend_timeout``."""
        key = self.prefix if prefix is None else prefix
        if key not in self._spaces:
            self._spaces[key] = LockSpace(self.client, key, backend_timeout=self.backend_timeout)
        return self._spaces[key]

    @classmethod
    def of(cls, app: Any) -> LockConfig:
        """The app's config, read at its first use in this process."""
        config = _configs.get(app)
        if config is None:
            # read outside the lock: loading the configuration (Django's settings) may run
            # user code that uses a lock of this app too
            fresh = cls(app, _replaced.get(app))
            with _registry:
                config = _configs.setdefault(app, fresh)
                _replaced.pop(app, None)
        return config


class Bound(NamedTuple):
    """What a task class resolves once per app config: the lock space of its keys and the
    lease of a run (see ``TaskLocking.bound``)."""

    config: LockConfig
    space: LockSpace
    ttl: float


#: app -> its config (gone with the app)
_configs: weakref.WeakKeyDictionary[Any, LockConfig] = weakref.WeakKeyDictionary()
#: app -> the config reload_settings dropped, until the next one (which may keep its client)
_replaced: weakref.WeakKeyDictionary[Any, LockConfig] = weakref.WeakKeyDictionary()
_registry = threading.Lock()


def reload_settings(app: Any) -> None:
    """Read the app's settings from ``app.conf`` again at their next use: they are read once
    per app and process (a worker's or beat's start, the first publish or lock). The lock
    client is kept unless what it is made from changed (the lock URL and options, an injected
    client, the backend timeout, the broker's URL and options)."""
    with _registry:
        previous = _configs.pop(app, None)
        if previous is not None:
            _replaced[app] = previous


def close(app: Any) -> bool:
    """Write the app's recent counts not written yet (``singleton_lock_counts``) now, and end
    this process's thread that writes them, until the app's next count (the app stays usable;
    locks held through it stay held).

    Call it next to ``app.close()`` where the process goes on: a test's app, before its Redis
    is emptied or stopped (else its counts land about a second later in the next test's data),
    or an app made per tenant. A worker and an exiting process write theirs without it.

    Returns whether Redis took the counts (``True`` when there were none); a refused write is
    logged on ``celery_singleton_lock.counts``, its counts kept for the app's next count."""
    with _registry:
        configs = [_configs.get(app), _replaced.get(app)]
    counters = [c.counter_if_made for c in configs if c is not None]
    return all([counter.close() for counter in counters if counter is not None])  # closes each


def peek(app: Any, name: str) -> Any:
    """One setting, checked, without reading the app's config for good (``install()`` runs
    while the app module is still being configured)."""
    config = _configs.get(app)
    if config is not None:
        attribute = name.removeprefix("singleton_lock_")
        return getattr(config, "client_setting" if attribute == "client" else attribute)
    value = app.conf.get(name)
    return SETTINGS[name].default if value is None else SETTINGS[name].check(name, value)
