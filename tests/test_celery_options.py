"""Every per-task lock option (``lock_*``), the task API (``self.lock``, ``lock_key_for``,
``is_locked``, ``lock_holder``, ``release_lock``) and the terminal paths that run in-process
(success, failure, ``Ignore``, ``Reject``), against a real worker and a real Redis."""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections import defaultdict
from datetime import datetime
from typing import Any

import pytest
from celery import signals
from celery.exceptions import Ignore, Reject
from celery_fixtures import CeleryEnv, Gates, app_task, new_app
from lock_helpers import wait_until, wake_subscribers

from celery_singleton_lock import AlreadyQueuedError, LockedTask, ReentrantLock, TaskLockedError

gates = Gates()
app = new_app("csl_opts")

#: task id -> monotonic times at which the worker started an attempt (task_prerun)
attempts: dict[str, list[float]] = defaultdict(list)
_attempts_lock = threading.Lock()


def _record_attempt(sender: Any = None, task_id: str | None = None, **kwargs: Any) -> None:
    if str(getattr(sender, "name", "")).startswith("opts.") and task_id:
        with _attempts_lock:
            attempts[task_id].append(time.monotonic())


signals.task_prerun.connect(_record_attempt, weak=False, dispatch_uid="csl-test-opts-prerun")

#: task id -> the countdown of each retry of it, as published: the retry message's ETA less the
#: time it is sent, a moment after the package chose the countdown. The delay chosen, read
#: from the message, whatever the worker's lateness in starting it on a busy machine.
countdowns: dict[str, list[float]] = defaultdict(list)


def _record_countdown(
    sender: Any = None, headers: dict[str, Any] | None = None, **kwargs: Any
) -> None:
    headers = headers or {}
    if str(sender).startswith("opts.") and headers.get("eta") and headers.get("retries"):
        countdown = datetime.fromisoformat(headers["eta"]).timestamp() - time.time()
        with _attempts_lock:
            countdowns[headers["id"]].append(countdown)


signals.before_task_publish.connect(
    _record_countdown, weak=False, dispatch_uid="csl-test-opts-publish"
)


def _key() -> str:
    return uuid.uuid4().hex


# -- tasks (one name each) ------------------------------------------------------------------


@app_task(app, base=LockedTask, name="opts.hold")
def hold(key: str) -> str:
    gates.enter(key)
    return key


@app_task(app, base=LockedTask, name="opts.short_ttl", lock_ttl=7)
def short_ttl(key: str) -> None:
    gates.enter(key)


@app_task(app, base=LockedTask, name="opts.pub", lock_at="publish")
def pub(key: str) -> str:
    gates.enter(key)
    return key


@app_task(app, base=LockedTask, name="opts.pub_qttl", lock_at="publish", lock_queue_ttl=120)
def pub_qttl(key: str) -> None:
    gates.enter(key)


@app_task(app, base=LockedTask, name="opts.pub_raise", lock_at="publish", lock_on_duplicate="raise")
def pub_raise(key: str) -> None:
    gates.enter(key)


@app_task(
    app,
    base=LockedTask,
    bind=True,
    name="opts.release_on_start",
    lock_at="publish",
    lock_release_on_start=True,
)
def release_on_start(self: Any, key: str) -> None:
    gates.data[key].append(self.lock)
    gates.enter(key)


@app_task(app, base=LockedTask, name="opts.unique", lock_unique_on=["account_id"])
def unique(account_id: str, full: bool = False) -> None:
    gates.enter(account_id)


@app_task(
    app,
    base=LockedTask,
    bind=True,
    name="opts.custom_key",
    lock_key=lambda job, note="": f"job-{job}",
)
def custom_key(self: Any, job: str, note: str = "") -> str:
    gates.enter(job)
    return str(self.lock.key)


@app_task(
    app,
    base=LockedTask,
    name="opts.retry",
    lock_on_locked="retry",
    lock_retry_countdown=0.3,
    max_retries=100,
)
def retry_task(key: str) -> str:
    gates.enter(key)
    return "ran"


@app_task(
    app,
    base=LockedTask,
    name="opts.pub_retry",
    lock_at="publish",
    lock_on_locked="retry",
    lock_retry_countdown=0.3,
    max_retries=100,
)
def pub_retry(key: str) -> str:
    gates.enter(key)
    return "ran"


