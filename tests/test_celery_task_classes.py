"""The lock holds around the body whatever the task class's ``__call__`` chain: Flask's
documented base class (a ``__call__`` that pushes the app context and calls ``self.run``)
before or after ``LockedTask`` in the MRO, a base whose ``__call__`` wraps ``super().__call__``
(tracing, DB sessions), and a task class with its own ``Request`` (``install()`` on an app
whose ``task_cls`` is Flask's: tests/test_celery_install_task_cls.py). Each body fails without
its base class's context, and each test checks that a duplicate is still kept out, on a real
worker."""

from __future__ import annotations

import contextvars
import uuid
from typing import Any

import pytest
from celery import Task
from celery.worker.request import Request
from celery_fixtures import CeleryEnv, Gates, app_task, new_app
from flask import Flask, current_app
from kombu.utils.imports import symbol_by_name
from lock_helpers import wait_until

from celery_singleton_lock import LockedTask

gates = Gates()
flask_app = Flask("csl_flask_app")


class FlaskTask(Task):  # type: ignore[misc]  # celery ships no type information
    """Flask's "Background Tasks with Celery" base class, as Flask documents it."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        with flask_app.app_context():
            return self.run(*args, **kwargs)


#: the span a tracing base class opens around the run (``None`` outside one)
span: contextvars.ContextVar[str | None] = contextvars.ContextVar("span", default=None)


class TracedTask(Task):  # type: ignore[misc]  # celery ships no type information
    """Instrumentation's shape: ``__call__`` opens a span and calls ``super().__call__``."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        token = span.set(f"span:{self.name}")
        try:
            return super().__call__(*args, **kwargs)
        finally:
            span.reset(token)


class LockedThenFlask(LockedTask, FlaskTask):
    pass


class FlaskThenLocked(FlaskTask, LockedTask):
    pass


class LockedThenTraced(LockedTask, TracedTask):
    pass


class TracedThenLocked(TracedTask, LockedTask):
    pass


class FlaskSubclassOfLocked(LockedTask):
    """A project's own base class derived from ``LockedTask`` with Flask's ``__call__``."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        with flask_app.app_context():
            return self.run(*args, **kwargs)


#: what the custom Request saw (the worker's main thread, for the threads pool)
accepted: list[str] = []


class RecordingRequest(Request):  # type: ignore[misc]  # celery ships no type information
    def on_accepted(self, pid: Any, time_accepted: float) -> None:
        accepted.append(self.id)
        super().on_accepted(pid, time_accepted)


class OwnRequestTask(LockedTask):
    Request = RecordingRequest


class OwnRequestBase(Task):  # type: ignore[misc]  # celery ships no type information
    Request = "test_celery_task_classes:RecordingRequest"


class LockedThenOwnRequest(LockedTask, OwnRequestBase):
    """``LockedTask`` first: its own ``Request`` would shadow the base class's."""


app = new_app("csl_task_classes")


def in_flask_context(key: str) -> str:
    name = current_app.name  # RuntimeError outside an application context
    gates.enter(key)
    return str(name)


def _in_span(key: str) -> str:
    opened = span.get()
    if opened is None:
        raise RuntimeError("the body ran outside the tracing span")
    gates.enter(key)
    return opened


@app_task(app, base=LockedThenFlask, name="classes.locked_then_flask")
def locked_then_flask(key: str) -> str:
    return in_flask_context(key)


@app_task(app, base=FlaskThenLocked, name="classes.flask_then_locked")
def flask_then_locked(key: str) -> str:
    return in_flask_context(key)


@app_task(app, base=FlaskSubclassOfLocked, name="classes.flask_subclass")
def flask_subclass(key: str) -> str:
    return in_flask_context(key)


@app_task(app, base=LockedThenTraced, name="classes.locked_then_traced")
def locked_then_traced(key: str) -> str:
    return _in_span(key)


@app_task(app, base=TracedThenLocked, name="classes.traced_then_locked")
def traced_then_locked(key: str) -> str:
    return _in_span(key)


@app_task(app, base=FlaskThenLocked, name="classes.flask_publish", lock_at="publish")
def flask_publish(key: str) -> str:
    return in_flask_context(key)


@app_task(app, base=OwnRequestTask, name="classes.own_request")
def own_request(key: str) -> str:
    gates.enter(key)
    return key


@app_task(app, base=LockedThenOwnRequest, name="classes.own_request_path")
def own_request_path(key: str) -> str:
    gates.enter(key)
    return key


