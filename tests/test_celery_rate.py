"""``lock_rate`` on real workers: at most N starts per period per key, across every worker.

The rules, as these tests check them (start times are the limiter's, on Redis's clock, which a
body reads as ``self.rate_turn.at``; each body also reads Redis's clock itself):

* 30 calls of one key at once with ``lock_rate="5/s"``, on two prefork workers of four
  processes each, ``max_retries=0``: all 30 run, never more than 5 start in any 1 s window,
  in about 6 s, and none of them used a retry; how often each of the 25 that waited came back
  is printed (about once each on a quiet machine; a loaded one brings some back twice).
* Two tasks sharing a named limiter are limited together; two customers' keys are not.
* ``RateLimited(retry_after=2)`` raised by one body holds back every call of that limiter for
  2 s; the call itself comes back after the pause, not counted as a retry.
* ``lock_limit=2`` with ``lock_rate="4/s"``: two at once, four starts a second.
* ``lock_at="publish"`` with ``lock_rate``: a job waiting for its turn is still deduplicated.
* ``lock_rate_max_delay=0``: ``lock_on_locked`` at once (``SKIPPED`` with reason ``rate``, or
  ``RateLimitExceededError``).
* A worker SIGKILLed mid-window leaves nothing stuck: the limiter's keys end by time alone.
"""

from __future__ import annotations

import io
import json
from contextlib import redirect_stdout
from pathlib import Path
from typing import Any

import pytest
from celery import Celery
from celery_fixtures import cli_main
from celery_procs import WorkerProcess, new_job, redis_base
from faultapp import DATA_DB, LOCK_DB
from lock_helpers import START_TIMEOUT, wait_until

from celery_singleton_lock import RateLimitExceededError
from celery_singleton_lock.testing import RedisServer

pytestmark = [pytest.mark.timeout(START_TIMEOUT + 120)]


def rate_log(prefix: str, name: str) -> str:
    """The limiter's sorted set of starts and turns: ``<prefix>:rate:{name}`` (docs/limits.md;
    the names here have no ``}`` or ``%``, which its braces would escape)."""
    return f"{prefix}:rate:{{{name}}}"


#: the threads of the module's in-process worker (the conftest's ``fault_worker``)
WORKER_CONCURRENCY = 8


def _starts(server: RedisServer, job: str) -> list[dict[str, Any]]:
    items = server.client(db=DATA_DB).lrange(f"rate:{job}", 0, -1)
    return sorted((json.loads(i) for i in items), key=lambda r: r["at"])


def _most_in_any_window(times: list[float], period: float) -> int:
    """The most of ``times`` in any half-open window of ``period`` seconds."""
    times = sorted(times)
    most, first = 0, 0
    for last, t in enumerate(times):
        while t - times[first] >= period:
            first += 1
        most = max(most, last - first + 1)
    return most


def _done(calls: list[Any], timeout: float) -> None:
    wait_until(
        lambda: all(c.state in ("SUCCESS", "SKIPPED", "FAILURE") for c in calls),
        timeout,
        "every call to end",
        0.05,
    )


