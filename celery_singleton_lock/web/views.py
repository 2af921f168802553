"""The pages: the list, one lock, the release and purge confirmations and their POSTs, and the
error page. Query input is checked before Redis is read; a change is checked (access, CSRF,
token) before anything is freed, and logged naming who did it from where."""

from __future__ import annotations

import logging
from http import HTTPStatus
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urlencode

from jinja2 import Environment, PackageLoader, StrictUndefined

from . import csrf, outcome, rows
from .access import TokenAccess
from .data import DIGEST, LIMITER, STATES, matches
from .guard import printable
from .messages import Request, Response

if TYPE_CHECKING:
    from .app import LocksWeb

__all__ = ["BadRequest", "error_page", "listing", "lock_page"]

log = logging.getLogger("celery_singleton_lock.web")

_templates = Environment(
    loader=PackageLoader("celery_singleton_lock.web", "templates"),
    autoescape=True,
    undefined=StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
)


class BadRequest(ValueError):
    """A query the page cannot answer (400), its message naming the parameter."""


class NotHeld(LookupError):
    """A key the page finds no lock of (404)."""


def _key(web: LocksWeb, params: dict[str, str], usage: str) -> str:
    """The key ``params`` name: ``key``, or ``d``, the digest a long key is linked by."""
    key, short = params.get("key", ""), params.get("d", "")
    if key:
        return key
    if short:
        if len(short) != DIGEST or short.strip("0123456789abcdef"):
            raise BadRequest(f"d must be {DIGEST} hex digits (a long key's digest), got {short!r}")
        found = web.source.key_of_digest(short)
        if found is None:
            raise NotHeld(f"no held lock has the digest {short}")
        return found
    raise BadRequest(f"key is missing: {usage}")


def _render(status: int, template: str, **context: Any) -> Response:
    body = _templates.get_template(template).render(**context).encode("utf-8")
    return Response(status, body, [("Content-Type", "text/html; charset=utf-8")])


def error_page(status: int, message: str) -> Response:
    """A page saying what went wrong in ``#error``."""
    return _render(status, "error.html", title=HTTPStatus(status).phrase, message=message)


def _filters(query: dict[str, str]) -> tuple[str, str]:
    q, state = query.get("q", "").strip(), query.get("state", "")
    if state and state not in STATES:
        raise BadRequest(f"state must be one of {', '.join(STATES)} (or empty), got {state!r}")
    return q, state


def _paging(query: dict[str, str]) -> tuple[int, bool]:
    page_text, sort = query.get("page", "1") or "1", query.get("sort", "age") or "age"
    # (int() of thousands of digits is refused by Python itself: a 500 before this check)
    if not (page_text.isascii() and page_text.isdecimal()) or len(page_text) > 9:
        raise BadRequest(f"page must be a whole number >= 1, got {page_text[:20]!r}")
    if int(page_text) < 1:
        raise BadRequest(f"page must be a whole number >= 1, got {page_text!r}")
    if sort not in ("age", "-age"):
        raise BadRequest(
            f"sort must be 'age' (oldest first) or '-age' (newest first), got {sort!r}"
        )
    return int(page_text), sort == "-age"


