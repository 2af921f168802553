"""The lock key is the task name + the arguments bound to the task's signature,
stable across the message serializer's round trip, with clear errors and a bounded length."""

from __future__ import annotations

import datetime
import decimal
import uuid
from typing import Any

import pytest
from celery_fixtures import CeleryEnv, app_task, new_app
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kombu import serialization

from celery_singleton_lock import LockedTask

app = new_app("csl_keys")


@app_task(app, base=LockedTask, name="keys.f")
def f(x: Any, y: Any = 2) -> Any:
    return None


@app_task(app, base=LockedTask, bind=True, name="keys.bound")
def bound(self: Any, x: Any, y: Any = 2) -> str:
    return str(self.lock.key)


@app_task(app, base=LockedTask, bind=True, name="keys.echo")
def echo(self: Any, *args: Any, **kwargs: Any) -> str:
    """Returns the key the worker computed from the arguments it received."""
    return str(self.lock.key)


@app_task(app, base=LockedTask, name="keys.any")
def anyargs(a: Any = None, b: Any = None, *rest: Any, **extra: Any) -> None:
    return None


@app_task(app, base=LockedTask, name="keys.pub", lock_at="publish")
def pub(x: Any) -> None:
    return None


@app_task(app, base=LockedTask, name="keys.custom", lock_key=lambda x, y=2: "k" * 100_000 + str(x))
def custom(x: Any, y: Any = 2) -> None:
    return None


@app_task(app, base=LockedTask, name="keys.report", lock_at="publish")
def report(user_id: Any, day: Any) -> None:
    return None


@app_task(app, base=LockedTask, name="keys.loose", typing=False)
def loose(user_id: Any, day: Any) -> None:
    return None


def _first_only(user_id: Any, *rest: Any, **extra: Any) -> str:
    """A lock_key that takes whatever it is given and keys on the first argument."""
    return str(user_id)


@app_task(app, base=LockedTask, name="keys.report_by_key", lock_at="publish", lock_key=_first_only)
def report_by_key(user_id: Any, day: Any) -> None:
    return None


@app_task(
    app, base=LockedTask, name="keys.report_by_user", lock_at="publish", lock_unique_on=["user_id"]
)
def report_by_user(user_id: Any, day: Any) -> None:
    return None


@app_task(app, base=LockedTask, name="keys.options", lock_unique_on=["user_id"])
def by_options(*args: Any, **options: Any) -> None:
    return None


LONG_NAME = "keys." + "n" * 1000


@app_task(app, base=LockedTask, name=LONG_NAME)
def long_named(x: Any) -> None:
    return None


@app_task(app, base=LockedTask, name=LONG_NAME + "2")
def long_named2(x: Any) -> None:
    return None


class ClassBased(LockedTask):
    name = "keys.class_based"

    def run(self, x: Any, y: Any = 2) -> str:
        return str(self.lock.key)


class_based = app.register_task(ClassBased())


#: the in-process worker and the settings of the conftest ``env`` fixture
CELERY_ENV = {"concurrency": 4}


def test_positional_keyword_and_default_are_one_key(env: CeleryEnv) -> None:
    key = f.lock_key_for(1)
    assert key == f.lock_key_for(x=1) == f.lock_key_for(1, y=2) == f.lock_key_for(1, 2)
    assert key == f.lock_key_for(y=2, x=1)
    assert key != f.lock_key_for(1, y=3)
    assert key != f.lock_key_for(2)
    assert key.startswith("lock:{keys.f:")
    # a different task with the same arguments is another lock
    assert key != anyargs.lock_key_for(1)


def test_self_of_a_bound_task_is_not_part_of_the_key(env: CeleryEnv) -> None:
    key = bound.lock_key_for(1)
    assert key == bound.lock_key_for(x=1) == bound.lock_key_for(1, y=2)
    # the worker, which calls the bound task with self, computes the same key
    assert bound.delay(1).get(timeout=10) == key
    assert bound.delay(x=1).get(timeout=10) == key
    assert bound.apply_async((1, 2)).get(timeout=10) == key


def test_a_class_based_task_binds_its_run_signature_without_self(env: CeleryEnv) -> None:
    key = class_based.lock_key_for(1)
    assert key == class_based.lock_key_for(x=1) == class_based.lock_key_for(1, y=2)
    assert key.startswith("lock:{keys.class_based:")
    assert class_based.delay(x=1).get(timeout=10) == key


