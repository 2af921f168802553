"""RateLimiter on a real Redis: the rule's forms and errors, exactness over every window while
threads hammer one limiter, waiting callers that come back about once each, pause, a caller
killed with a turn that leaves nothing stuck (every key expires by time), cancel, inspect,
the listing of a prefix's limiters, the lock SCAN that ignores them, one Cluster slot per
limiter, and bad input refused before anything is written."""

from __future__ import annotations

import math
import multiprocessing
import os
import signal
import threading
from typing import Any

import pytest
import redis
from lock_helpers import wait_until
from redis.crc import key_slot

from celery_singleton_lock import LockSpace, RateLimiter, ReentrantLock
from celery_singleton_lock._lock import RateKeys, scripts
from celery_singleton_lock.lock import Rate, RateReply
from celery_singleton_lock.testing import RedisServer

FORK = multiprocessing.get_context("fork")
#: what float seconds parsed from "<sec>.<usec>" may be off by
EPSILON = 1e-6


def server_time(client: Any) -> float:
    unix, micros = client.time()
    return float(unix) + float(micros) / 1e6


def gaps_hold(starts: list[float], rate: Rate) -> bool:
    """Any ``limit + 1`` consecutive starts span at least the period: no window holds more."""
    ordered = sorted(starts)
    return all(
        ordered[i + rate.limit] - ordered[i] >= rate.period - EPSILON
        for i in range(len(ordered) - rate.limit)
    )


# -- the rule ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "limit", "period", "shown"),
    [
        ("10/s", 10, 1.0, "10/s"),
        ("100/m", 100, 60.0, "100/m"),
        ("1/h", 1, 3600.0, "1/h"),
        ("5/d", 5, 86400.0, "5/d"),
        ("5/10s", 5, 10.0, "5/10s"),
        ("3/2.5s", 3, 2.5, "3/2.5s"),
        ("100/15m", 100, 900.0, "100/15m"),
        (" 5 / 10 s ", 5, 10.0, "5/10s"),
        ("7/120s", 7, 120.0, "7/2m"),
        ("2/1.5m", 2, 90.0, "2/90s"),
        ("1/30d", 1, 30 * 86400.0, "1/30d"),
    ],
)
def test_rate_forms(text: str, limit: int, period: float, shown: str) -> None:
    rate = Rate.parse(text)
    assert (rate.limit, rate.period, str(rate)) == (limit, period, shown)
    assert Rate.parse(str(rate)) == rate
    assert Rate.parse(rate) is rate


@pytest.mark.parametrize(
    "value", ["10 per s", "10/x", "", "/s", "-1/s", "1.5/s", "10/S", "10/s/s", "5/-1s"]
)
def test_rate_errors_show_the_form(value: str) -> None:
    with pytest.raises(ValueError) as raised:
        Rate.parse(value, "lock_rate")
    assert str(raised.value) == (
        f"lock_rate must be 'N/period' such as '10/s', '100/m' or '5/10s', got {value!r}"
    )


@pytest.mark.parametrize(
    ("value", "words"),
    [("0/s", "at least 1 start"), ("5/0s", "from 1 ms to 30 days"), ("1/31d", "30 days")],
)
def test_rate_bounds_are_named(value: str, words: str) -> None:
    with pytest.raises(ValueError, match=f"^lock_rate must .*{words}.*got '{value}'$"):
        Rate.parse(value, "lock_rate")


@pytest.mark.parametrize("value", [10, None, 1.5, b"10/s"])
def test_rate_type_errors(value: Any) -> None:
    with pytest.raises(TypeError, match=r"^lock_rate must be 'N/period' .* or a Rate, got "):
        Rate.parse(value, "lock_rate")


def test_rate_made_directly_is_checked() -> None:
    assert Rate(5, 10) == Rate(5, 10.0) and str(Rate(5, 10)) == "5/10s"
    not_limits: list[Any] = [0, True, 1.0]
    for limit in not_limits:
        with pytest.raises(ValueError, match="limit must be an int >= 1"):
            Rate(limit, 1.0)
    for period in (0, -1, math.nan, 31 * 86400):
        with pytest.raises(ValueError, match="period must be"):
            Rate(1, period)


# -- exactness ---------------------------------------------------------------------------------