@app_task(
    app,
    base=LockedTask,
    name="opts.retry_few",
    lock_on_locked="retry",
    lock_retry_countdown=0.2,
    max_retries=2,
)
def retry_few(key: str) -> None:
    gates.enter(key)


@app_task(
    app,
    base=LockedTask,
    name="opts.retry_slow",
    lock_on_locked="retry",
    lock_retry_countdown=1.5,
    max_retries=5,
)
def retry_slow(key: str) -> None:
    gates.enter(key)


@app_task(app, base=LockedTask, name="opts.retry_default", lock_on_locked="retry", max_retries=10)
def retry_default(key: str) -> None:
    gates.enter(key)


@app_task(app, base=LockedTask, name="opts.retry_backoff", lock_on_locked="retry", max_retries=None)
def retry_backoff(key: str) -> None:
    gates.enter(key)


@app_task(
    app,
    base=LockedTask,
    name="opts.retry_short_lease",
    lock_on_locked="retry",
    lock_ttl=2,
    max_retries=20,
)
def retry_short_lease(key: str) -> None:
    gates.enter(key)


@app_task(app, base=LockedTask, name="opts.raise", lock_on_locked="raise")
def raise_task(key: str) -> None:
    gates.enter(key)


@app_task(app, base=LockedTask, name="opts.wait", lock_on_locked="wait", lock_wait_timeout=8)
def wait_task(key: str) -> str:
    gates.enter(key)
    return "ran"


@app_task(
    app, base=LockedTask, name="opts.wait_short", lock_on_locked="wait", lock_wait_timeout=0.6
)
def wait_short(key: str) -> None:
    gates.enter(key)


@app_task(app, base=LockedTask, bind=True, name="opts.api")
def api(self: Any, key: str) -> dict[str, Any]:
    lock = self.lock
    assert isinstance(lock, ReentrantLock)
    lock.ensure_held()
    return {
        "key": lock.key,
        "owner": lock.owner,
        "id": self.request.id,
        "fence": lock.fence,
        "owned": lock.owned(),
        "hold_count": lock.hold_count,
        "lost": lock.lost.is_set(),
    }


def _terminal(self: Any, key: str, how: str) -> str:
    lock = self.lock
    gates.mark(key, bool(lock is not None and lock.owned()))
    if how == "fail":
        raise ValueError("boom")
    if how == "ignore":
        raise Ignore()
    if how == "reject":
        raise Reject("rejected", requeue=False)
    return "ok"


@app_task(app, base=LockedTask, bind=True, name="opts.term_run", lock_ttl=30)
def term_run(self: Any, key: str, how: str) -> str:
    return _terminal(self, key, how)


@app_task(app, base=LockedTask, bind=True, name="opts.term_pub", lock_at="publish", lock_ttl=30)
def term_pub(self: Any, key: str, how: str) -> str:
    return _terminal(self, key, how)


#: the in-process worker and the settings of the conftest ``env`` fixture
CELERY_ENV = {"concurrency": 12, "singleton_lock_ttl": 20, "singleton_lock_queue_ttl": 600}


def _pttl(env: CeleryEnv, key: str) -> int:
    return int(env.locks.pttl(key))


# -- lock_at ---------------------------------------------------------------------------------


def test_lock_at_run_publishes_every_copy_and_skips_the_duplicate_run(env: CeleryEnv) -> None:
    k = _key()
    first = hold.delay(k)
    gates.wait_started(k)
    dup = hold.delay(k)
    assert dup.id != first.id  # run mode: no dedup at publish
    env.wait_state(dup.id, "SKIPPED")
    gates.open(k)
    assert first.get(timeout=10) == k
    assert gates.runs[k] == 1
    assert not hold.is_locked(k)


def test_lock_at_publish_returns_the_holders_result_while_queued_and_running(
    env: CeleryEnv,
) -> None:
    k = _key()
    # queued: a queue no worker consumes
    queued = pub.apply_async((k,), queue="csl-nowhere")
    assert pub.delay(k).id == queued.id
    assert pub.lock_holder(k) == queued.id
    assert pub.release_lock(k)
    # running
    k = _key()
    first = pub.delay(k)
    gates.wait_started(k)
    again = pub.delay(k)
    assert again.id == first.id
    gates.open(k)
    assert again.get(timeout=10) == k
    assert gates.runs[k] == 1
    wait_until(lambda: not pub.is_locked(k), 3)


