"""What a worker, beat and a Django project check when they start: the settings, read then
(a wrong value or a misspelt name stops the process with the reason, before any job depends
on it), and the ``singleton_lock_tasks`` setting's tasks, locked in a worker or beat started
by the ``celery`` command even where the app module never calls :func:`install` (the
``celery`` command imports this package through its ``locks`` command's entry point).
"""

from __future__ import annotations

import logging
import sys
from typing import Any

from celery import signals
from celery.app import app_or_default

from .checks import check_settings, settings_problems
from .install import install, is_installed
from .settings import reload_settings, setting

__all__ = ["connect_startup_receivers", "django_check"]

log = logging.getLogger("celery_singleton_lock.startup")


def _start(app: Any, what: str) -> None:
    # The settings the process runs with are those of its start: read again now (whatever
    # read them while the app module was imported), and checked.
    reload_settings(app)
    try:
        check_settings(app)
    except (TypeError, ValueError) as exc:
        log.critical("the %s cannot start: %s", what, exc)
        # Celery logs and swallows a signal receiver's Exception; SystemExit ends the process,
        # as Celery's own configuration errors do.
        raise SystemExit(f"the {what} cannot start: {exc}") from exc
    tasks = setting(app, "singleton_lock_tasks")
    if tasks and not is_installed(app):
        install(app)
        publish_mode = sorted(
            name for name, options in tasks.items() if options.get("lock_at", "run") != "run"
        )
        if publish_mode:
            log.warning(
                "singleton_lock_tasks: locking %s in this %s, but the app module does not "
                "call install(app): a process that publishes %s without it sends duplicates, "
                "which are skipped here only while the job they duplicate still runs (one "
                "that arrives after it ended runs again) instead of kept out at publish; call "
                "install(app) where the app is defined",
                ", ".join(sorted(tasks)),
                what,
                ", ".join(publish_mode),
            )


def _on_worker_init(sender: Any = None, **kwargs: Any) -> None:
    app = getattr(sender, "app", None)
    if app is not None:
        _start(app, "worker")


def _on_beat_init(sender: Any = None, **kwargs: Any) -> None:
    app = getattr(sender, "app", None)
    if app is not None:
        _start(app, "beat")


def django_check(app_configs: Any = None, **kwargs: Any) -> list[Any]:
    """Django's system check (``manage.py check``, ``runserver``, ``migrate``): the settings of
    the current Celery app (the one the project's ``celery.py`` makes), one Error each."""
    from django.core import checks

    return [
        checks.Error(problem, id="celery_singleton_lock.E001")
        for problem in settings_problems(app_or_default())
    ]


def connect_startup_receivers() -> None:
    signals.worker_init.connect(
        _on_worker_init, weak=False, dispatch_uid="celery_singleton_lock.startup.worker_init"
    )
    signals.beat_init.connect(
        _on_beat_init, weak=False, dispatch_uid="celery_singleton_lock.startup.beat_init"
    )
    if "django" in sys.modules:
        # A Django project: its system checks report the settings too (registering needs no
        # configured settings; the check runs when Django runs its checks).
        from django.core import checks

        checks.register(django_check, "celery_singleton_lock")