def test_no_window_holds_more_than_the_limit(redis_server: RedisServer) -> None:
    rate = Rate.parse("5/0.5s")
    admitted: list[float] = []
    done = threading.Event()
    clients = [redis_server.client() for _ in range(3)]
    for client in clients:
        client.delete("lock:rate:{hammered}", "lock:rate:{hammered}:state")

    def hammer(client: Any, keep_turns: bool) -> None:
        limiter = RateLimiter(client, "hammered", rate)
        n = 0
        while not done.is_set():
            n += 1
            # one-off tries and callers that keep their turns, on the same limiter
            if keep_turns:  # a turn is at most a period ahead: always admitted
                reply = limiter.acquire(5.0, f"{id(client)}-{n}")
            else:
                reply = limiter.try_acquire()
            if reply.admitted:
                admitted.append(reply.at)

    threads = [
        threading.Thread(target=hammer, args=(client, i > 0)) for i, client in enumerate(clients)
    ]
    for thread in threads:
        thread.start()
    try:
        # at least 3 s of Redis's clock, and enough starts to fill several windows
        start = server_time(clients[0])
        wait_until(lambda: server_time(clients[0]) - start >= 3.0 and len(admitted) >= 20)
    finally:
        done.set()
        for thread in threads:
            thread.join(10)
        for client in clients:
            client.close()
    assert gaps_hold(admitted, rate)
    # the limit was reached, not merely stayed under: full windows were admitted
    ordered = sorted(admitted)
    assert any(ordered[i + 4] - ordered[i] < rate.period for i in range(len(ordered) - 4))