def test_lock_release_on_start_dedups_the_queue_only(env: CeleryEnv) -> None:
    k = _key()
    first = release_on_start.apply_async((k,), countdown=1.0)
    # while it waits in the queue, a duplicate publish is deduplicated
    assert release_on_start.delay(k).id == first.id
    assert release_on_start.lock_holder(k) == first.id
    gates.wait_started(k)
    # once the run started, the lock is gone and a duplicate publish is accepted and runs
    assert not release_on_start.is_locked(k)
    second = release_on_start.delay(k)
    assert second.id != first.id
    wait_until(lambda: gates.runs[k] == 2, 10)
    gates.open(k)
    first.get(timeout=10)
    second.get(timeout=10)
    assert gates.data[k] == [None, None]  # self.lock is None: the run holds no lock


# -- lock_unique_on / lock_key ---------------------------------------------------------------


def test_lock_unique_on_ignores_the_other_arguments(env: CeleryEnv) -> None:
    acc = _key()
    assert unique.lock_key_for(acc, full=True) == unique.lock_key_for(acc)
    assert unique.lock_key_for(acc) != unique.lock_key_for(_key())
    first = unique.delay(acc, full=False)
    gates.wait_started(acc)
    dup = unique.delay(acc, full=True)
    env.wait_state(dup.id, "SKIPPED")
    assert env.meta(dup.id)["holder"] == first.id
    gates.open(acc)
    first.get(timeout=10)
    assert gates.runs[acc] == 1


def test_lock_key_callable_replaces_the_argument_part(env: CeleryEnv) -> None:
    job = _key()
    key = custom_key.lock_key_for(job, note="a")
    assert key == f"lock:{{opts.custom_key:job-{job}}}"
    assert custom_key.lock_key_for(job, "b") == key
    first = custom_key.delay(job, note="a")
    gates.wait_started(job)
    # called with the task's arguments, not self: the worker computes the same key
    assert custom_key.lock_holder(job) == first.id
    dup = custom_key.delay(job, note="other")
    env.wait_state(dup.id, "SKIPPED")
    gates.open(job)
    assert first.get(timeout=10) == key
    assert gates.runs[job] == 1


# -- leases ----------------------------------------------------------------------------------


def test_lock_ttl_and_the_singleton_lock_ttl_setting_lease_a_running_lock(env: CeleryEnv) -> None:
    k1, k2 = _key(), _key()
    r1 = short_ttl.delay(k1)  # lock_ttl=7
    r2 = hold.delay(k2)  # the app's singleton_lock_ttl=20
    gates.wait_started(k1)
    gates.wait_started(k2)
    p1 = _pttl(env, short_ttl.lock_key_for(k1))
    p2 = _pttl(env, hold.lock_key_for(k2))
    gates.open(k1)
    gates.open(k2)
    r1.get(timeout=10)
    r2.get(timeout=10)
    assert 4_000 < p1 <= 7_000
    assert 13_000 < p2 <= 20_000


def test_lock_queue_ttl_the_setting_and_expires_lease_a_queued_lock(env: CeleryEnv) -> None:
    k = _key()
    pub_qttl.apply_async((k,), queue="csl-nowhere")
    assert 115_000 < _pttl(env, pub_qttl.lock_key_for(k)) <= 120_000
    assert pub_qttl.release_lock(k)
    pub.apply_async((k,), queue="csl-nowhere")  # singleton_lock_queue_ttl=600
    assert 595_000 < _pttl(env, pub.lock_key_for(k)) <= 600_000
    assert pub.release_lock(k)
    pub.apply_async((k,), queue="csl-nowhere", expires=42)  # the message's expires wins
    assert 40_000 < _pttl(env, pub.lock_key_for(k)) <= 42_000
    assert pub.release_lock(k)
    pub.apply_async((k,), queue="csl-nowhere", countdown=100)  # covers the countdown too
    assert 695_000 < _pttl(env, pub.lock_key_for(k)) <= 700_000
    assert pub.release_lock(k)


# -- lock_on_duplicate -----------------------------------------------------------------------


