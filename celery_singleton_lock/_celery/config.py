"""One configuration object per app: its settings, read and checked once, its lock client and
its lock spaces.

:meth:`LockConfig.of` builds an app's config at its first use in the process (a worker's or
beat's start, a publisher's first lock) from ``app.conf``, and keeps it until
:func:`reload_settings`. A wrong value or a misspelt name fails that first use, naming each
problem; nothing is looked up by name again on a task's path. The client is made at the first
lock and kept across a fork (redis-py's pool reconnects in the child; the lock layer's own fork
hook gives the child fresh holds and threads).
"""

from __future__ import annotations

import threading
import weakref
from typing import Any, NamedTuple

from .._lock import LockSpace
from .counts import RecentCounter
from .settings import SETTINGS, read

__all__ = ["Bound", "LockConfig", "close", "peek", "reload_settings"]

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
    """An app's settings as read from ``app.conf`` (each as an attribute: ``ttl`` is
    ``singleton_lock_ttl``), with its lock client and lock spaces."""

    __slots__ = (
        "__weakref__",
        "_app",
        "_client",
        "_counter",
        "_inputs",
        "_mutex",
        "_spaces",
        "backend_timeout",
        "beat_scheduler",
        "client_setting",
        "counts",
        "metrics_address",
        "metrics_port",
        "on_backend_error",
        "prefix",
        "problems",
        "queue_ttl",
        "redis_options",
        "redis_url",
        "tasks",
        "ttl",
    )

    def __init__(self, app: Any, previous: LockConfig | None = None) -> None:
        conf = app.conf
        values, problems = read(conf)
        #: every problem of the settings (empty when all is well)
        self.problems: tuple[TypeError | ValueError, ...] = tuple(problems)
        self.redis_url: str | None = values["singleton_lock_redis_url"]
        self.redis_options: dict[str, Any] = values["singleton_lock_redis_options"]
        self.client_setting: Any = values["singleton_lock_client"]
        self.prefix: str = values["singleton_lock_prefix"]
        self.ttl: float = values["singleton_lock_ttl"]
        self.queue_ttl: float = values["singleton_lock_queue_ttl"]
        #: ``singleton_lock_on_backend_error == "proceed"``
        self.on_backend_error: str = values["singleton_lock_on_backend_error"]
        self.backend_timeout: float = values["singleton_lock_backend_timeout"]
        self.beat_scheduler: Any = values["singleton_lock_beat_scheduler"]
        self.tasks: dict[str, Any] = dict(values["singleton_lock_tasks"])
        self.metrics_port: int | None = values["singleton_lock_metrics_port"]
        self.metrics_address: str = values["singleton_lock_metrics_address"]
        #: ``singleton_lock_counts``: count duplicates, refusals and lost locks in Redis
        self.counts: bool = values["singleton_lock_counts"]
        self._app = weakref.ref(app)
        self._inputs = tuple(conf.get(name) for name in _CLIENT_INPUTS)
        self._mutex = threading.Lock()
        self._spaces: dict[str, LockSpace] = {}
        # A reload keeps the client (and its connections) unless what it is made from changed,
        # and the recent counts not written yet with it.
        self._client: Any = previous.client_if_made_from(self._inputs) if previous else None
        self._counter: RecentCounter | None = None
        counted = previous.counter_if_made if previous is not None else None
        if counted is not None:
            if self._client is not None:
                self._counter = counted
            else:  # a new client: the old one's counts are written now, its thread stopped
                counted.close()

    def client_if_made_from(self, inputs: tuple[Any, ...]) -> Any:
        """This config's client when it was made from ``inputs`` too (else ``None``)."""
        return self._client if inputs == self._inputs else None

    def check(self) -> None:
        """Raise what :attr:`problems` says: one problem as it is (``TypeError`` or
        ``ValueError``), several as one ``ValueError`` listing them all."""
        if len(self.problems) == 1:
            raise self.problems[0]
        if self.problems:
            listed = "; ".join(map(str, self.problems))
            raise ValueError(f"celery-singleton-lock settings: {listed}")

    @property
    def proceed_on_backend_error(self) -> bool:
        return self.on_backend_error == "proceed"

    @property
    def client(self) -> Any:
        """The app's lock client, made at its first use (the settings are checked then: a
        publisher finds a wrong or misspelt one at its first publish)."""
        client = self._client
        if client is None:
            with self._mutex:
                client = self._client
                if client is None:
                    self.check()
                    from .client import make_client  # redis-py's client classes, when needed

                    app = self._app()
                    assert app is not None, "a config outlives its app only while unused"
                    client = self._client = make_client(self, app.conf)
        return client

    @property
    def counter(self) -> RecentCounter:
        """The app's recent counts not written yet (``singleton_lock_counts``), made at the
        first count."""
        counter = self._counter
        if counter is None:
            client = self.client  # made under the same mutex: taken before it
            with self._mutex:
                counter = self._counter
                if counter is None:
                    counter = self._counter = RecentCounter(client)
        return counter

    @property
    def counter_if_made(self) -> RecentCounter | None:
        return self._counter

    def space(self, prefix: str | None = None) -> LockSpace:
        """The app's locks under ``prefix`` (``None``: ``singleton_lock_prefix``), every
        operation bounded by ``singleton_lock_backend_timeout``."""
        key = self.prefix if prefix is None else prefix
        space = self._spaces.get(key)
        if space is None:
            space = LockSpace(self.client, key, backend_timeout=self.backend_timeout)
            self._spaces[key] = space
        return space

    # -- one config per app ---------------------------------------------------------------------

    @classmethod
    def of(cls, app: Any) -> LockConfig:
        """The app's config: read from ``app.conf`` at its first use in this process, then kept
        until :func:`reload_settings`."""
        config = _configs.get(app)
        if config is None:
            # Read outside the lock: reading may load the configuration (Django's settings),
            # which may run user code that uses a lock of this app too.
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
#: app -> the config that reload_settings dropped, until the next one is read (its client is
#: kept when the next one is made from the same settings)
_replaced: weakref.WeakKeyDictionary[Any, LockConfig] = weakref.WeakKeyDictionary()
_registry = threading.Lock()