def listing(web: LocksWeb, request: Request, token: str) -> Response:
    """``GET ./``: the locks (filtered, sorted, one page), limiters, beat leaders, counts."""
    q, state = _filters(request.query)
    page, newest_first = _paging(request.query)
    shared = web.source.shared.get()
    found = web.source.read(q) if state != LIMITER else shared
    views = [] if state == LIMITER else found.pick(q, state, newest_first)
    pages = max(1, -(-len(views) // web.page_size))
    if page > pages:
        raise BadRequest(f"page must be a whole number from 1 to {pages}, got {page}")
    shown = views[(page - 1) * web.page_size : page * web.page_size]
    can_change = web.access.can_change(request.environ)
    keep = {k: v for k, v in (("q", q), ("state", state)) if v}
    if newest_first:
        keep["sort"] = "-age"

    def at(n: int) -> str:
        return "./?" + urlencode({**keep, "page": n})

    limiters = [
        rows.limiter(prefix, r)
        for prefix, r in shared.limiters
        if not q or q.lower() in rows.limiter_key(prefix, r).lower()
    ]
    # A read that took long reloads less often: open tabs must not keep Redis busy.
    refresh = max(web.refresh, min(60, round(web.source.shared.took * 20))) if web.refresh else 0
    done = request.cookies.get(outcome.COOKIE)
    message = rows.message(web.outcomes.read(done)) if done else None
    answer = _render(
        200,
        "list.html",
        refresh=refresh,
        locks=[rows.lock(v) for v in shown],
        limiters=[] if state and state != LIMITER else limiters,
        leaders=[rows.leader(v) for v in shared.leaders],
        counts=shared.counts,
        total=len(views),
        complete=found.complete,
        max_locks=web.source.max_locks,
        page=page,
        pages=pages,
        prev_href=at(page - 1) if page > 1 else None,
        next_href=at(page + 1) if page < pages else None,
        q=q,
        state=state,
        sort="-age" if newest_first else "age",
        states=STATES,
        can_change=can_change,
        purge_href="purge?" + urlencode(keep) if keep else "purge",
        message=message,
    )
    if done:  # shown once
        answer.headers.append(web.outcomes.clear(request.mount))
    return answer


def lock_page(web: LocksWeb, request: Request, token: str) -> Response:
    """``GET ./lock?key=KEY``: everything known of one lock (404 when it is not held)."""
    key = _key(web, request.query, "lock?key=prefix:{name}")
    found = web.source.lock(key)
    if found is None:
        return error_page(HTTPStatus.NOT_FOUND, f"{key} is not held")
    view, permits = found
    result = web.source.result_state(view)
    link = None
    if web.link_pattern and view.holder and view.task:
        link = web.link_pattern.format(task_id=quote(view.holder, safe=""))
    return _render(
        200,
        "lock.html",
        fields=rows.fields(view, result),
        link=link,
        permits=[rows.lock(p) for p in permits],
        can_change=web.access.can_change(request.environ),
        release_href="release?" + urlencode(rows.key_query(view.key)),
    )


def _refusal(web: LocksWeb, request: Request, posted: bool) -> Response | None:
    """403 when this request may not change (or, ``posted``, its form fails a check); 429
    while wrong tokens have closed the gate (the token is then not compared at all)."""
    access, environ = web.access, request.environ
    status = HTTPStatus.FORBIDDEN
    why = None if access.can_change(environ) else "you may not release or purge locks"
    if why is None and posted:
        why = csrf.check(
            request.cookies.get(csrf.COOKIE), request.form,
            lambda origin: web.allows_origin(request, origin), request.origin, request.referer,
        )  # fmt: skip
        wait = access.throttle.wait_left() if isinstance(access, TokenAccess) else 0.0
        if why is None and wait > 0:
            status = HTTPStatus.TOO_MANY_REQUESTS
            why = f"too many wrong tokens: try again in {wait:.0f} s"
        elif why is None and access.needs_token and not access.check_token(environ, request.form):
            why = "the token is missing or wrong"
    if why is None:
        return None
    if posted:
        web.refusals.refused(
            f"refused a {printable(request.path)} by {access.actor(environ)} "
            f"{web.where(request)}: {why}"
        )
    return error_page(status, why)


def release_confirm(web: LocksWeb, request: Request, token: str) -> Response:
    """``GET ./release?key=KEY``: the confirm form naming the key, task and holder."""
    refused = _refusal(web, request, posted=False)
    if refused is not None:
        return refused
    key = _key(web, request.query, "release?key=prefix:{name}")
    limiter = web.source.limiter_of(key)
    found = None if limiter is not None else web.source.lock(key)
    if limiter is None and found is None:
        return error_page(HTTPStatus.NOT_FOUND, f"{key} is not held")
    view = found[0] if found else None
    holder = (view.holder or "") if view else ""
    return _render(
        200,
        "confirm.html",
        action="release",
        key=key,
        view=view,
        hidden={**rows.key_query(key), "holder": holder, "csrf": token},
        needs_token=web.access.needs_token,
    )


def _done(web: LocksWeb, request: Request, code: str, detail: str) -> Response:
    """303 to the list, the outcome in a short-lived signed cookie (see :mod:`.outcome`)."""
    cookie = web.outcomes.cookie(code, detail, request.mount, request.secure)
    return Response(HTTPStatus.SEE_OTHER, b"", [("Location", "./"), cookie])


def release_post(web: LocksWeb, request: Request) -> Response:
    """``POST ./release``: free the lock (or reset the limiter), log who did it, 303."""
    refused = _refusal(web, request, posted=True)
    if refused is not None:
        return refused
    key, holder = _key(web, request.form, "the form's key field"), request.form.get("holder", "")
    result = web.source.release(key, holder or None)
    log.warning(
        "%s by %s %s: %s%s",
        result, web.access.actor(request.environ), web.where(request), printable(key),
        f" (held by {printable(holder)})" if holder else "",
    )  # fmt: skip
    return _done(web, request, result, key)


def purge_confirm(web: LocksWeb, request: Request, token: str) -> Response:
    """``GET ./purge?q=..&state=..``: the confirm form naming how many locks match."""
    refused = _refusal(web, request, posted=False)
    if refused is not None:
        return refused
    q, state = _filters(request.query)
    found = web.source.read(q, fresh=True)
    count = 0 if state == LIMITER else sum(matches(v, q, state) for v in found.locks)
    hidden = {"q": q, "state": state, "csrf": token}
    return _render(
        200,
        "confirm.html",
        action="purge",
        count=count,
        complete=found.complete,
        max_locks=web.source.max_locks,
        q=q,
        state=state,
        hidden=hidden,
        needs_token=web.access.needs_token,
    )


def purge_post(web: LocksWeb, request: Request) -> Response:
    """``POST ./purge``: free every lock the filter matches now, log who did it, 303."""
    refused = _refusal(web, request, posted=True)
    if refused is not None:
        return refused
    q, state = _filters(request.form)
    views = [] if state == LIMITER else web.source.read(q, fresh=True).locks
    freed = web.source.purge([v for v in views if matches(v, q, state)], state)
    log.warning(
        "purged %d lock(s) by %s %s (filter q=%s state=%s)",
        freed, web.access.actor(request.environ), web.where(request), printable(repr(q)),
        printable(repr(state)),
    )  # fmt: skip
    return _done(web, request, "purged", str(freed))