@pytest.mark.slow
def test_thirty_calls_of_one_key_start_at_most_five_a_second_and_all_run(
    fault_server: RedisServer, fault_app: Celery, tmp_path: Path
) -> None:
    rated = fault_app.tasks["fault.rated"]
    job = new_job("rate-30")
    queue = ("-Q", "rate-30")
    base = redis_base(fault_server.port)
    with (
        WorkerProcess(base, tmp_path, concurrency=4, args=queue) as one,
        WorkerProcess(base, tmp_path, concurrency=4, args=queue) as two,
    ):
        seconds, micros = fault_server.client().time()
        sent = seconds + micros / 1e6
        calls = [rated.apply_async((job, n), queue=queue[1]) for n in range(30)]
        _done(calls, 40)
        logs = one.log() + two.log()
    assert [c.state for c in calls] == ["SUCCESS"] * 30, logs[-3000:]
    starts = _starts(fault_server, job)
    assert len(starts) == 30
    assert sorted(s["id"] for s in starts) == sorted(c.id for c in calls)  # each ran once
    at = [s["at"] for s in starts]
    assert _most_in_any_window(at, 1.0) == 5
    assert all(at[i + 5] - at[i] >= 1.0 for i in range(len(at) - 5))
    assert all(s["retries"] == 0 for s in starts)  # max_retries=0 never came into it
    span = at[-1] - at[0]
    by_body = _most_in_any_window([s["t"] for s in starts], 1.0)
    lag = [s["t"] - s["at"] for s in starts]
    print(f"\n30 calls, lock_rate='5/s': first publish to last start {at[-1] - sent:.2f} s, "
          f"first to last start {span:.2f} s; most starts in any "
          f"1 s window: {_most_in_any_window(at, 1.0)} (limiter), {by_body} (bodies' own clock "
          f"reading); pids {len({s['pid'] for s in starts})}; comebacks per call "
          f"{sorted(s['comebacks'] for s in starts)}; admission to body "
          f"{min(lag):.3f} to {max(lag):.3f} s")  # fmt: skip
    assert 5.0 <= span < 9.0
    # How often a waiting call comes back is printed above, not asserted: it depends on how
    # soon a busy pool process reaches the call (0 of 25 came back twice on a quiet machine, 3
    # to 11 on a loaded one, where the pool process reaches a call after its near turn's margin).
    assert len({s["pid"] for s in starts}) > 1  # both workers' processes took turns


def test_a_named_limiter_limits_two_tasks_together(
    fault_server: RedisServer, fault_app: Celery, fault_worker: Any
) -> None:
    job = new_job("rate-shared")
    a, b = fault_app.tasks["fault.rated_shared_a"], fault_app.tasks["fault.rated_shared_b"]
    calls = [t.delay(job, n) for n in range(3) for t in (a, b)]
    _done(calls, 30)
    assert [c.state for c in calls] == ["SUCCESS"] * 6
    at = [s["at"] for s in _starts(fault_server, job)]
    assert _most_in_any_window(at, 1.0) == 2
    assert at[-1] - at[0] >= 2.0  # six starts at two a second, whichever task


def test_two_customers_keys_are_limited_apart(
    fault_server: RedisServer, fault_app: Celery, fault_worker: Any
) -> None:
    job = new_job("rate-customers")
    task = fault_app.tasks["fault.rated_customer"]
    calls = [task.delay(job, customer, n) for n in range(4) for customer in ("x", "y")]
    _done(calls, 30)
    assert [c.state for c in calls] == ["SUCCESS"] * 8
    starts = _starts(fault_server, job)
    for customer in ("x", "y"):
        at = [s["at"] for s in starts if s["customer"] == customer]
        assert len(at) == 4 and _most_in_any_window(at, 1.0) == 2
    # apart: the first second holds two starts of each customer
    first = starts[0]["at"]
    assert sum(1 for s in starts if s["at"] - first < 1.0) == 4


def test_a_rate_limited_body_pauses_every_call_of_its_limiter(
    fault_server: RedisServer, fault_app: Celery, fault_worker: Any
) -> None:
    job = new_job("rate-429")
    task = fault_app.tasks["fault.rated_429"]
    told = task.delay(job, 0)
    data = fault_server.client(db=DATA_DB)
    wait_until(lambda: data.exists(f"told:{job}"), 10, "the partner to say slow down")
    others = [task.delay(job, n) for n in range(1, 4)]
    _done([told, *others], 20)
    assert [c.state for c in (told, *others)] == ["SUCCESS"] * 4
    starts = _starts(fault_server, job)
    first = [s for s in starts if s["id"] == told.id]
    assert len(first) == 2  # its first start raised, and it came back
    paused_at = first[0]["at"]
    later = [s["at"] for s in starts if s["at"] > paused_at]
    assert len(later) == 4 and min(later) >= paused_at + 2.0
    assert all(s["retries"] == 0 for s in starts)  # the comeback is not a retry


