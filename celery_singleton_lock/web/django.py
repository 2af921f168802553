"""The locks page in a Django project: ``path("locks/", include("celery_singleton_lock.web.
django"))``, or in the admin with :func:`add_to_admin`; staff only unless
:func:`make_urlpatterns` sets other rules. The Celery app is the setting
``CELERY_SINGLETON_LOCK_WEB_APP`` (``"proj.celery:app"``), else ``celery.current_app``; the
setting ``CELERY_SINGLETON_LOCK_WEB_OPTIONS`` (a dict) gives :func:`~.make_app`'s options."""

from __future__ import annotations

import contextlib
import functools
import importlib
from collections.abc import Callable
from typing import Any

from django.http import HttpResponse
from django.urls import include, path
from django.views.decorators.csrf import csrf_exempt

from .access import CallableAccess
from .app import LocksWeb, make_app

__all__ = ["add_to_admin", "login_url", "make_urlpatterns", "urlpatterns"]

#: the Django request in the environ handed to the access callables
REQUEST = "celery_singleton_lock.django_request"


def is_staff(request: Any) -> bool:
    """The default rule: an active staff user."""
    user = getattr(request, "user", None)
    return bool(user is not None and user.is_active and user.is_staff)


def login_url() -> str:
    """Where a visitor not logged in is sent: ``settings.LOGIN_URL`` when it is another site's
    or this project serves it, else the admin's login if mounted (``startproject`` makes the
    admin but nothing at ``/accounts/login/``)."""
    from django.conf import settings
    from django.shortcuts import resolve_url
    from django.urls import NoReverseMatch, Resolver404, get_script_prefix, resolve, reverse

    wanted = str(resolve_url(settings.LOGIN_URL))
    if "://" in wanted:  # a single sign-on elsewhere
        return wanted
    try:
        resolve("/" + wanted.split("?", 1)[0].removeprefix(get_script_prefix()).lstrip("/"))
    except Resolver404:
        with contextlib.suppress(NoReverseMatch):
            return str(reverse("admin:login"))
    return wanted


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
        # at the first request: the settings and the Celery app are ready by then
        from django.conf import settings

        options = dict(getattr(settings, "CELERY_SINGLETON_LOCK_WEB_OPTIONS", {}))
        options.update(make_app_options)
        where = getattr(settings, "CELERY_SINGLETON_LOCK_WEB_APP", None)
        if where is None:
            from celery import current_app

            app = current_app._get_current_object()  # noqa: SLF001 - the app, not its proxy
        else:
            module, _, attribute = str(where).partition(":")
            if not attribute:
                raise ValueError(
                    f"CELERY_SINGLETON_LOCK_WEB_APP must be 'module:attribute', such as "
                    f"'proj.celery:app', got {where!r}"
                )
            app = getattr(importlib.import_module(module), attribute)
        return make_app(app, access=access, **options)

    # the page's own CSRF check applies, not Django's middleware
    @csrf_exempt  # type: ignore[untyped-decorator]  # django: unannotated
    def page(request: Any, sub: str = "") -> HttpResponse:
        # ALLOWED_HOSTS, whatever the middleware: a rebinding site's name is a 400 at once
        request.get_host()
        if not can_view(request):
            user = getattr(request, "user", None)
            if user is None or not user.is_authenticated:
                from django.contrib.auth.views import redirect_to_login

                return redirect_to_login(request.get_full_path(), login_url())
        post = request.method == "POST"
        form = {k: request.POST.get(k, "") for k in request.POST} if post else {}
        answer = web().handle_mounted({**request.META, REQUEST: request}, request.path, sub, form)
        response = HttpResponse(answer.body, status=answer.status)
        for header, value in answer.headers:
            if header == "Set-Cookie":  # several (CSRF, outcome): Django keeps one per name
                response.cookies.load(value)
            else:
                response.headers[header] = value
        return response

    subs = [path(sub, page, {"sub": sub}) for sub in ("lock", "release", "purge")]
    return [path("", page, name="celery_singleton_lock_locks"), *subs]


urlpatterns = make_urlpatterns()


def add_to_admin(
    site: Any = None,
    route: str = "locks/",
    can_view: Callable[[Any], bool] = is_staff,
    can_change: Callable[[Any], bool] | None = None,
    **make_app_options: Any,
) -> None:
    """Serve the page in the admin ``site`` (default ``admin.site``) at ``route`` under it,
    linked from the admin's index for the users ``can_view`` lets in. Call it in ``urls.py``
    before ``site.urls`` is read: the page's patterns go first, so the admin's catch-all view
    never hides them."""
    if site is None:
        from django.contrib import admin

        site = admin.site
    if getattr(site, "_celery_singleton_lock_added", False):  # urls.py imported again
        return
    site._celery_singleton_lock_added = True  # noqa: SLF001 - our own mark on the site
    patterns = make_urlpatterns(can_view, can_change, **make_app_options)
    site_urls, site_apps = site.get_urls, site.get_app_list

    def get_urls() -> list[Any]:
        return [path(route, include(patterns)), *site_urls()]

    def get_app_list(request: Any, app_label: str | None = None) -> list[Any]:
        listed = list(site_apps(request, app_label))
        if app_label is None and can_view(request):
            from django.urls import reverse

            url = reverse(f"{site.name}:celery_singleton_lock_locks")
            locks: dict[str, Any] = {"name": "Locks", "object_name": "Locks", "add_url": None}
            locks.update(admin_url=url, perms={"view": True}, view_only=True)
            app = {"name": "Celery locks", "app_label": "celery_singleton_lock", "app_url": url}
            listed.append({**app, "has_module_perms": True, "models": [locks]})
        return listed

    site.get_urls, site.get_app_list = get_urls, get_app_list
