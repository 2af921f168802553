"""The settings, and the validation of the per-task options when a task class is made.

Every app here is made by the test (tasks are defined with ``shared=False``, so a task with
bad options never reaches another app's finalization)."""

from __future__ import annotations

import gc
import uuid
import weakref
from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery, signals
from celery_fixtures import (
    BASE_CONF,
    DB_BROKER,
    app_task,
    new_app,
    own_redis_server,
    running_worker,
)
from celery_procs import close_app

from celery_singleton_lock import (
    LockBackendError,
    LockedTask,
    MisconfiguredError,
    install,
    reload_settings,
)
from celery_singleton_lock.testing import RedisServer, free_port


@pytest.fixture(scope="module")
def server() -> Iterator[RedisServer]:
    with own_redis_server() as server:
        yield server


def _app(name: str, **conf: Any) -> Celery:
    app = new_app(name)
    app.conf.update(BASE_CONF)
    app.conf.update(conf)
    return app


def _queued_lock_task(app: Celery, **options: Any) -> LockedTask:
    """A publish-time task: publishing it to a queue no worker reads takes its lock."""

    @app_task(
        app, base=LockedTask, name="settings.queued", lock_at="publish", shared=False, **options
    )
    def queued(x: Any) -> None:
        return None

    return queued


def _lock_keys(client: Any) -> list[str]:
    return sorted(k.decode() for k in client.scan_iter(match="*{settings.queued:*}"))


# -- where the locks live ---------------------------------------------------------------------


def test_url_defaults_to_a_redis_broker_url(server: RedisServer) -> None:
    app = _app("s_default", broker_url=f"redis://127.0.0.1:{server.port}/3")
    task = _queued_lock_task(app)
    task.apply_async((uuid.uuid4().hex,), queue="csl-nowhere")
    locks = _lock_keys(server.client(db=3))
    assert len(locks) == 1 and locks[0].startswith("lock:{settings.queued:")
    assert not _lock_keys(server.client(db=4))


def test_singleton_lock_redis_url_wins_over_the_broker(server: RedisServer) -> None:
    app = _app(
        "s_url",
        broker_url=f"redis://127.0.0.1:{server.port}/3",
        singleton_lock_redis_url=f"redis://127.0.0.1:{server.port}/4",
    )
    task = _queued_lock_task(app)
    x = uuid.uuid4().hex
    task.apply_async((x,), queue="csl-nowhere")
    assert server.client(db=4).exists(task.lock_key_for(x))
    assert not server.client(db=3).exists(task.lock_key_for(x))


def test_a_non_redis_broker_needs_the_url_and_says_so_at_first_use() -> None:
    app = _app("s_amqp", broker_url="amqp://guest:guest@127.0.0.1:5672//")
    task = _queued_lock_task(app)  # defining the task does not fail
    app.finalize()
    assert task.lock_key_for(1)  # nor does computing a key
    with pytest.raises(MisconfiguredError) as info:
        task.is_locked(1)
    assert "singleton_lock_redis_url" in str(info.value)
    assert "amqp" in str(info.value)
    assert not isinstance(info.value, LockBackendError)  # a setting to fix, not an outage
    with pytest.raises(MisconfiguredError, match="singleton_lock_redis_url"):
        task.delay(1)


def test_a_wrong_url_names_the_setting() -> None:
    app = _app(
        "s_wrong",
        broker_url="redis://127.0.0.1:1/0",
        singleton_lock_redis_url="http://127.0.0.1:6379/0",
    )
    task = _queued_lock_task(app)
    with pytest.raises(ValueError, match="singleton_lock_redis_url"):
        task.is_locked(1)
    app.conf.singleton_lock_redis_url = "redis://127.0.0.1:notaport/0"
    reload_settings(app)
    with pytest.raises(ValueError, match="singleton_lock_redis_url"):
        task.is_locked(1)


def test_singleton_lock_client_as_a_client_takes_precedence(server: RedisServer) -> None:
    client = server.client(db=5)
    app = _app(
        "s_client",
        broker_url=f"redis://127.0.0.1:{server.port}/3",
        singleton_lock_redis_url=f"redis://127.0.0.1:{free_port()}/0",  # nothing listens
        singleton_lock_client=client,
    )
    task = _queued_lock_task(app)
    x = uuid.uuid4().hex
    task.apply_async((x,), queue="csl-nowhere")
    assert client.exists(task.lock_key_for(x))
    assert task.is_locked(x)