def test_tuples_lists_dict_order_and_rich_types() -> None:
    assert f.lock_key_for((1, 2)) == f.lock_key_for([1, 2])
    assert f.lock_key_for({"a": 1, "b": [1, (2, 3)]}) == f.lock_key_for(
        {"b": ((1, [2, 3])), "a": 1}
    )
    assert f.lock_key_for({1: "a"}) == f.lock_key_for({"1": "a"})  # what json makes of it
    u = uuid.UUID("12345678-1234-5678-1234-567812345678")
    assert f.lock_key_for(u) == f.lock_key_for(uuid.UUID(str(u)))
    assert f.lock_key_for(u) != f.lock_key_for(uuid.uuid4())
    d = datetime.datetime(2024, 5, 6, 7, 8, 9, 10)
    assert f.lock_key_for(d) == f.lock_key_for(datetime.datetime.fromisoformat(d.isoformat()))
    assert f.lock_key_for(d) != f.lock_key_for(d + datetime.timedelta(microseconds=1))
    assert f.lock_key_for(decimal.Decimal("1.10")) == f.lock_key_for(decimal.Decimal("1.10"))
    assert f.lock_key_for(decimal.Decimal("1.1")) != f.lock_key_for(decimal.Decimal("1.2"))
    assert f.lock_key_for(b"\x00\xff") == f.lock_key_for(bytearray(b"\x00\xff"))
    assert f.lock_key_for(b"\x00\xff") != f.lock_key_for(b"\x00\xfe")
    assert f.lock_key_for(float("nan")) == f.lock_key_for(float("nan"))


RICH_ARGS: list[tuple[tuple[Any, ...], dict[str, Any]]] = [
    ((1, "two", 3.5, None, True), {}),
    (((1, (2, 3)), [4, [5]]), {"k": {"b": 1, "a": (2, 3)}}),
    ((uuid.UUID("12345678-1234-5678-1234-567812345678"),), {}),
    ((datetime.datetime(2024, 1, 2, 3, 4, 5, 678, tzinfo=datetime.UTC),), {}),
    ((datetime.datetime(2024, 1, 2, 3, 4, 5),), {"d": datetime.date(2020, 2, 29)}),
    ((decimal.Decimal("12.3400"),), {}),
    ((b"bytes", b"\xff\x00 not utf-8"), {}),
    (({1: "int key", "x": [1.5, -0.0]},), {"when": datetime.time(1, 2, 3)}),
]


@pytest.mark.parametrize("serializer", ["json", "pickle"])
@pytest.mark.parametrize("args,kwargs", RICH_ARGS)
def test_worker_key_equals_publisher_key_after_the_serializer(
    env: CeleryEnv, serializer: str, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> None:
    expected = echo.lock_key_for(*args, **kwargs)
    worker_key = echo.apply_async(args, kwargs, serializer=serializer).get(timeout=10)
    assert worker_key == expected


def _round_trip(args: Any, kwargs: Any, serializer: str) -> tuple[Any, Any]:
    content_type, encoding, data = serialization.dumps(  # type: ignore[no-untyped-call]  # kombu: unannotated
        (args, kwargs, {}), serializer=serializer
    )
    loaded = serialization.loads(  # type: ignore[no-untyped-call]  # kombu: unannotated
        data, content_type, encoding, accept={content_type}
    )
    return loaded[0], loaded[1]


# -- property: any argument values: the key function never crashes, and agrees after both
# -- round trips ------------------------------------------------------------------------------

_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.binary(max_size=12),
    st.uuids(),
    st.datetimes(timezones=st.none() | st.just(datetime.UTC) | st.timezones()),
    st.dates(),
    st.decimals(),
)
_dict_keys = st.one_of(
    st.text(max_size=6), st.integers(), st.floats(allow_nan=True), st.booleans(), st.none()
)
_values = st.recursive(
    _scalars,
    lambda children: st.one_of(
        st.lists(children, max_size=4),
        st.tuples(children, children),
        st.dictionaries(_dict_keys, children, max_size=4),
    ),
    max_leaves=12,
)
_kwargs = st.dictionaries(st.sampled_from(["a", "b", "c", "d"]), _values, max_size=3)


