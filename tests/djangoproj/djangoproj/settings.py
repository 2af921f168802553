"""Settings of the test Django project: Celery's settings under the ``CELERY_`` namespace.

The tests add settings through the environment: ``CSL_DJANGO_REDIS`` (``redis://host:port``)
and ``CSL_DJANGO_EXTRA`` (a JSON object of extra settings, such as a wrong
``CELERY_SINGLETON_LOCK_TTL``)."""

import json
import os

SECRET_KEY = "test-only"
DEBUG = False
USE_TZ = True
INSTALLED_APPS = ["django.contrib.contenttypes"]
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}}

_redis = os.environ.get("CSL_DJANGO_REDIS", "redis://127.0.0.1:1")
CELERY_BROKER_URL = f"{_redis}/0"
CELERY_RESULT_BACKEND = f"{_redis}/1"
CELERY_SINGLETON_LOCK_REDIS_URL = f"{_redis}/2"
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True

globals().update(json.loads(os.environ.get("CSL_DJANGO_EXTRA", "{}")))
