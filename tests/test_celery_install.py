"""``install(app, tasks=...)`` and the ``singleton_lock_tasks`` setting: plain
tasks (no base class) get the same locking, run-time skip and publish-time dedup, including
``send_task`` by name; ``install`` is idempotent."""

from __future__ import annotations

import gc
import uuid
import weakref
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from celery import signals
from celery_fixtures import BASE_CONF, CeleryEnv, Gates, app_task, lock_space, new_app
from lock_helpers import wait_until

from celery_singleton_lock import LockedTask, install

gates = Gates()
app = new_app("csl_install")
app.conf.singleton_lock_tasks = {"inst.from_setting": {"lock_ttl": 9}}


def _key() -> str:
    return uuid.uuid4().hex


@app_task(app, name="inst.plain")
def plain(key: str) -> str:
    gates.enter(key)
    return key


@app_task(app, name="inst.plain_pub")
def plain_pub(key: str) -> str:
    gates.enter(key)
    return key


@app_task(app, bind=True, name="inst.from_setting")
def from_setting(self: Any, key: str) -> str:
    gates.enter(key)
    return key


@app_task(app, name="inst.untouched")
def untouched(key: str) -> str:
    gates.enter(key)
    return key


@app_task(app, base=LockedTask, name="inst.base_pub", lock_at="publish")
def base_pub(key: str) -> str:
    return key


install(
    app, tasks={"inst.plain": {}, "inst.plain_pub": {"lock_at": "publish", "lock_queue_ttl": 90}}
)
install(app, tasks={"inst.plain": {}})  # a second call is harmless


#: the in-process worker and the settings of the conftest ``env`` fixture
CELERY_ENV = {"concurrency": 8}


def test_installed_tasks_are_locked_and_others_are_not(env: CeleryEnv) -> None:
    for task in (plain, plain_pub, from_setting):
        assert isinstance(task, LockedTask), task.name
        assert type(env.app.tasks[task.name]).__mro__.count(LockedTask) == 1
    assert not isinstance(untouched, LockedTask)
    assert plain_pub.locking.options.lock_at == "publish"
    assert from_setting.locking.options.lock_ttl == 9


@pytest.mark.parametrize("task", [plain, from_setting], ids=["install", "setting"])
def test_a_duplicate_run_of_an_installed_task_is_skipped(env: CeleryEnv, task: Any) -> None:
    k = _key()
    first = task.delay(k)
    gates.wait_started(k)
    assert task.lock_holder(k) == first.id
    dup = env.app.send_task(task.name, args=[k])
    env.wait_state(dup.id, "SKIPPED")
    assert env.meta(dup.id)["holder"] == first.id
    gates.open(k)
    assert first.get(timeout=10) == k
    assert gates.runs[k] == 1
    wait_until(lambda: not task.is_locked(k), 3)


def test_the_setting_s_options_apply_to_the_run(env: CeleryEnv) -> None:
    k = _key()
    first = from_setting.delay(k)
    gates.wait_started(k)
    pttl = env.locks.pttl(from_setting.lock_key_for(k))
    gates.open(k)
    first.get(timeout=10)
    assert 6_000 < pttl <= 9_000  # lock_ttl=9 from singleton_lock_tasks


def test_an_uninstalled_task_is_not_locked(env: CeleryEnv) -> None:
    k = _key()
    first = untouched.delay(k)
    second = untouched.delay(k)
    wait_until(lambda: gates.runs[k] == 2, 10)  # both run at once
    gates.open(k)
    first.get(timeout=10)
    second.get(timeout=10)


def test_publish_dedup_of_an_installed_task(env: CeleryEnv) -> None:
    k = _key()
    first = plain_pub.delay(k)
    gates.wait_started(k)
    assert plain_pub.delay(k).id == first.id
    gates.open(k)
    assert first.get(timeout=10) == k
    assert gates.runs[k] == 1
    wait_until(lambda: not plain_pub.is_locked(k), 3)
    assert plain_pub.delay(k).get(timeout=10) == k  # free again: a new run


