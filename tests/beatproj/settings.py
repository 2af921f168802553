"""Django settings of the beat tests' project (see the package's doc).

The Celery settings use Django's ``CELERY_`` namespace, as a Django project would: the leader
scheduler runs django-celery-beat's ``DatabaseScheduler`` while it leads.
"""

from __future__ import annotations

import os

from .env import BROKER_DB, DB_ENV, LOCK_DB, REDIS_ENV, TTL_ENV

SECRET_KEY = "only-for-the-beat-tests"
INSTALLED_APPS = ["django_celery_beat"]
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": os.environ.get(DB_ENV, ":memory:"),
        # Two beats write one file: wait for the other's write lock rather than fail.
        "OPTIONS": {"timeout": 20},
    }
}
USE_TZ = True
TIME_ZONE = "UTC"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

_REDIS = os.environ.get(REDIS_ENV, "redis://127.0.0.1:6390").rstrip("/")
CELERY_BROKER_URL = f"{_REDIS}/{BROKER_DB}"
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_TASK_DEFAULT_QUEUE = "beatproj"
CELERY_RESULT_EXPIRES = None  # no backend_cleanup entry: the schedule is the one task
CELERY_SINGLETON_LOCK_REDIS_URL = f"{_REDIS}/{LOCK_DB}"
CELERY_SINGLETON_LOCK_TTL = float(os.environ.get(TTL_ENV, "2"))
CELERY_SINGLETON_LOCK_BEAT_SCHEDULER = "django_celery_beat.schedulers:DatabaseScheduler"