def test_a_limit_of_two_at_once_and_four_a_second_compose(
    fault_server: RedisServer, fault_app: Celery, fault_worker: Any
) -> None:
    job = new_job("rate-limit")
    task = fault_app.tasks["fault.rated_limited"]
    calls = [task.delay(job, n, 0.3) for n in range(8)]
    _done(calls, 30)
    assert [c.state for c in calls] == ["SUCCESS"] * 8
    assert int(fault_server.client(db=DATA_DB).get(f"max:{job}")) == 2
    at = [s["at"] for s in _starts(fault_server, job)]
    assert _most_in_any_window(at, 1.0) == 4


def test_a_publish_time_job_waiting_for_its_turn_is_still_deduplicated(
    fault_server: RedisServer, fault_app: Celery, fault_worker: Any
) -> None:
    job = new_job("rate-publish")
    task = fault_app.tasks["fault.rated_publish"]
    first, second = task.delay(job, 0), task.delay(job, 1)  # two jobs, one turn a second
    data = fault_server.client(db=DATA_DB)
    wait_until(lambda: data.llen(f"rate:{job}") == 1, 10, "one of them to start")
    waiting = second if _starts(fault_server, job)[0]["id"] == first.id else first
    # the other waits for its turn (a comeback): the same call again gets that job back
    again = task.delay(job, 1 if waiting is second else 0)
    assert again.id == waiting.id
    _done([first, second], 20)
    at = [s["at"] for s in _starts(fault_server, job)]
    assert len(at) == 2 and at[1] - at[0] >= 1.0


def test_no_delay_allowed_hands_the_call_to_lock_on_locked_at_once(
    fault_server: RedisServer, fault_app: Celery, fault_worker: Any
) -> None:
    job = new_job("rate-impatient")
    skip = fault_app.tasks["fault.rated_impatient"]
    first = skip.delay(job, 0)
    _done([first], 10)
    second = skip.delay(job, 1)
    _done([second], 10)
    assert (first.state, second.state) == ("SUCCESS", "SKIPPED")
    assert second.info["reason"] == "rate"
    third = fault_app.tasks["fault.rated_impatient_raise"].delay(job, 2)
    _done([third], 10)
    assert third.state == "FAILURE"
    assert isinstance(third.result, RateLimitExceededError)
    # the skipped and failed calls reserved no turn behind them
    log = rate_log("lock", f"fault-impatient:{job}")
    entries = fault_server.client(db=LOCK_DB).zrange(log, 0, -1)
    assert [e for e in entries if e.startswith(b"r:")] == []
    # a turn a few ms away is not waited for either: no delay allowed is none at all
    soon = fault_app.tasks["fault.rated_impatient_soon"]
    near = [soon.delay(job, n) for n in range(2)]
    _done(near, 10)
    assert sorted(c.state for c in near) == ["SKIPPED", "SUCCESS"]


@pytest.mark.slow
def test_a_worker_killed_mid_window_leaves_nothing_stuck(
    fault_server: RedisServer, fault_app: Celery, tmp_path: Path
) -> None:
    rated = fault_app.tasks["fault.rated"]
    job = new_job("rate-kill")
    queue = ("-Q", "rate-kill")
    base = redis_base(fault_server.port)
    locks = fault_server.client(db=LOCK_DB)
    name = rated.locking.lock_name(rated.name, [job], {})
    log = rate_log(rated.locking.space(fault_app).prefix, name)
    with WorkerProcess(base, tmp_path, concurrency=2, args=queue) as doomed:
        for n in range(10):
            rated.apply_async((job, n), queue=queue[1])
        wait_until(lambda: locks.zcard(log) == 10, 20, "five starts and five turns")
        doomed.kill_group()
        doomed.wait(10)
    # Nobody comes back for the reserved turns: the keys end by time alone, within a window
    # after the last turn (and half a window more: the limiter lengthens its keys' lives only
    # when they run short, not on every call).
    last_turn = float(locks.zrange(log, -1, -1, withscores=True)[0][1]) / 1000
    seconds, micros = locks.time()
    assert 0 < locks.pttl(log) / 1000 <= last_turn - (seconds + micros / 1e6) + 1.5 + 0.1
    wait_until(lambda: not locks.exists(log, f"{log}:state"), 5, "the limiter's keys to end")
    # and a new worker's calls start at once, five of them
    again = new_job("rate-kill-again")
    with WorkerProcess(base, tmp_path, concurrency=2, args=queue):
        calls = [rated.apply_async((again, n), queue=queue[1]) for n in range(5)]
        _done(calls, 20)
    at = [s["at"] for s in _starts(fault_server, again)]
    assert len(at) == 5 and at[-1] - at[0] < 1.0