def test_lock_on_duplicate_return_gives_the_holders_async_result(env: CeleryEnv) -> None:
    k = _key()
    first = pub.apply_async((k,), queue="csl-nowhere")
    before = env.broker.llen("csl-nowhere")
    dup = pub.delay(k)
    assert type(dup) is type(first) and dup.id == first.id
    assert env.broker.llen("csl-nowhere") == before  # nothing sent
    assert env.broker.llen("celery") == 0
    assert pub.release_lock(k)


def test_lock_on_duplicate_raise(env: CeleryEnv) -> None:
    k = _key()
    first = pub_raise.apply_async((k,), queue="csl-nowhere")
    before = env.broker.llen("csl-nowhere")
    with pytest.raises(AlreadyQueuedError) as info:
        pub_raise.delay(k)
    assert info.value.task_id == first.id
    assert isinstance(info.value.ttl, float)
    assert 590 < info.value.ttl <= 600  # the queue lease (singleton_lock_queue_ttl)
    assert first.id in str(info.value)
    assert env.broker.llen("csl-nowhere") == before
    assert pub_raise.release_lock(k)


# -- lock_on_locked --------------------------------------------------------------------------


def test_lock_on_locked_skip(env: CeleryEnv, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="celery_singleton_lock")
    k = _key()
    first = hold.delay(k)
    gates.wait_started(k)
    dup = hold.delay(k)
    assert env.wait_state(dup.id, "SKIPPED") == "SKIPPED"
    # it says why: the log names the skipped run and the holder
    assert any(
        dup.id in rec.getMessage() and first.id in rec.getMessage() for rec in caplog.records
    ), [rec.getMessage() for rec in caplog.records]
    meta = env.meta(dup.id)
    assert meta["holder"] == first.id
    assert meta["lock"] == hold.lock_key_for(k)
    assert not env.app.AsyncResult(dup.id).ready()  # SKIPPED is not a ready state
    # the holder's lock is untouched
    assert hold.lock_holder(k) == first.id
    gates.open(k)
    first.get(timeout=10)
    assert gates.runs[k] == 1  # the duplicate's body never ran
    wait_until(lambda: not hold.is_locked(k), 3)


def test_lock_on_locked_retry_runs_after_the_holder_finishes(env: CeleryEnv) -> None:
    k = _key()
    first = retry_task.delay(k)
    gates.wait_started(k)
    dup = retry_task.delay(k)
    wait_until(lambda: len(attempts[dup.id]) >= 3, 10)  # retrying while the holder runs
    assert gates.runs[k] == 1
    gates.open(k)
    assert first.get(timeout=10) == "ran"
    assert dup.get(timeout=10) == "ran"
    assert gates.runs[k] == 2


def test_lock_on_locked_retry_of_a_publish_mode_duplicate_sent_by_name(env: CeleryEnv) -> None:
    # send_task bypasses the publish-time check; the run-time check retries the duplicate,
    # whose retries must be sent although the job's lock is held by another task
    k = _key()
    first = pub_retry.delay(k)
    gates.wait_started(k)
    dup = env.app.send_task(pub_retry.name, args=[k])
    wait_until(lambda: len(attempts[dup.id]) >= 3, 10)
    assert gates.runs[k] == 1
    assert pub_retry.lock_holder(k) == first.id
    gates.open(k)
    assert first.get(timeout=10) == "ran"
    assert dup.get(timeout=10) == "ran"
    assert gates.runs[k] == 2
    wait_until(lambda: not pub_retry.is_locked(k), 3)


def test_lock_on_locked_retry_ends_skipped_when_retries_run_out(env: CeleryEnv) -> None:
    k = _key()
    first = retry_few.delay(k)
    gates.wait_started(k)
    dup = retry_few.delay(k)
    env.wait_state(dup.id, "SKIPPED", timeout=10)
    assert len(attempts[dup.id]) == 3  # the first try and max_retries=2 retries
    assert env.meta(dup.id)["holder"] == first.id
    assert retry_few.lock_holder(k) == first.id
    gates.open(k)
    first.get(timeout=10)
    assert gates.runs[k] == 1