def reload_settings(app: Any) -> None:
    """Read the app's ``celery-singleton-lock`` settings from ``app.conf`` again, at their next
    use.

    They are read once per app and process, when a worker or beat starts or at the first
    publish or lock; a change made to ``app.conf`` after that is seen once this is called. The
    lock client is kept, with its connections, unless what it is made from changed (the lock
    URL, its options, an injected client, the backend timeout, the broker's URL and options)."""
    with _registry:
        previous = _configs.pop(app, None)
        if previous is not None:
            _replaced[app] = previous


def close(app: Any) -> bool:
    """Write the recent counts of ``app`` not written yet (setting ``singleton_lock_counts``)
    now, and end the thread of this process that writes them: none is written after this
    returns, until the app's next count starts that thread again (the app can still be used,
    as a redis-py client after its ``close()``).

    Call it where you are done with an app while the process goes on, next to ``app.close()``
    (Celery offers no hook on that): the app of a test, before the test's Redis is emptied or
    stopped (else its counts land there about a second later, in the next test's data), or an
    app made per tenant. A worker and a process that exits write theirs without it. Locks held
    through the app stay held.

    Returns whether Redis took the counts (``True`` when there were none): a write it refuses
    is logged on ``celery_singleton_lock.counts``, its counts kept for the app's next count."""
    with _registry:
        configs = [_configs.get(app), _replaced.get(app)]
    written = True
    for config in configs:
        counter = config.counter_if_made if config is not None else None
        if counter is not None:
            written = counter.close() and written
    return written


def peek(app: Any, name: str) -> Any:
    """One setting, checked, without reading the app's config for good: for
    :func:`~celery_singleton_lock.install`, called while the app module is still being
    configured."""
    config = _configs.get(app)
    if config is not None:
        attribute = name.removeprefix("singleton_lock_")
        return getattr(config, "client_setting" if attribute == "client" else attribute)
    value = app.conf.get(name)
    return SETTINGS[name].default if value is None else SETTINGS[name].check(name, value)