def test_singleton_lock_client_as_a_callable(server: RedisServer) -> None:
    calls: list[int] = []

    def make() -> Any:
        calls.append(1)
        return server.client(db=6)

    app = _app(
        "s_callable",
        broker_url=f"redis://127.0.0.1:{server.port}/3",
        singleton_lock_client=make,
    )
    task = _queued_lock_task(app)
    x = uuid.uuid4().hex
    task.apply_async((x,), queue="csl-nowhere")
    assert task.is_locked(x) and task.lock_holder(x)
    assert server.client(db=6).exists(task.lock_key_for(x))
    assert calls == [1]  # made once, then reused


def test_singleton_lock_client_of_the_wrong_type_names_the_setting() -> None:
    app = _app("s_badclient", broker_url="redis://127.0.0.1:1/0", singleton_lock_client="nope")
    task = _queued_lock_task(app)
    with pytest.raises(TypeError, match="singleton_lock_client"):
        task.is_locked(1)


def test_singleton_lock_prefix(server: RedisServer) -> None:
    app = _app(
        "s_prefix",
        broker_url=f"redis://127.0.0.1:{server.port}/3",
        singleton_lock_redis_url=f"redis://127.0.0.1:{server.port}/8",
        singleton_lock_prefix="myapp-locks",
    )
    task = _queued_lock_task(app)
    x = uuid.uuid4().hex
    key = task.lock_key_for(x)
    assert key.startswith("myapp-locks:{settings.queued:")
    task.apply_async((x,), queue="csl-nowhere")
    found = [k.decode() for k in server.client(db=8).scan_iter(match="*")]
    assert key in found
    assert all(k.startswith("myapp-locks:") for k in found)
    app.conf.singleton_lock_prefix = "bad{prefix}"
    assert task.lock_key_for(x) == key  # read once: unseen until reload_settings
    reload_settings(app)
    with pytest.raises(ValueError, match="singleton_lock_prefix"):
        task.lock_key_for(x)


def test_django_style_celery_namespace_settings(server: RedisServer) -> None:
    class DjangoSettings:
        CELERY_BROKER_URL = f"redis://127.0.0.1:{server.port}/{DB_BROKER}"
        CELERY_RESULT_BACKEND = f"redis://127.0.0.1:{server.port}/1"
        CELERY_SINGLETON_LOCK_REDIS_URL = f"redis://127.0.0.1:{server.port}/9"
        CELERY_SINGLETON_LOCK_PREFIX = "dj"
        CELERY_SINGLETON_LOCK_TTL = 5
        CELERY_SINGLETON_LOCK_QUEUE_TTL = 77
        CELERY_WORKER_HIJACK_ROOT_LOGGER = False

    app = new_app("s_django")
    app.config_from_object(DjangoSettings, namespace="CELERY")
    locks = server.client(db=9)

    @app_task(app, base=LockedTask, bind=True, name="settings.dj_run", shared=False)
    def dj_run(self: Any, x: Any) -> dict[str, Any]:
        return {"key": self.lock.key, "pttl": int(locks.pttl(self.lock.key))}

    queued = _queued_lock_task(app)
    x = uuid.uuid4().hex
    queued.apply_async((x,), queue="csl-nowhere")
    key = queued.lock_key_for(x)
    assert key.startswith("dj:{")
    assert 75_000 < locks.pttl(key) <= 77_000  # CELERY_SINGLETON_LOCK_QUEUE_TTL

    with running_worker(app, pool="solo", concurrency=1):
        seen = dj_run.delay(x).get(timeout=10)
    assert seen["key"].startswith("dj:{settings.dj_run:")
    assert 3_000 < seen["pttl"] <= 5_000  # CELERY_SINGLETON_LOCK_TTL
    assert not locks.exists(seen["key"])


# -- read once per app, read again by reload_settings -----------------------------------------


def _run_lease(app: Celery) -> float:
    """The lease of a run's lock under ``app``'s settings (``singleton_lock_ttl``): an eager
    run's own lock, read in its body."""

    @app_task(
        app, base=LockedTask, bind=True, name=f"settings.lease_{uuid.uuid4().hex}", shared=False
    )
    def lease(self: LockedTask) -> float:
        return float(self.lock.ttl)

    return float(lease.apply().get(timeout=10))


def _lock_client(app: Celery) -> Any:
    """The lock client of ``app``, as a locked task of it reaches it."""
    return LockedTask.lock_space(app).client


