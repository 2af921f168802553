"""Messages a worker drops unrun: their publish-time locks are freed at once.

A message whose task the worker does not know (``task_unknown``) or whose content type it does
not accept (``task_rejected``) is rejected without requeue; before, its publish lock kept the
job locked, and every later ``.delay()`` returned the dead task's id, for
``singleton_lock_queue_ttl`` (an hour).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery, signals
from celery_fixtures import CeleryEnv, Gates, app_task, configure, new_app
from celery_procs import close_app
from lock_helpers import wait_until

from celery_singleton_lock import LockedTask

#: the message headers that name a publish's lock and its prefix (docs/upgrading.md)
HEADER, PREFIX_HEADER = "singleton_lock", "singleton_lock_prefix"
gates = Gates()
#: the worker's app: it knows dropped.known (json only), not dropped.ghost
app = new_app("csl_dropped")


@app_task(app, base=LockedTask, shared=False, name="dropped.known", lock_at="publish")
def known(key: str) -> str:
    gates.enter(key)
    return key


#: the in-process worker and the settings of the conftest ``env`` fixture
CELERY_ENV = {"concurrency": 2, "accept_content": ["json"]}


@pytest.fixture
def publisher(env: CeleryEnv) -> Iterator[Celery]:
    """Another service's app on the same broker and locks: it knows a task the worker does
    not, and sends with pickle, which the worker does not accept."""
    pub = new_app("csl_dropped_pub")
    configure(pub, env.server, task_serializer="pickle")
    yield pub
    close_app(pub)


def _task(pub: Celery, name: str) -> Any:
    @app_task(pub, base=LockedTask, shared=False, name=name, lock_at="publish")
    def task(key: str) -> str:
        return key

    return task


def test_an_unknown_tasks_lock_is_freed_when_the_worker_drops_it(
    env: CeleryEnv, publisher: Celery
) -> None:
    ghost = _task(publisher, "dropped.ghost")
    first = ghost.delay("k1")
    assert ghost.is_locked("k1")
    wait_until(lambda: not ghost.is_locked("k1"), 10)
    assert env.wait_state(first.id, "FAILURE") == "FAILURE"  # NotRegistered, by Celery
    assert ghost.delay("k1").id != first.id  # not handed the dead task's id


def test_a_rejected_messages_lock_is_freed(env: CeleryEnv, publisher: Celery) -> None:
    pickled = _task(publisher, "dropped.known")
    first = pickled.delay("k2")
    wait_until(lambda: not pickled.is_locked("k2"), 10)
    second = known.delay("k2")  # json: accepted, and not a duplicate of the dropped one
    assert second.id != first.id
    gates.wait_started("k2")
    gates.open("k2")
    assert second.get(timeout=10) == "k2"


def test_a_dropped_duplicate_leaves_the_running_holders_lock(
    env: CeleryEnv, publisher: Celery
) -> None:
    holder = known.delay("k3")
    gates.wait_started("k3")
    # A message naming the same lock, sent by name with another task id (as a stand-in
    # publisher's would be): the worker rejects it (pickle), and must not free the lock that
    # the running task holds.
    name = known.locking.lock_name(known.name, ("k3",), {})
    dropped = publisher.send_task(
        "dropped.known", ("k3",), serializer="pickle", headers={"singleton_lock": name}
    )
    assert dropped.id != holder.id
    wait_until(lambda: env.broker.llen("celery") == 0, 10)
    assert known.lock_holder("k3") == holder.id
    gates.open("k3")
    assert holder.get(timeout=10) == "k3"


def test_a_dropped_compat_singleton_frees_its_lock_under_its_own_prefix(
    env: CeleryEnv, publisher: Celery
) -> None:
    """A drop-in ``Singleton`` task keeps its locks under celery-singleton's prefix
    (``SINGLETONLOCK_``), not the app's: the worker that drops its message, not knowing the
    task, frees the lock where its publisher took it."""
    from celery_singleton_lock.compat.singleton import Singleton

    @app_task(publisher, base=Singleton, shared=False, name="dropped.ghost_singleton")
    def ghost(key: str) -> str:
        return key

    first = ghost.delay("k4")
    key = ghost.lock_key_for("k4")
    assert key.startswith("SINGLETONLOCK_:{")  # its own prefix
    # The publish took it there (the worker may have dropped the message and freed the lock
    # already: the lock's meta hash, which outlives it, says it was taken).
    assert ghost.lock_space(publisher).client.exists(key + ":meta")
    wait_until(lambda: not ghost.is_locked("k4"), 10, "the dropped message's lock to go")
    assert ghost.delay("k4").id != first.id


def test_dropped_messages_free_every_slot_they_held(env: CeleryEnv, publisher: Celery) -> None:
    """With ``lock_limit=2`` each queued message holds one of the job's two slots: both are
    freed when the worker drops both messages, whichever slot each took."""

    @app_task(
        publisher, base=LockedTask, shared=False, name="dropped.ghost_limited", lock_at="publish",
        lock_limit=2,
    )  # fmt: skip
    def limited(key: str) -> str:
        return key

    first, second = limited.delay("k5"), limited.delay("k5")
    assert first.id != second.id and limited.is_locked("k5")
    wait_until(lambda: not limited.is_locked("k5"), 10, "both slots to be freed")
    assert limited.delay("k5").id not in {first.id, second.id}


def test_a_message_names_its_prefix_only_when_it_is_not_the_apps(
    env: CeleryEnv, publisher: Celery
) -> None:
    """The app's own prefix goes without saying (a worker reading none uses it, as the ghost's
    release above shows); a drop-in's own prefix is in the headers, for a worker that does not
    know the task."""
    from celery_singleton_lock.compat.singleton import Singleton

    sent: dict[str, dict[str, Any]] = {}

    def note(sender: Any = None, headers: Any = None, **_: Any) -> None:
        sent[headers["task"]] = dict(headers)

    @app_task(publisher, base=Singleton, shared=False, name="dropped.prefixed_singleton")
    def prefixed(key: str) -> str:
        return key

    ghost = _task(publisher, "dropped.plain_ghost")
    signals.before_task_publish.connect(note, weak=False)
    try:
        ghost.delay("k6")
        prefixed.delay("k6")
    finally:
        signals.before_task_publish.disconnect(note)
    assert sent["dropped.plain_ghost"][HEADER].startswith("dropped.plain_ghost:")
    assert PREFIX_HEADER not in sent["dropped.plain_ghost"]
    assert sent["dropped.prefixed_singleton"][PREFIX_HEADER] == "SINGLETONLOCK_"
    wait_until(lambda: not ghost.is_locked("k6"), 10, "the dropped message's lock to go")
    wait_until(lambda: not prefixed.is_locked("k6"), 10, "the drop-in's lock to go")