def test_locks_list_shows_the_limiters_in_use(
    fault_server: RedisServer, fault_app: Celery, fault_worker: Any
) -> None:
    job = new_job("rate-list")
    task = fault_app.tasks["fault.rated_impatient"]
    space = task.locking.space(fault_app)
    name = f"fault-impatient:{job}"
    limiter = space.rate_limiter(name, "1/m")
    call = task.delay(job, 0)
    _done([call], 10)
    assert limiter.try_acquire("waiting-call").wait > 50  # a turn about a minute away
    limiter.pause(30)
    url = f"{redis_base(fault_server.port)}/{LOCK_DB}"
    out = io.StringIO()
    with redirect_stdout(out), pytest.raises(SystemExit):
        cli_main(["list", "--url", url, "--match", name])
    lines = out.getvalue().splitlines()
    header, row = lines[-2].split(), lines[-1].split()
    assert header[:2] == ["LIMITER", "USED"]
    key = rate_log(space.prefix, name)
    assert row[:4] == [key, "1/1", "1/m", "1"]  # one start of one, one turn handed out
    # a new call would come after the one waiting: a minute after its turn
    assert 110 < float(row[4]) <= 120 and 29 < float(row[5]) <= 30
    out = io.StringIO()
    with redirect_stdout(out), pytest.raises(SystemExit):
        cli_main(["list", "--url", url, "--match", name, "--json"])
    (item,) = [i for i in json.loads(out.getvalue()) if i["kind"] == "limiter"]
    assert (item["name"], item["limit"], item["period_s"], item["waiting"]) == (name, 1, 60.0, 1)
    # an operator's release of the limiter's key resets it: the next call starts at once
    out = io.StringIO()
    with redirect_stdout(out), pytest.raises(SystemExit):
        cli_main(["release", "--url", url, key])
    assert out.getvalue().strip() == f"{key}: reset"
    again = task.delay(job, 1)
    _done([again], 10)
    assert again.state == "SUCCESS"


def test_a_queued_copy_waiting_for_its_turn_stays_the_queued_copy(
    fault_server: RedisServer, fault_app: Celery, fault_worker: Any
) -> None:
    job = new_job("rate-queue")
    task = fault_app.tasks["fault.rated_queue"]
    data = fault_server.client(db=DATA_DB)
    first = task.delay(job, 0)
    wait_until(lambda: data.llen(f"rate:{job}") == 1, 10, "the first call to start")
    second = task.delay(job, 1)  # the queued copy: its turn is 2 s after the first start
    assert second.id != first.id
    wait_until(lambda: second.state == "RETRY", 10, "the copy to wait for its turn")
    third = task.delay(job, 2)
    assert third.id == second.id  # one copy queued: the one waiting for its turn
    _done([first, second], 20)
    assert (first.state, second.state) == ("SUCCESS", "SUCCESS")
    at = [s["at"] for s in _starts(fault_server, job)]
    assert len(at) == 2 and at[1] - at[0] >= 2.0
    assert not task.is_locked(job)  # and nothing is left held


