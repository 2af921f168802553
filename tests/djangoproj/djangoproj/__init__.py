"""A small Django project laid out as Celery's "First steps with Django" page shows: the Celery
app is imported here, so Django's start imports it (and this package's system check)."""

from .celery import app as celery_app

__all__ = ["celery_app"]