def test_settings_are_read_once_and_again_after_reload_settings(server: RedisServer) -> None:
    app = _app("s_reload", broker_url=f"redis://127.0.0.1:{server.port}/3")
    task = _queued_lock_task(app)
    assert _run_lease(app) == 30.0
    app.conf.singleton_lock_ttl = 12
    app.conf.update(singleton_lock_prefix="changed")
    # the first use read them: a change made afterwards is not seen ...
    assert _run_lease(app) == 30.0
    assert task.key_prefix(app) == "lock"
    reload_settings(app)
    # ... until the one call that reads them again
    assert _run_lease(app) == 12.0
    assert task.key_prefix(app) == "changed"


def test_reload_settings_makes_a_new_lock_client_from_the_new_settings(
    server: RedisServer,
) -> None:
    app = _app(
        "s_reload_client",
        broker_url=f"redis://127.0.0.1:{server.port}/3",
        singleton_lock_redis_url=f"redis://127.0.0.1:{server.port}/4",
    )
    task = _queued_lock_task(app)
    first = uuid.uuid4().hex
    task.apply_async((first,), queue="csl-nowhere")
    assert server.client(db=4).exists(task.lock_key_for(first))
    client = _lock_client(app)
    app.conf.singleton_lock_redis_url = f"redis://127.0.0.1:{server.port}/5"
    assert _lock_client(app) is client  # unseen so far
    reload_settings(app)
    assert _lock_client(app) is not client
    second = uuid.uuid4().hex
    task.apply_async((second,), queue="csl-nowhere")
    assert server.client(db=5).exists(task.lock_key_for(second))
    assert not server.client(db=4).exists(task.lock_key_for(second))


def test_reload_settings_keeps_the_lock_client_when_its_settings_did_not_change(
    server: RedisServer,
) -> None:
    app = _app(
        "s_reload_keep",
        broker_url=f"redis://127.0.0.1:{server.port}/3",
        singleton_lock_redis_options={"socket_timeout": 4},
    )
    client = _lock_client(app)
    app.conf.singleton_lock_ttl = 12
    app.conf.singleton_lock_redis_options = {"socket_timeout": 4}  # equal: the same client
    reload_settings(app)
    assert _lock_client(app) is client
    assert _run_lease(app) == 12.0
    app.conf.broker_url = f"redis://127.0.0.1:{server.port}/6"  # the locks follow the broker
    reload_settings(app)
    assert _lock_client(app) is not client
    assert _lock_client(app).connection_pool.connection_kwargs["db"] == 6


def test_reload_settings_checks_again_at_the_next_use() -> None:
    app = _app("s_reload_wrong", broker_url="redis://127.0.0.1:1/0")
    task = _queued_lock_task(app)
    assert task.queue_lease(app) == 3600.0
    app.conf.singleton_lock_queue_ttl = "1h"
    reload_settings(app)  # reading again raises nothing itself ...
    with pytest.raises(TypeError, match="singleton_lock_queue_ttl must be a number of seconds"):
        task.lock_key_for(1)  # ... the first use that checks does
    app.conf.singleton_lock_queue_ttl = 60
    reload_settings(app)
    assert task.queue_lease(app) == 60.0


class _WorkerStandIn:
    """What ``worker_init``'s receivers read of the worker sent with it: its app."""

    def __init__(self, app: Celery) -> None:
        self.app = app