def test_lock_retry_countdown_spaces_the_retries(env: CeleryEnv) -> None:
    k = _key()
    first = retry_slow.delay(k)
    gates.wait_started(k)
    dup = retry_slow.delay(k)
    wait_until(lambda: len(attempts[dup.id]) >= 1, 5)
    gates.open(k)
    first.get(timeout=10)
    dup.get(timeout=10)
    times = attempts[dup.id]
    assert len(times) == 2
    assert times[1] - times[0] >= 1.4  # (a busy machine only starts it later)
    (countdown,) = countdowns[dup.id]
    assert 1.4 <= countdown <= 1.5  # lock_retry_countdown=1.5, less the moment to publish


def test_default_retry_comes_back_soon_after_a_short_holder(env: CeleryEnv) -> None:
    """The holder's lease is renewed (always 20-30 s left), but it ends after ~2 s: the
    duplicate's growing backoff (1, 2, 4 s with jitter) brings it back within a few seconds,
    not a whole lease later."""
    k = _key()
    first = retry_default.delay(k)
    gates.wait_started(k)
    dup = retry_default.delay(k)
    # the holder runs on until the duplicate was refused three times (its first two retries:
    # 1.5 to 3 s)
    wait_until(lambda: len(attempts[dup.id]) >= 3, 10, "the duplicate's second retry")
    gates.open(k)
    first.get(timeout=10)
    dup.get(timeout=15)
    assert gates.runs[k] == 2  # the holder, then the duplicate: never both at once
    assert len(attempts[dup.id]) >= 3
    delays = countdowns[dup.id]
    assert 0.5 <= delays[0] <= 1.0  # the first retry: 0.5-1 s
    assert max(delays) <= 4.0  # 1, 2, 4 s with jitter: the old default waited out the ~30 s lease


def test_default_retry_never_waits_longer_than_the_holders_lease(env: CeleryEnv) -> None:
    k = _key()
    first = retry_short_lease.delay(k)  # lock_ttl=2: the holder's lease is at most 2 s
    gates.wait_started(k)
    dup = retry_short_lease.delay(k)
    # uncapped, the backoff of the fourth retry would be 4-8 s
    wait_until(lambda: len(countdowns[dup.id]) >= 4, 15, "the duplicate's fourth retry")
    gates.open(k)
    first.get(timeout=10)
    dup.get(timeout=10)
    assert max(countdowns[dup.id]) <= 2.0, countdowns[dup.id]


@pytest.mark.parametrize(
    ("retries", "lease", "low", "high"),
    [
        (0, 600, 0.5, 1.0),  # 1 s, with jitter (half of it to all of it)
        (2, 600, 2.0, 4.0),  # doubled with each retry
        (60, 2, 1.0, 2.0),  # capped by the holder's remaining lease (the doubling, by 2**30)
    ],
)
def test_the_default_retry_countdown_grows_with_jitter_and_is_capped(
    env: CeleryEnv, retries: int, lease: float, low: float, high: float
) -> None:
    """Two duplicates whose messages say they were retried ``retries`` times already, refused
    by a holder with ``lease`` seconds left: each comes back after the default countdown, and
    the two not at once."""
    k = _key()
    space = retry_backoff.lock_space(env.app)
    key = retry_backoff.lock_key_for(k)
    assert space.named(space.keys_of(key).name).take("holder", lease).acquired
    dups = [retry_backoff.apply_async((k,), retries=retries) for _ in range(2)]
    wait_until(lambda: all(countdowns[d.id] for d in dups), 10, "the duplicates' retries")
    chosen = [countdowns[d.id][0] for d in dups]
    # (less the moment to publish: the countdown is read from the message's ETA)
    assert all(low - 0.1 <= c <= high for c in chosen), chosen
    assert chosen[0] != chosen[1]  # jittered
    assert space.force_release(key)
    gates.open(k)
    # They come back and run; one that meets the other's run waits out its backoff again
    # (at most that run's 30 s lease).
    for dup in dups:
        dup.get(timeout=high + 35)


def test_lock_on_locked_raise_survives_the_result_backend(env: CeleryEnv) -> None:
    k = _key()
    first = raise_task.delay(k)
    gates.wait_started(k)
    dup = raise_task.delay(k)
    env.wait_state(dup.id, "FAILURE")
    exc = dup.get(timeout=10, propagate=False)
    assert isinstance(exc, TaskLockedError)
    assert exc.task_id == first.id
    assert dup.result.task_id == first.id
    with pytest.raises(TaskLockedError):
        dup.get(timeout=10)
    assert raise_task.lock_holder(k) == first.id
    gates.open(k)
    first.get(timeout=10)
    assert gates.runs[k] == 1


