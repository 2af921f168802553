"""The locks page in a Django project: ``path("locks/", include("celery_singleton_lock.web.
django"))``. Staff only by default: a visitor not logged in is sent to the login page
(``settings.LOGIN_URL``), a logged-in user who is not staff is refused (403); releases and
purges are staff only too. :func:`make_urlpatterns` sets other rules.

The Celery app is the setting ``CELERY_SINGLETON_LOCK_WEB_APP`` (``"proj.celery:app"``), else
``celery.current_app``; ``CELERY_SINGLETON_LOCK_WEB_OPTIONS`` (a dict) gives
:func:`~celery_singleton_lock.web.make_app`'s options. Django's CSRF middleware is not applied
to these views: the page's own check (a double-submit cookie) is.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
from typing import Any

from django.http import HttpResponse
from django.urls import path
from django.views.decorators.csrf import csrf_exempt

from .access import CallableAccess
from .app import LocksWeb, make_app
from .messages import request_from_environ

__all__ = ["make_urlpatterns", "urlpatterns"]

#: the Django request in the environ handed to the access callables
REQUEST = "celery_singleton_lock.django_request"


def is_staff(request: Any) -> bool:
    """The default rule: an active staff user."""
    user = getattr(request, "user", None)
    return bool(user is not None and user.is_active and user.is_staff)


def _celery_app() -> Any:
    from django.conf import settings

    where = getattr(settings, "CELERY_SINGLETON_LOCK_WEB_APP", None)
    if where is None:
        from celery import current_app

        return current_app._get_current_object()  # noqa: SLF001 - the app, not its proxy
    module, _, attribute = str(where).partition(":")
    if not attribute:
        raise ValueError(
            f"CELERY_SINGLETON_LOCK_WEB_APP must be 'module:attribute', such as "
            f"'proj.celery:app', got {where!r}"
        )
    return getattr(importlib.import_module(module), attribute)


def make_urlpatterns(
    can_view: Callable[[Any], bool] = is_staff,
    can_change: Callable[[Any], bool] | None = None,
    **make_app_options: Any,
) -> list[Any]:
    """The page's URL patterns with ``can_view`` / ``can_change`` (each given the Django
    request; ``can_change`` defaults to ``can_view``)."""
    change = can_change or can_view
    access = CallableAccess(
        lambda environ: can_view(environ[REQUEST]),
        lambda environ: change(environ[REQUEST]),
        lambda environ: str(getattr(environ[REQUEST].user, "username", "") or "anonymous"),
    )

    @functools.cache
    def web() -> LocksWeb:
        # Made at the first request: the settings and the Celery app are ready by then.
        from django.conf import settings

        options = dict(getattr(settings, "CELERY_SINGLETON_LOCK_WEB_OPTIONS", {}))
        options.update(make_app_options)
        return make_app(_celery_app(), access=access, **options)

    @csrf_exempt  # type: ignore[untyped-decorator]  # django: unannotated
    def page(request: Any, sub: str = "") -> HttpResponse:
        # Django's ALLOWED_HOSTS check, here whatever the middleware: a rebinding site's name
        # is refused (DisallowedHost: 400) before the page reads or changes anything.
        request.get_host()
        if not can_view(request):
            user = getattr(request, "user", None)
            if user is None or not user.is_authenticated:
                from django.contrib.auth.views import redirect_to_login

                return redirect_to_login(request.get_full_path())
        environ = {**request.META, REQUEST: request}
        full = request.path
        mount = full[: len(full) - len(sub)] if sub else full
        form = (
            {k: request.POST.get(k, "") for k in request.POST} if request.method == "POST" else {}
        )
        answer = web().handle(request_from_environ(environ, sub, mount, form))
        response = HttpResponse(answer.body, status=answer.status)
        for header, value in answer.headers:
            if header == "Set-Cookie":  # several (CSRF, outcome): Django keeps one per name
                response.cookies.load(value)
            else:
                response.headers[header] = value
        return response

    return [
        path("", page, name="celery_singleton_lock_locks"),
        path("lock", page, {"sub": "lock"}),
        path("release", page, {"sub": "release"}),
        path("purge", page, {"sub": "purge"}),
    ]


urlpatterns = make_urlpatterns()