def test_a_worker_start_reads_the_settings_again(
    server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    """What a worker's start does: Celery sends ``worker_init`` with the worker (here a stand-in
    with its app: a worker made would stay in this process's Celery state)."""
    app = _app("s_worker_start", broker_url=f"redis://127.0.0.1:{server.port}/3")
    assert _run_lease(app) == 30.0
    app.conf.singleton_lock_ttl = 7
    signals.worker_init.send(sender=_WorkerStandIn(app))
    assert _run_lease(app) == 7.0
    app.conf.singleton_lock_ttl = "7s"
    with pytest.raises(SystemExit) as stopped:
        signals.worker_init.send(sender=_WorkerStandIn(app))
    assert stopped.value.code == 1  # the reason is logged once, not repeated by the exit
    assert "singleton_lock_ttl must be a number of seconds" in str(stopped.value.__cause__)
    assert "the worker cannot start: singleton_lock_ttl must be a number" in caplog.text


def test_install_before_the_app_is_configured_does_not_freeze_the_settings(
    server: RedisServer,
) -> None:
    app = _app("s_install_early", broker_url=f"redis://127.0.0.1:{server.port}/3")
    install(app)  # where the app module calls it, before the rest of its configuration
    app.conf.singleton_lock_ttl = 9
    assert _run_lease(app) == 9.0


def test_settings_are_kept_per_app_and_go_with_it(server: RedisServer) -> None:
    broker = f"redis://127.0.0.1:{server.port}/3"
    one = _app("s_one", broker_url=broker, singleton_lock_ttl=1)
    two = _app("s_two", broker_url=broker, singleton_lock_ttl=2)
    assert (_run_lease(one), _run_lease(two)) == (1.0, 2.0)
    assert "_singleton_lock" not in " ".join(map(str, vars(one.conf)))  # nothing of ours there
    gone = weakref.ref(one)
    close_app(one)
    del one
    gc.collect()
    assert gone() is None  # what the package keeps of an app does not keep it alive
    assert _run_lease(two) == 2.0


def test_a_misspelt_setting_is_found_in_the_conf_mapping() -> None:
    app = new_app("s_misspelt")
    app.config_from_object({"CELERY_SINGLETON_LOCK_TIMOUT": 5}, namespace="CELERY")
    # one problem: raised as it is (several would be one ValueError listing them all)
    with pytest.raises((TypeError, ValueError)) as problem:
        _queued_lock_task(app).lock_key_for(1)
    assert str(problem.value).startswith(
        "CELERY_SINGLETON_LOCK_TIMOUT is not a celery-singleton-lock setting"
    ), str(problem.value)


# -- bad options at decoration time ----------------------------------------------------------


def _finalized_app() -> Celery:
    app = _app("s_opts", broker_url="redis://127.0.0.1:1/0")
    app.finalize()
    return app


def _body(x: Any, y: Any = 1) -> None:
    return None


@pytest.mark.parametrize(
    "options,error,words",
    [
        ({"lock_at": "x"}, ValueError, ["lock_at", "'x'"]),
        ({"lock_on_locked": "nope"}, ValueError, ["lock_on_locked", "'nope'"]),
        ({"lock_on_duplicate": "ignore"}, ValueError, ["lock_on_duplicate"]),
        ({"lock_ttl": -1}, ValueError, ["lock_ttl", "-1"]),
        ({"lock_queue_ttl": 0}, ValueError, ["lock_queue_ttl"]),
        ({"lock_wait_timeout": "soon"}, TypeError, ["lock_wait_timeout"]),
        ({"lock_retry_countdown": -5}, ValueError, ["lock_retry_countdown"]),
        ({"lock_unique_on": ["missing_param"]}, ValueError, ["lock_unique_on", "missing_param"]),
        ({"lock_unique_on": "x"}, TypeError, ["lock_unique_on"]),
        ({"lock_key": "notcallable"}, TypeError, ["lock_key", "notcallable"]),
        ({"lock_release_on_start": True}, ValueError, ["lock_release_on_start", "publish"]),
    ],
    ids=lambda v: str(v) if isinstance(v, dict) else "",
)
def test_bad_options_raise_at_decoration_naming_task_and_option(
    options: dict[str, Any], error: type[Exception], words: list[str]
) -> None:
    app = _finalized_app()
    with pytest.raises(error) as info:
        app.task(base=LockedTask, name="settings.bad", shared=False, **options)(_body)
    message = str(info.value)
    assert "settings.bad" in message
    for word in words:
        assert word in message


def test_bad_options_on_a_lazy_app_raise_at_finalize_naming_the_task() -> None:
    app = _app("s_lazy", broker_url="redis://127.0.0.1:1/0")
    app.task(base=LockedTask, name="settings.lazy_bad", shared=False, lock_at="x")(_body)
    with pytest.raises(ValueError, match=r"settings\.lazy_bad.*lock_at"):
        app.finalize()


def test_bad_options_on_a_subclass_raise_at_class_creation() -> None:
    with pytest.raises(ValueError, match=r"MyTask.*lock_on_locked"):

        class MyTask(LockedTask):
            lock_on_locked = "sometimes"


def test_unknown_or_bad_options_via_install_name_task_and_option() -> None:
    app = _app("s_install", broker_url="redis://127.0.0.1:1/0")
    with pytest.raises(TypeError) as info:
        install(app, tasks={"settings.plain": {"lock_frobnicate": 1}})
    assert "settings.plain" in str(info.value) and "lock_frobnicate" in str(info.value)
    with pytest.raises(ValueError, match=r"settings\.plain.*lock_at"):
        install(app, tasks={"settings.plain": {"lock_at": "x"}})
    app.conf.singleton_lock_tasks = {"settings.other": {"lock_ttl": -1}}
    with pytest.raises(ValueError, match=r"settings\.other.*lock_ttl"):
        install(app)