@settings(
    max_examples=300,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(args=st.lists(_values, max_size=3), kwargs=_kwargs)
def test_property_key_never_crashes_and_survives_json_and_pickle(
    args: list[Any], kwargs: dict[str, Any]
) -> None:
    try:
        key = anyargs.lock_key_for(*args, **kwargs)
    except TypeError as exc:
        # Arguments that do not fit (a parameter given twice): the error names the task.
        assert "'keys.any' takes (" in str(exc) and "multiple values" in str(exc)
        return
    assert isinstance(key, str)
    assert len(key) <= 300
    for serializer in ("json", "pickle"):
        a, kw = _round_trip(args, kwargs, serializer)
        assert anyargs.lock_key_for(*a, **kw) == key, serializer


def test_an_unencodable_argument_names_it_and_points_to_the_options(env: CeleryEnv) -> None:
    with pytest.raises(TypeError) as info:
        f.lock_key_for(1, y=object())
    message = str(info.value)
    assert "'y'" in message
    assert "lock_key" in message and "lock_unique_on" in message
    # nested inside a container, it is still the argument that is named
    with pytest.raises(TypeError, match=r"'x'.*lock_key"):
        f.lock_key_for([1, {"a": object()}])
    # a publish-time task refuses it at publish, and sends nothing
    before = env.broker.llen("celery")
    with pytest.raises(TypeError, match=r"'x'.*lock_unique_on"):
        pub.delay(object())
    assert env.broker.llen("celery") == before
    assert not env.locks.keys("lock:{keys.pub:*")


def test_keys_have_a_bounded_length() -> None:
    huge = "a" * 1_000_000
    key = f.lock_key_for(huge)
    assert len(key) <= 300
    assert key != f.lock_key_for(huge[:-1] + "b")  # still tells them apart
    key = f.lock_key_for(list(range(100_000)), y={str(i): i for i in range(10_000)})
    assert len(key) <= 300
    # a huge lock_key result: bounded, still distinct, still scoped by the task name
    k1, k2 = custom.lock_key_for(1), custom.lock_key_for(2)
    assert len(k1) <= 300 and len(k2) <= 300 and k1 != k2
    assert k1.startswith("lock:{keys.custom:")
    # a very long task name: bounded, and two names that differ at the end stay apart
    k3, k4 = long_named.lock_key_for(1), long_named2.lock_key_for(1)
    assert len(k3) <= 300 and len(k4) <= 300 and k3 != k4


def test_arguments_that_do_not_fit_the_task_name_it_and_what_is_missing(env: CeleryEnv) -> None:
    """``release_lock(7)`` on a task of ``(user_id, day)`` must not answer about a lock made of
    the raw arguments, which no call of the task ever takes: it raises, naming the task and the
    missing argument, and so do the other lookups and a publish (which sends nothing)."""
    for lookup in (report.release_lock, report.is_locked, report.lock_holder, report.lock_key_for):
        with pytest.raises(TypeError, match=r"'keys.report'.*missing a required argument: 'day'"):
            lookup(7)
    with pytest.raises(TypeError, match=r"'keys.report'.*unexpected keyword argument 'days'"):
        report.is_locked(7, "2024-05-01", days=1)
    before = env.broker.llen("celery")
    with pytest.raises(TypeError, match="missing a required argument: 'day'"):
        report.delay(7)
    assert env.broker.llen("celery") == before
    assert not env.locks.keys("lock:{keys.report:*")
    # The arguments that fit make the key every call of the job takes.
    assert report.lock_key_for(7, "2024-05-01") == report.lock_key_for(user_id=7, day="2024-05-01")
    # A task with typing=False (Celery checks no arguments either) keeps a key of its own.
    assert loose.lock_key_for(7).startswith("lock:{keys.loose:")


@pytest.mark.parametrize("task", [report, report_by_key, report_by_user], ids=lambda t: t.name)
def test_too_many_arguments_raise_naming_the_task_before_anything_is_written(
    env: CeleryEnv, task: Any
) -> None:
    """An argument the task has no parameter for is never dropped from the key (one key for
    ``f(7, day)`` and ``f(7, day, "extra")``, a call no run can take): every lookup and a
    publish raise ``TypeError`` naming the task and its parameters, whether the key is made of
    every argument, of ``lock_unique_on``'s or by a ``lock_key`` that takes anything, and
    nothing reaches Redis or the broker."""
    before = env.broker.llen("celery")
    message = rf"task '{task.name}' takes \(user_id, day\): too many positional arguments"
    for call in (
        task.lock_key_for,
        task.is_locked,
        task.release_lock,
        task.lock_holder,
        task.delay,
    ):
        with pytest.raises(TypeError, match=message):
            call(7, "2024-05-01", "extra")
    with pytest.raises(TypeError, match=rf"'{task.name}'.*unexpected keyword argument 'days'"):
        task.delay(7, "2024-05-01", days=1)
    assert env.broker.llen("celery") == before
    assert not env.locks.keys(f"*{task.name}*")
    # The arguments that fit: one key, by position or keyword.
    assert task.lock_key_for(7, "2024-05-01") == task.lock_key_for(user_id=7, day="2024-05-01")


def test_lock_unique_on_a_name_of_the_task_s_kwargs_keys_each_value_apart() -> None:
    """``lock_unique_on`` may name an argument that ``**options`` takes (the class check admits
    it): its value makes the key, so two users' calls are two jobs (they were one, keyed on
    ``user_id=None``), and arguments outside it are not part of the key."""
    seven = by_options.lock_key_for(user_id=7)
    assert seven != by_options.lock_key_for(user_id=8)
    assert seven == by_options.lock_key_for(1, user_id=7, day="monday")
    assert by_options.lock_key_for() == by_options.lock_key_for(day="monday")  # user_id=None
