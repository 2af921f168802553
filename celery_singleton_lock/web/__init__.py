"""A web page of the locks (the ``web`` extra): what ``celery locks list`` shows, refreshed;
a lock's page; release and purge behind a confirmation. Standalone: ``celery -A proj locks
web``; in Flask: :func:`celery_singleton_lock.web.flask.blueprint`; in Django:
``include("celery_singleton_lock.web.django")``; any WSGI server: :func:`make_app`."""

from __future__ import annotations

try:
    import jinja2  # noqa: F401 - checked here so the message names the extra
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    from .._errors import install_hint

    raise ImportError(f"celery_singleton_lock.web needs jinja2: {install_hint('web')}") from exc

from .access import Access, CallableAccess, TokenAccess
from .app import LocksWeb, make_app
from .views import Request, Response

__all__ = ["Access", "CallableAccess", "LocksWeb", "Request", "Response", "TokenAccess", "make_app"]