def test_send_task_by_name_takes_the_publish_lock(env: CeleryEnv) -> None:
    k = _key()
    r = env.app.send_task("inst.plain_pub", args=[k], queue="csl-nowhere")
    assert plain_pub.lock_holder(k) == r.id
    assert 85_000 < env.locks.pttl(plain_pub.lock_key_for(k)) <= 90_000  # lock_queue_ttl
    assert plain_pub.delay(k).id == r.id  # a later publish is deduplicated onto it
    assert plain_pub.release_lock(k)


@pytest.mark.parametrize("delay", ["countdown", "eta"])
def test_send_task_with_a_delay_holds_the_publish_lock_for_the_delay_too(
    env: CeleryEnv, delay: str
) -> None:
    # As apply_async does: the lease is the delay plus lock_queue_ttl (90 s here), so the
    # lock cannot expire while the message waits for its eta.
    k = _key()
    when: dict[str, Any] = (
        {"countdown": 600}
        if delay == "countdown"
        else {"eta": datetime.now(UTC) + timedelta(seconds=600)}
    )
    r = env.app.send_task("inst.plain_pub", args=[k], queue="csl-nowhere", **when)
    assert plain_pub.lock_holder(k) == r.id
    assert 680_000 < env.locks.pttl(plain_pub.lock_key_for(k)) <= 690_000
    assert plain_pub.release_lock(k)


def test_an_installed_app_is_not_kept_alive_by_the_package() -> None:
    # Per-app caches are weak, and the signal receivers hold no app: an app that its owner
    # dropped is collected (a new app that got its id() must never inherit its client).
    gone = new_app("csl_install_gone", broker="redis://127.0.0.1:1/0")
    install(gone, tasks={"gone.task": {"lock_at": "publish"}})
    gone.finalize()
    assert lock_space(gone).client is not None
    ref = weakref.ref(gone)
    del gone
    gc.collect()
    assert ref() is None


def test_install_again_after_finalize_is_harmless(env: CeleryEnv) -> None:
    cls = type(env.app.tasks[plain.name])
    receivers = len(signals.worker_init.receivers)
    finalize_receivers = len(env.app.on_after_finalize.receivers or [])
    install(env.app, tasks={"inst.plain": {}})
    install(env.app)
    assert type(env.app.tasks[plain.name]) is cls
    assert cls.__mro__.count(LockedTask) == 1
    assert len(signals.worker_init.receivers) == receivers
    assert len(env.app.on_after_finalize.receivers or []) == finalize_receivers
    # and it still behaves
    k = _key()
    first = plain.delay(k)
    gates.wait_started(k)
    dup = plain.delay(k)
    env.wait_state(dup.id, "SKIPPED")
    gates.open(k)
    first.get(timeout=10)
    assert gates.runs[k] == 1


def test_send_task_of_a_base_class_task_by_the_installed_app_takes_the_publish_lock(
    env: CeleryEnv,
) -> None:
    k = _key()
    r = env.app.send_task("inst.base_pub", args=[k], queue="csl-nowhere")
    assert base_pub.lock_holder(k) == r.id
    assert base_pub.release_lock(k)


def test_another_app_s_message_is_not_locked_in_the_installed_app_s_redis(
    env: CeleryEnv,
) -> None:
    # Two apps in one process; only `app` is installed, and it knows a task of the same name
    # (Celery registers shared tasks in every app). A message that the other app publishes
    # must not take a lock in the installed app's Redis.
    other = new_app("csl_install_other")
    other.conf.update(BASE_CONF)
    other.conf.update(
        broker_url=env.app.conf.broker_url,
        singleton_lock_redis_url=f"redis://127.0.0.1:{env.server.port}/3",
    )
    k = _key()
    r = other.send_task("inst.base_pub", args=[k], queue="csl-nowhere")
    assert base_pub.lock_holder(k) is None, f"{r.id} was locked in the other app's Redis"
    assert not env.locks.exists(base_pub.lock_key_for(k))