def test_a_limit_can_depend_on_the_arguments(
    fault_server: RedisServer, fault_app: Celery, fault_worker: Any
) -> None:
    job = new_job("rate-plan")
    task = fault_app.tasks["fault.rated_plan"]
    calls = [task.delay(job, plan, n) for n in range(3) for plan in ("pro", "free")]
    _done(calls, 20)
    assert [c.state for c in calls] == ["SUCCESS"] * 6
    starts = _starts(fault_server, job)
    pro = [s["at"] for s in starts if s["plan"] == "pro"]
    free = [s["at"] for s in starts if s["plan"] == "free"]
    assert pro[-1] - pro[0] < 1.0  # three a second: all three at once
    assert free[1] - free[0] >= 1.0 and free[2] - free[1] >= 1.0


def test_a_task_class_maps_a_partners_error_to_a_pause(
    fault_server: RedisServer, fault_app: Celery, fault_worker: Any
) -> None:
    job = new_job("rate-mapped")
    task = fault_app.tasks["fault.rated_mapped"]
    told = task.delay(job, 0)
    data = fault_server.client(db=DATA_DB)
    wait_until(lambda: data.exists(f"told:{job}"), 10, "the partner to be busy")
    other = task.delay(job, 1)
    _done([told, other], 20)
    assert (told.state, other.state) == ("SUCCESS", "SUCCESS")
    starts = _starts(fault_server, job)
    busy_at = starts[0]["at"]
    assert [s["id"] for s in starts].count(told.id) == 2
    assert all(s["at"] >= busy_at + 1.0 for s in starts[1:])


def test_a_limiter_that_fails_lets_the_run_s_lock_go(
    fault_server: RedisServer, fault_app: Celery, fault_worker: Any
) -> None:
    job = new_job("rate-fails")
    task = fault_app.tasks["fault.rated_limited"]
    space = task.locking.space(fault_app)
    name = task.locking.lock_name(task.name, [job], {})
    # Redis refuses the limiter's script (its key holds a string: WRONGTYPE), after the run
    # took one of its job's two slots
    locks = fault_server.client(db=LOCK_DB)
    locks.set(rate_log(space.prefix, name), "not a sorted set", ex=60)
    call = task.delay(job, 0, 0.0)
    _done([call], 10)
    assert call.state == "FAILURE" and "LockBackendError" in repr(call.result)
    assert not task.is_locked(job)  # the slot the run took was let go


@pytest.mark.slow
def test_a_duplicate_refused_by_the_lock_takes_no_turn(
    fault_server: RedisServer, fault_app: Celery, tmp_path: Path
) -> None:
    """``lock_rate="2/10s"`` beside the job's lock, duplicates skipped: the duplicate of a
    running job is refused by the lock before it asks the limiter, so it uses no turn, and a
    call after the run ends takes the window's second turn at once (a turn taken first would
    leave it none: it would wait the 10 s window)."""
    task = fault_app.tasks["fault.rated_locked"]
    job = new_job("rate-locked")
    limiter = task.locking.space(fault_app).rate_limiter(f"turns:{job}", "2/10s")
    data = fault_server.client(db=DATA_DB)
    queue = ("-Q", "rate-locked")
    with WorkerProcess(redis_base(fault_server.port), tmp_path, concurrency=2, args=queue):
        first = task.apply_async((job,), queue=queue[1])
        wait_until(lambda: data.llen(f"starts:{job}") == 1, 20, "the first run to start")
        dup = task.apply_async((job,), queue=queue[1])
        wait_until(lambda: dup.state == "SKIPPED", 20, "the duplicate to be skipped")
        assert dup.result["reason"] == "locked" and dup.result["holder"] == first.id
        state = limiter.inspect()
        assert (state.used, state.waiting) == (1, 0)
        data.set(f"go:{job}", 1)
        assert first.get(timeout=20) == first.id
        ended = json.loads(data.lindex(f"intervals:{job}", 0))["end"]
        after = task.apply_async((job, 0.0), queue=queue[1])
        assert after.get(timeout=20) == after.id
        started = json.loads(data.lindex(f"starts:{job}", 1))["t"]
        assert started - ended < 1.0
        assert limiter.inspect().used == 2
