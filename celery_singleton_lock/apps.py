"""The package as a Django app: ``INSTALLED_APPS = [..., "celery_singleton_lock"]`` registers
the system check of its settings (a wrong or misspelt ``CELERY_SINGLETON_LOCK_*`` setting is
``celery_singleton_lock.E001``). No models, no migrations, no signal receivers.
"""

from __future__ import annotations

from django.apps import AppConfig

__all__ = ["CeleryLockConfig"]


class CeleryLockConfig(AppConfig):  # type: ignore[misc]  # Django ships no type information
    """Django's record of the app."""

    name = "celery_singleton_lock"
    label = "celery_singleton_lock"
    verbose_name = "Celery locks"

    def ready(self) -> None:
        """Register the settings' check (registering again, as ``install`` may, changes
        nothing)."""
        from django.core import checks

        from ._celery.wiring import django_check

        checks.register(django_check, "celery_singleton_lock")