def test_lock_on_locked_wait_gets_the_lock_when_the_holder_finishes(env: CeleryEnv) -> None:
    k = _key()
    first = wait_task.delay(k)
    gates.wait_started(k)
    dup = wait_task.delay(k)
    wait_until(lambda: len(attempts[dup.id]) >= 1, 5)
    key = wait_task.lock_key_for(k)
    wait_until(lambda: wake_subscribers(env.locks, key) >= 1, 5, "the duplicate to wait")
    assert gates.runs[k] == 1  # still waiting
    opened = time.monotonic()
    gates.open(k)
    assert dup.get(timeout=10) == "ran"
    assert time.monotonic() - opened < 3  # woken by the release, not at the lease's end
    assert first.get(timeout=10) == "ran"
    assert gates.runs[k] == 2


def test_lock_on_locked_wait_skips_after_lock_wait_timeout(env: CeleryEnv) -> None:
    k = _key()
    first = wait_short.delay(k)
    gates.wait_started(k)
    dup = wait_short.delay(k)
    env.wait_state(dup.id, "SKIPPED", timeout=10)
    skipped_at = time.monotonic()
    waited = skipped_at - attempts[dup.id][0]
    assert 0.55 <= waited < 3.0
    assert env.meta(dup.id)["holder"] == first.id
    gates.open(k)
    first.get(timeout=10)
    assert gates.runs[k] == 1


# -- the task API ----------------------------------------------------------------------------


def test_self_lock_inside_a_run_and_none_outside(env: CeleryEnv) -> None:
    assert api.lock is None
    k = _key()
    one = api.delay(k).get(timeout=10)
    assert one["key"] == api.lock_key_for(k)
    assert one["owner"] == one["id"]
    assert one["owned"] is True and one["hold_count"] >= 1 and one["lost"] is False
    assert isinstance(one["fence"], int)
    two = api.delay(k).get(timeout=10)
    assert two["fence"] > one["fence"]  # a new holder, a larger fencing token
    assert api.lock is None
    assert not api.is_locked(k)


def test_is_locked_lock_holder_and_release_lock(
    env: CeleryEnv, caplog: pytest.LogCaptureFixture
) -> None:
    k = _key()
    assert not hold.is_locked(k)
    assert hold.lock_holder(k) is None
    first = hold.delay(k)
    gates.wait_started(k)
    assert hold.is_locked(k)
    assert hold.lock_holder(k) == first.id
    with caplog.at_level(logging.WARNING, logger="celery_singleton_lock.release"):
        assert hold.release_lock(k) is True  # operator's force release, while the run goes on
    said = [r.getMessage() for r in caplog.records if r.name == "celery_singleton_lock.release"]
    assert len(said) == 1, said  # says what it did: a force release, the holder, the run's fate
    assert said[0].startswith("release_lock: force-released 1 lock(s) of opts.hold"), said
    assert f"held by {first.id} (a run still inside goes on unlocked)" in said[0], said
    assert not hold.is_locked(k)
    assert hold.lock_holder(k) is None
    assert hold.release_lock(k) is False
    # with the lock gone, another run of the job is no longer a duplicate
    second = hold.delay(k)
    wait_until(lambda: gates.runs[k] == 2, 10)
    gates.open(k)
    first.get(timeout=10)
    second.get(timeout=10)


# -- terminal paths --------------------------------------------------------------------------


@pytest.mark.parametrize("task", [term_run, term_pub], ids=["run", "publish"])
@pytest.mark.parametrize("how", ["success", "fail", "ignore", "reject"])
def test_every_in_process_terminal_path_frees_the_lock(env: CeleryEnv, task: Any, how: str) -> None:
    k = _key()
    r = task.delay(k, how)
    wait_until(lambda: gates.runs[k] == 1, 10)
    assert gates.data[k] == [True]  # the body ran holding the lock
    if how == "success":
        assert r.get(timeout=10) == "ok"
    elif how == "fail":
        env.wait_state(r.id, "FAILURE")
    # lock_ttl=30: only a release (not the lease) frees it this fast
    wait_until(lambda: not env.locks.exists(task.lock_key_for(k, how)), 3)
    assert task.lock_holder(k, how) is None
