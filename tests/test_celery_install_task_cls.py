"""``install()`` on an app whose ``task_cls`` is Flask's documented base class: the installed
task keeps its class's ``__call__`` (the body sees the app context) and holds the lock."""

from __future__ import annotations

from celery_fixtures import CeleryEnv, app_task, new_app
from test_celery_task_classes import (
    FlaskTask,
    flask_app,
    gates,  # noqa: F401  # the conftest's env opens the module's gates at its end
    in_flask_context,
    runs_once_in_context,
)

from celery_singleton_lock import LockedTask, install

app = new_app("csl_task_cls", task_cls=FlaskTask)


@app_task(app, name="task_cls.installed")
def installed(key: str) -> str:
    return in_flask_context(key)


install(app, tasks={"task_cls.installed": {}})


def test_install_on_an_app_whose_task_cls_is_flask_s(env: CeleryEnv) -> None:
    task = app.tasks["task_cls.installed"]
    assert isinstance(task, LockedTask) and isinstance(task, FlaskTask)
    runs_once_in_context(env, task, flask_app.name)
