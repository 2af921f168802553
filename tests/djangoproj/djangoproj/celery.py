"""The project's Celery app, as Celery's Django page writes it, plus ``install(app)``."""

import os

from celery import Celery

from celery_singleton_lock import LockedTask, install

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "djangoproj.settings")

app = Celery("djangoproj")
app.config_from_object("django.conf:settings", namespace="CELERY")
install(app)


@app.task(base=LockedTask, name="djangoproj.report", lock_at="publish")  # type: ignore[untyped-decorator]  # celery: unannotated
def report(day: int) -> int:
    return day
