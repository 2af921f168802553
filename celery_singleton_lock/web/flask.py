"""The locks page in a Flask app, behind the app's own login (docs: "The locks page")."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import flask

from .access import CallableAccess
from .app import make_app

__all__ = ["blueprint"]


def blueprint(
    celery_app: Any,
    *,
    can_view: Callable[[], bool],
    can_change: Callable[[], bool] | None = None,
    actor: Callable[[], str] | None = None,
    name: str = "celery_singleton_lock",
    **make_app_options: Any,
) -> flask.Blueprint:
    """A blueprint serving the locks page of ``celery_app`` (``make_app_options``: those of
    :func:`~celery_singleton_lock.web.make_app` but ``access``). ``can_view``, ``can_change``
    (default: ``can_view``) and ``actor`` take no argument: they run in Flask's request
    context (``flask.session``, flask-login's ``current_user``). Set the app's
    ``TRUSTED_HOSTS`` to the names the site is served at."""
    if not callable(can_view):
        raise TypeError(f"can_view must be a callable of no argument, got {can_view!r}")
    if "access" in make_app_options:
        raise TypeError("give can_view, can_change and actor, not access")
    change = can_change or can_view
    access = CallableAccess(
        lambda environ: can_view(),
        lambda environ: change(),
        None if actor is None else (lambda environ: actor()),
    )
    web = make_app(celery_app, access=access, **make_app_options)
    bp = flask.Blueprint(name, __name__)

    def page(path: str = "") -> flask.Response:
        request = flask.request
        # TRUSTED_HOSTS, when set: a rebinding site's name is a 400 before anything is read
        request.host  # noqa: B018 - read for its check
        form = dict(request.form.items()) if request.method == "POST" else {}
        answer = web.handle_mounted(request.environ, request.path, path, form)
        return flask.Response(answer.body, answer.status, answer.headers)

    methods = ["GET", "HEAD", "POST"]
    bp.add_url_rule("/", "page", page, methods=methods)
    bp.add_url_rule("/<any(lock, release, purge):path>", "sub", page, methods=methods)
    return bp