@app_task(app, base=LockedTask, name="classes.calls_itself", bind=True)
def calls_itself(self: Any, key: str, depth: int) -> list[Any]:
    """Its body calls the task itself, as a function: a nested call inside its own run."""
    held = [self.is_locked(key, depth), self.lock is not None]
    if depth == 0:
        return held
    return [*held, *calls_itself(key, depth - 1)]


@app_task(app, base=LockedTask, name="classes.calls_itself_publish", bind=True, lock_at="publish")
def calls_itself_publish(self: Any, key: str, depth: int) -> list[Any]:
    held = [self.is_locked(key, depth), self.lock is not None]
    if depth == 0:
        return held
    return [*held, *calls_itself_publish(key, depth - 1)]


@pytest.mark.parametrize("task", [calls_itself, calls_itself_publish], ids=["run", "publish"])
def test_a_task_that_calls_itself_in_its_body_runs_the_call_as_a_function(
    env: CeleryEnv, task: Any
) -> None:
    """The nested call of a plain ``LockedTask`` (whose ``__call__`` goes straight to the body)
    neither takes a lock nor is refused (it is no run: ``self.lock`` is ``None`` inside it);
    the run's lock is the outer call's, freed at the end."""
    key = uuid.uuid4().hex
    assert task.delay(key, 1).get(timeout=10) == [True, True, False, False]
    wait_until(lambda: not task.is_locked(key, 1), 5)


def runs_once_in_context(env: CeleryEnv, task: Any, expected: str) -> None:
    """The first run's body sees its context and holds the lock; a duplicate published while
    it runs is skipped, not run."""
    key = uuid.uuid4().hex
    first = task.delay(key)
    gates.wait_started(key)
    assert task.is_locked(key), "the body runs without its job's lock"
    assert task.lock_holder(key) == first.id
    duplicate = task.delay(key)
    env.wait_state(duplicate.id, "SKIPPED")
    gates.open(key)
    assert first.get(timeout=10) == expected
    assert gates.runs[key] == 1, "the duplicate ran beside the first"
    wait_until(lambda: not task.is_locked(key), 5)


@pytest.mark.parametrize(
    "task",
    [locked_then_flask, flask_then_locked, flask_subclass],
    ids=["LockedTask-then-Flask", "Flask-then-LockedTask", "subclass-with-Flask-call"],
)
def test_flask_s_base_class_in_either_order(env: CeleryEnv, task: Any) -> None:
    runs_once_in_context(env, task, flask_app.name)


@pytest.mark.parametrize(
    "task",
    [locked_then_traced, traced_then_locked],
    ids=["LockedTask-then-traced", "traced-then-LockedTask"],
)
def test_a_base_whose_call_wraps_super_call_in_either_order(env: CeleryEnv, task: Any) -> None:
    runs_once_in_context(env, task, f"span:{task.name}")


def test_a_publish_mode_task_with_flask_s_base_class(env: CeleryEnv) -> None:
    key = uuid.uuid4().hex
    first = flask_publish.delay(key)
    assert flask_publish.delay(key).id == first.id
    gates.wait_started(key)
    gates.open(key)
    assert first.get(timeout=10) == flask_app.name
    wait_until(lambda: not flask_publish.is_locked(key), 5)


@pytest.mark.parametrize(
    "task", [own_request, own_request_path], ids=["own-Request-class", "base-s-Request-path"]
)
def test_a_task_class_s_own_request_is_composed_with_the_lock_s(env: CeleryEnv, task: Any) -> None:
    request_cls = app.tasks[task.name].Request
    assert issubclass(request_cls, RecordingRequest)
    # and of the lock's own (LockedTask.Request, a path, resolved as Celery resolves it)
    locked_request = symbol_by_name(LockedTask.Request)  # type: ignore[no-untyped-call]  # kombu: unannotated
    assert issubclass(request_cls, locked_request)
    key = uuid.uuid4().hex
    first = task.delay(key)
    gates.wait_started(key)
    duplicate = task.delay(key)
    env.wait_state(duplicate.id, "SKIPPED")
    gates.open(key)
    assert first.get(timeout=10) == key
    # the worker built its requests from the composed class: the task's own hook ran
    assert first.id in accepted


def test_a_request_that_is_not_a_celery_request_is_refused_when_the_class_is_made() -> None:
    class NotARequest:
        pass

    with pytest.raises(TypeError, match=r"Bad\.Request must be a subclass of celery"):

        class Bad(LockedTask):
            Request = NotARequest
