"""The project's Celery app, as Celery's Django page writes it."""

from celery import Celery

app = Celery("webproj")
app.config_from_object("django.conf:settings", namespace="CELERY")
