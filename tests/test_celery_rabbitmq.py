"""The same locking with RabbitMQ as the broker (locks stay in Redis whatever the broker):
run-time skip and publish-time dedup through a real worker consuming from RabbitMQ on
127.0.0.1:5672. When no RabbitMQ answers there, the tests say so and are skipped."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from celery_fixtures import CeleryEnv, Gates, app_task, celery_env, new_app
from kombu.connection import Connection
from lock_helpers import wait_until

from celery_singleton_lock import LockedTask

AMQP_URL = "amqp://guest:guest@127.0.0.1:5672//"
QUEUE = f"csl-test-{uuid.uuid4().hex[:12]}"

gates = Gates()
app = new_app("csl_rabbit")


@app_task(app, base=LockedTask, name="rabbit.run")
def run(key: str) -> str:
    gates.enter(key)
    return key


@app_task(app, base=LockedTask, name="rabbit.pub", lock_at="publish")
def pub(key: str) -> str:
    gates.enter(key)
    return key


def _rabbitmq_unreachable() -> str | None:
    try:
        with Connection(AMQP_URL, connect_timeout=3) as conn:  # type: ignore[no-untyped-call]  # kombu: unannotated
            conn.ensure_connection(max_retries=1, timeout=3)
    except Exception as exc:  # any failure to connect means: not reachable
        return f"{type(exc).__name__}: {exc}"
    return None


@pytest.fixture(scope="module")
def env() -> Iterator[CeleryEnv]:
    why = _rabbitmq_unreachable()
    if why is not None:
        pytest.skip(f"RabbitMQ not reachable on 127.0.0.1:5672: {why}")
    try:
        with celery_env(
            app,
            gates,
            concurrency=4,
            broker_url=AMQP_URL,
            task_default_queue=QUEUE,
            task_default_exchange=QUEUE,
            task_default_routing_key=QUEUE,
        ) as env:
            yield env
    finally:
        with Connection(AMQP_URL, connect_timeout=3) as conn:  # type: ignore[no-untyped-call]  # kombu: unannotated
            channel = conn.channel()
            try:
                channel.queue_delete(QUEUE)
                channel.exchange_delete(QUEUE)
            finally:
                channel.close()


def test_the_broker_is_rabbitmq_and_the_locks_are_in_redis(env: CeleryEnv) -> None:
    with env.app.connection_for_write() as conn:
        assert conn.transport.driver_type == "amqp"
    k = uuid.uuid4().hex
    r = pub.delay(k)
    gates.wait_started(k)
    assert env.locks.exists(pub.lock_key_for(k))
    gates.open(k)
    assert r.get(timeout=10) == k


def test_run_time_skip_with_rabbitmq(env: CeleryEnv) -> None:
    k = uuid.uuid4().hex
    first = run.delay(k)
    gates.wait_started(k)
    dup = run.delay(k)
    env.wait_state(dup.id, "SKIPPED")
    assert env.meta(dup.id)["holder"] == first.id
    gates.open(k)
    assert first.get(timeout=10) == k
    assert gates.runs[k] == 1
    wait_until(lambda: not run.is_locked(k), 3)


def test_publish_dedup_with_rabbitmq(env: CeleryEnv) -> None:
    k = uuid.uuid4().hex
    first = pub.delay(k)
    assert pub.delay(k).id == first.id  # queued (or already running)
    gates.wait_started(k)
    assert pub.delay(k).id == first.id  # running
    gates.open(k)
    assert first.get(timeout=10) == k
    assert gates.runs[k] == 1
    wait_until(lambda: not pub.is_locked(k), 3)
    second = pub.delay(k)  # free again: a new run
    assert second.id != first.id
    gates.open(k)
    assert second.get(timeout=10) == k
