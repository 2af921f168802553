"""``python -m tests.beatproj.prepare``: create the project's SQLite database and the one
periodic task (``ENTRY``, due every ``$CSL_BEATPROJ_PERIOD`` seconds), as an operator would
with ``migrate`` and the admin."""

from __future__ import annotations

import os

import django
from django.core.management import call_command

from .env import ENTRY, PERIOD_ENV, TASK


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.beatproj.settings")
    django.setup()
    from django_celery_beat.models import IntervalSchedule, PeriodicTask

    call_command("migrate", verbosity=0)
    every = IntervalSchedule.objects.create(
        every=int(os.environ.get(PERIOD_ENV, "2")), period=IntervalSchedule.SECONDS
    )
    PeriodicTask.objects.create(name=ENTRY, task=TASK, interval=every)


if __name__ == "__main__":
    main()
