"""The package as a Django app: ``INSTALLED_APPS = [..., "celery_singleton_lock"]`` registers the
system check of its settings (``manage.py check``, ``runserver``, ``migrate`` report a wrong or
misspelt ``CELERY_SINGLETON_LOCK_*`` setting as ``celery_singleton_lock.E001``), as
django-celery-beat's and django-celery-results' apps do for theirs. Nothing else: no models, no
migrations, no signal receivers. Django imports this module only for an installed app, so
importing the package stays free of side effects.
"""

from __future__ import annotations

from django.apps import AppConfig

__all__ = ["CeleryLockConfig"]


class CeleryLockConfig(AppConfig):  # type: ignore[misc]  # Django ships no type information
    """Django's record of the app (found by Django itself: the one ``AppConfig`` here)."""

    name = "celery_singleton_lock"
    label = "celery_singleton_lock"
    verbose_name = "Celery locks"

    def ready(self) -> None:
        """Register the settings' check (the registry is a set: registering again, as
        :func:`~celery_singleton_lock.install` does in a Django process, changes nothing)."""
        from django.core import checks

        from ._celery.wiring import django_check

        checks.register(django_check, "celery_singleton_lock")