def test_waiting_callers_come_back_about_once(redis_server: RedisServer) -> None:
    rate = Rate.parse("5/s")
    tries: dict[int, int] = {}
    starts: list[float] = []

    class Counting(RateLimiter):
        __slots__ = ("caller",)
        caller: int

        def try_acquire(self, call_id: str | None = None) -> RateReply:
            tries[self.caller] = tries.get(self.caller, 0) + 1
            return super().try_acquire(call_id)

    barrier = threading.Barrier(20)
    client = redis_server.client()
    client.delete("lock:rate:{crowd}", "lock:rate:{crowd}:state")

    def caller(n: int) -> None:
        limiter = Counting(client, "crowd", rate)
        limiter.caller = n
        barrier.wait(10)
        reply = limiter.acquire(timeout=30)
        assert reply.admitted
        starts.append(reply.at)

    threads = [threading.Thread(target=caller, args=(n,)) for n in range(20)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    client.close()
    assert len(starts) == 20 and gaps_hold(starts, rate)
    # 5 at once, then 5 a second, each on its turn: no herd polling the limiter
    assert sorted(tries.values()).count(1) >= 5
    assert sum(1 for n in tries.values() if n <= 2) >= 16, tries
    assert max(tries.values()) <= 4, tries


# -- pause, cancel, inspect --------------------------------------------------------------------


def test_pause_refuses_everyone_and_never_shortens(redis_client: Any) -> None:
    limiter = RateLimiter(redis_client, "api", "100/s")
    assert limiter.try_acquire().admitted
    before = server_time(redis_client)
    left = limiter.pause(1.0)
    assert 0.9 < left <= 1.0
    until = before + 1.0
    # a shorter pause leaves the longer one in force
    assert limiter.pause(0.1) > 0.5
    refused = limiter.try_acquire("waiter")
    assert not refused and refused.paused > 0 and refused.wait == pytest.approx(refused.paused)
    assert refused.at + refused.paused >= until - 0.01
    reply = limiter.acquire(timeout=10, call_id="waiter")
    assert reply.admitted and reply.at >= until - 0.01 and reply.paused == 0.0
    assert limiter.pause(0) == 0.0  # only reads


def test_a_pause_outlives_a_short_log(redis_client: Any) -> None:
    limiter = RateLimiter(redis_client, "quiet", "1/0.1s")
    limiter.pause(60)
    assert 59_000 < redis_client.pttl(limiter.keys.state) <= 60_000
    assert not limiter.try_acquire()  # a one-off try, refused: no turn kept
    assert redis_client.exists(limiter.keys.log) == 0
    assert 59_000 < redis_client.pttl(limiter.keys.state) <= 60_000


def test_cancel_drops_a_turn(redis_client: Any) -> None:
    limiter = RateLimiter(redis_client, "jobs", "1/10s")
    assert limiter.try_acquire("first")
    assert not limiter.try_acquire("second")
    assert limiter.inspect().waiting == 1
    assert limiter.cancel("second") is True
    assert limiter.cancel("second") is False
    assert limiter.inspect().waiting == 0
    assert redis_client.zscore(limiter.keys.log, "r:second") is None


def test_a_returning_call_owns_its_turn(redis_client: Any) -> None:
    limiter = RateLimiter(redis_client, "turns", "2/0.3s")
    assert limiter.try_acquire("a") and limiter.try_acquire("b")
    c = limiter.try_acquire("c")
    d = limiter.try_acquire("d")
    assert not c and not d and c.at + c.wait <= d.at + d.wait  # turns on Redis's clock
    # a newcomer queues behind both turns; "c" at its turn is admitted, as is "d" after it
    newcomer = limiter.try_acquire()
    assert not newcomer and newcomer.at + newcomer.wait > d.at + d.wait
    for call, turn in (("c", c.at + c.wait), ("d", d.at + d.wait)):

        def come(turn: float = turn) -> bool:
            return server_time(redis_client) >= turn

        wait_until(come, what=f"{call}'s turn on Redis's clock")
        assert limiter.try_acquire(call).admitted


def test_inspect(redis_client: Any) -> None:
    limiter = RateLimiter(redis_client, "seen", "3/s")
    fresh = limiter.inspect()
    assert fresh == ("seen", 3, 1.0, 0, 0, 0.0, 0.0)
    for call in "abc":
        assert limiter.try_acquire(call)
    for call in "de":
        assert not limiter.try_acquire(call)
    state = limiter.inspect()
    assert (state.limit, state.period, state.used, state.waiting) == (3, 1.0, 3, 2)
    assert 0 < state.next_free <= 1.0 and state.paused == 0.0
    # the rule last used is what an operator sees
    RateLimiter(redis_client, "seen", "5/10s").try_acquire()
    assert limiter.inspect()[1:3] == (5, 10.0)


def test_keys_expire_by_time_after_a_killed_caller(redis_client: Any, redis_url: str) -> None:
    limiter = RateLimiter(redis_client, "victim", "1/2s")
    assert limiter.try_acquire("held")

    def take_a_turn_and_die() -> None:
        child = RateLimiter(redis.Redis.from_url(redis_url), "victim", "1/2s")
        assert not child.try_acquire("killed")
        os.kill(os.getpid(), signal.SIGKILL)

    process = FORK.Process(target=take_a_turn_and_die)
    process.start()
    process.join(30)
    assert process.exitcode == -signal.SIGKILL
    assert redis_client.zscore(limiter.keys.log, "r:killed") is not None
    # the turn is 2 s ahead, and the log ends one period after it (and at most half a period
    # more: its TTL is written only when too short); the state with it
    for key in limiter.keys.pair:
        assert 2_000 < redis_client.pttl(key) <= 5_000
    wait_until(lambda: redis_client.exists(*limiter.keys.pair) == 0, timeout=10, what="expiry")


def test_every_key_keeps_a_ttl(redis_client: Any) -> None:
    limiter = RateLimiter(redis_client, "ttl", "1/0.2s")

    def ttls_set() -> None:
        for key in limiter.keys.pair:
            assert redis_client.pttl(key) != -1, key  # -2: gone, fine; -1: would stay forever

    first = limiter.try_acquire("a")
    ttls_set()
    turn = limiter.try_acquire("b")
    ttls_set()
    wait_until(lambda: server_time(redis_client) >= first.at + 0.2, what="a's start to go")
    # the log holds b's turn alone; cancelled, the log is gone, and a new start makes it again
    assert limiter.cancel("b") and not turn.admitted
    assert limiter.try_acquire("c")
    ttls_set()
    RateLimiter(redis_client, "ttl", "2/0.3s").try_acquire()  # another rule
    ttls_set()
    limiter.pause(0.5)
    assert not limiter.try_acquire()
    ttls_set()


# -- keys: listing, lock SCAN, Cluster slots -----------------------------------------------------


def test_rate_limiters_lists_this_prefix_only(redis_client: Any) -> None:
    space = LockSpace(redis_client, "jobs*")
    odd = "a}b%c*"
    space.rate_limiter("plain", "2/s").try_acquire()
    space.rate_limiter(odd, "1/m").try_acquire()
    space.rate_limiter("paused", "1/s").pause(30)  # a state hash alone
    LockSpace(redis_client, "jobsX").rate_limiter("other", "1/s").try_acquire()
    LockSpace(redis_client, "jobs").rate_limiter("other", "1/s").try_acquire()
    ReentrantLock(redis_client, "a-lock", ttl=30, prefix="jobs*", renew=False).acquire()
    listed = {state.name: state for state in space.rate_limiters()}
    assert set(listed) == {"plain", odd, "paused"}
    assert listed[odd][1:5] == (1, 60.0, 1, 0)
    assert listed["paused"].limit == 0 and listed["paused"].paused > 29


def test_a_space_makes_limiters_with_its_prefix_and_bound(redis_client: Any) -> None:
    limiter = LockSpace(redis_client, "jobs", backend_timeout=2.5).rate_limiter("n", Rate(2, 3))
    assert (limiter.prefix, limiter.backend_timeout, str(limiter.rate)) == ("jobs", 2.5, "2/3s")
    assert limiter.keys.pair == ("jobs:rate:{n}", "jobs:rate:{n}:state")
    assert limiter.try_acquire() and redis_client.exists(*limiter.keys.pair) == 2


def test_the_lock_scan_ignores_rate_keys(redis_client: Any) -> None:
    for prefix in ("lock", "a*"):
        space = LockSpace(redis_client, prefix)
        space.rate_limiter("x", "1/s").try_acquire()
        space.rate_limiter("y", "1/s").pause(10)
        ReentrantLock(redis_client, "x", ttl=30, prefix=prefix, renew=False).acquire()
    ReentrantLock(redis_client, "ab-lock", ttl=30, prefix="ab", renew=False).acquire()
    assert [keys.lock for keys in LockSpace(redis_client, "lock").find()] == ["lock:{x}"]
    assert [keys.lock for keys in LockSpace(redis_client, "a*").find()] == ["a*:{x}"]


@pytest.mark.parametrize("name", ["plain", "a}b", "{tag}", "50%", "x:y"])
def test_a_limiter_s_keys_share_one_slot(name: str) -> None:
    keys = RateKeys.for_name("lock", name)
    assert key_slot(keys.log.encode()) == key_slot(keys.state.encode())
    # the tag is the whole (escaped) name: the slot is the name's, whatever the prefix
    assert key_slot(keys.log.encode()) == key_slot(RateKeys.for_name("other", name).log.encode())


# -- bad input ------------------------------------------------------------------------------------


def _refused(client: Any, call: Any, parameter: str) -> None:
    with pytest.raises((TypeError, ValueError)) as raised:
        call()
    assert parameter in str(raised.value), f"{raised.value!r} does not name {parameter}"
    assert client.dbsize() == 0, f"{parameter}: something was written: {client.keys()}"


def test_bad_input_writes_nothing(redis_client: Any) -> None:
    make: Any = RateLimiter
    limiter: Any = RateLimiter(redis_client, "ok", "1/s")
    _refused(redis_client, lambda: make(redis_client, "x", "10 per s"), "rate")
    _refused(redis_client, lambda: make(redis_client, "", "1/s"), "name")
    _refused(redis_client, lambda: make(redis_client, "x", "1/s", prefix="a{b"), "prefix")
    _refused(redis_client, lambda: make(redis_client, "x", "1/s", backend_timeout=0), "backend")
    _refused(redis_client, lambda: make(object(), "x", "1/s"), "client")
    _refused(redis_client, lambda: LockSpace(redis_client).rate_limiter("x", "0/s"), "rate")
    for call_id in ("", 7, b"id"):
        _refused(redis_client, lambda c=call_id: limiter.try_acquire(c), "call_id")
        _refused(redis_client, lambda c=call_id: limiter.acquire(1, c), "call_id")
        _refused(redis_client, lambda c=call_id: limiter.cancel(c), "call_id")
    for seconds in (-1, math.nan, math.inf, "1", None):
        _refused(redis_client, lambda s=seconds: limiter.pause(s), "seconds")
    for timeout in (-1, math.nan, "1"):
        _refused(redis_client, lambda t=timeout: limiter.acquire(t), "timeout")


@pytest.mark.parametrize(
    ("script", "args", "words"),
    [
        (scripts.RATE_TAKE, (0, 1000, "x"), "limit"),
        (scripts.RATE_TAKE, (1.5, 1000, "x"), "limit"),
        (scripts.RATE_TAKE, (1, 0.5, "x"), "period"),
        (scripts.RATE_TAKE, (1, "soon", "x"), "period"),
        (scripts.RATE_PAUSE, (-1,), "pause"),
        (scripts.RATE_PAUSE, ("nan",), "pause"),
    ],
)
def test_the_scripts_check_their_arguments_before_writing(
    redis_client: Any, script: scripts.Script, args: tuple[Any, ...], words: str
) -> None:
    keys = ("lock:rate:{x}", "lock:rate:{x}:state")
    with pytest.raises(redis.ResponseError, match=words):
        script(redis_client, keys, args)
    assert redis_client.dbsize() == 0
