"""The Celery app of the beat tests' Django project: ``celery -A tests.beatproj.app beat``."""

from __future__ import annotations

import os

import django
from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.beatproj.settings")
django.setup()

app = Celery("beatproj")
app.config_from_object("django.conf:settings", namespace="CELERY")
