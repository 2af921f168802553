"""A request (from a WSGI environ, or handed over by Flask or Django), its answer, and the
pages. Query input is checked before Redis is read; a change, checked before it comes here
(:func:`.access.change_refused`), is logged naming who did it from where."""

from __future__ import annotations

import contextlib
import logging
from http import HTTPStatus
from http.cookies import CookieError, SimpleCookie
from typing import TYPE_CHECKING, Any, NamedTuple
from urllib.parse import parse_qsl, quote, urlencode

from jinja2 import Environment, PackageLoader, StrictUndefined

from .._lock import RateState
from .._ops.locks import LockView, limiter_row
from .access import OUTCOME_COOKIE, cookie, printable, where
from .data import BEAT, DIGEST, LIMITER, STATES, digest, matches

if TYPE_CHECKING:
    from .app import LocksWeb

__all__ = ["MAX_FORM_BYTES", "BadRequest", "NotHeld", "Request", "Response", "error_page"]

log = logging.getLogger("celery_singleton_lock.web")

_templates = Environment(
    loader=PackageLoader("celery_singleton_lock.web", "templates"),
    autoescape=True,
    undefined=StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
)
#: a confirm form has a few hundred bytes: a larger one is refused
MAX_FORM_BYTES = 64 * 1024
#: a longer key is linked by its digest (a URL must stay short enough to send)
LONG_KEY = 256


class BadRequest(ValueError):
    """A query the page cannot answer (400), its message naming the parameter."""


class NotHeld(LookupError):
    """A key the page finds no lock of (404)."""


class Response(NamedTuple):
    """One answer: a status, a body and headers."""

    status: int
    body: bytes
    headers: list[tuple[str, str]]


def _read_form(environ: dict[str, Any]) -> tuple[dict[str, str], tuple[int, str] | None]:
    if environ.get("REQUEST_METHOD") != "POST":
        return {}, None
    given = str(environ.get("CONTENT_LENGTH") or "0").strip()
    if not (given.isascii() and given.isdecimal()) or len(given) > 12:
        return {}, (HTTPStatus.BAD_REQUEST, "the Content-Length is not a number of bytes")
    length = int(given)
    if length > MAX_FORM_BYTES:
        return {}, (
            HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
            f"the form has {length} bytes, more than the {MAX_FORM_BYTES} a confirm form may "
            "have: a long key is released through its link (which names it by a digest)",
        )
    body = environ["wsgi.input"].read(length).decode("utf-8", "replace") if length else ""
    return dict(parse_qsl(body, keep_blank_values=True)), None


class Request:
    """One request, read from a WSGI ``environ``; ``path`` (below the mount), ``mount`` (ends
    with "/": the cookies' path) and ``form`` given when Flask or Django routed and read it."""

    def __init__(
        self,
        environ: dict[str, Any],
        path: str | None = None,
        mount: str | None = None,
        form: dict[str, str] | None = None,
    ) -> None:
        get = environ.get
        self.environ = environ
        self.method = str(get("REQUEST_METHOD", "GET")).upper()
        self.path = get("PATH_INFO", "").lstrip("/") if path is None else path
        self.mount = get("SCRIPT_NAME", "").rstrip("/") + "/" if mount is None else mount
        self.query = dict(parse_qsl(get("QUERY_STRING", ""), keep_blank_values=True))
        self.host: str = get("HTTP_HOST") or get("SERVER_NAME", "")
        self.origin: str = get("HTTP_ORIGIN", "")
        self.referer: str = get("HTTP_REFERER", "")
        self.remote: str = get("REMOTE_ADDR", "")
        self.secure = get("wsgi.url_scheme") == "https"
        self.cookies: dict[str, str] = {}
        # another app's malformed cookie: ours is then missing (a new one is set), not fatal
        with contextlib.suppress(CookieError):
            self.cookies = {k: m.value for k, m in SimpleCookie(get("HTTP_COOKIE", "")).items()}
        self.form_problem: tuple[int, str] | None = None
        if form is None:
            form, self.form_problem = _read_form(environ)
        self.form = form


def filters(query: dict[str, str]) -> tuple[str, str]:
    q, state = query.get("q", "").strip(), query.get("state", "")
    if state and state not in STATES:
        raise BadRequest(f"state must be one of {', '.join(STATES)} (or empty), got {state!r}")
    return q, state


def duration(seconds: float | None) -> str:
    """``seconds`` as "42.0 s", "3 m 05 s" or "2 h 03 m"; "-" unknown, "none" no lease (-1)."""
    if seconds is None:
        return "-"
    if seconds < 0:
        return "none"
    if seconds < 60:
        return f"{seconds:.1f} s"
    whole = int(seconds)
    if whole < 3600:
        return f"{whole // 60} m {whole % 60:02d} s"
    return f"{whole // 3600} h {whole % 3600 // 60:02d} m"


def _text(value: Any) -> str:
    return "-" if value is None or value == "" else str(value)


def key_query(key: str) -> dict[str, str]:
    """How a link names ``key``: itself, or when long, its digest (``d``)."""
    return {"key": key} if len(key) <= LONG_KEY else {"d": digest(key)}


_templates.globals["href"] = lambda page, key: page + "?" + urlencode(key_query(key))


def _lock_row(view: LockView) -> dict[str, Any]:
    names = ("task", "holder", "host", "pid", "slots", "fence")
    row = {name: _text(getattr(view, name)) for name in names}
    row.update(key=view.key, app=view.name[len(BEAT) :], state=view.state or "held")
    row.update(age=duration(view.age_s), lease=duration(view.lease_s))
    row["age_s"] = "" if view.age_s is None else f"{view.age_s:.3f}"
    return row


def _limiter_row(prefix: str, state: RateState) -> dict[str, Any]:
    row = limiter_row(state, prefix)
    shown = {name: _text(row[name]) for name in ("key", "used", "rule", "waiting")}
    return {**shown, "next-free": duration(state.next_free), "paused": duration(row["paused"])}


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


def _render(template: str, status: int = 200, **context: Any) -> Response:
    body = _templates.get_template(template).render(**context).encode("utf-8")
    return Response(status, body, [("Content-Type", "text/html; charset=utf-8")])


def error_page(status: int, message: str) -> Response:
    """A page saying what went wrong in ``#error``."""
    return _render("error.html", status, title=HTTPStatus(status).phrase, message=message)


def _confirm(web: LocksWeb, token: str, hidden: dict[str, str], **context: Any) -> Response:
    """A confirm form, its POST to carry ``hidden``, the CSRF token and, if needed, a token."""
    hidden["csrf"] = token
    return _render("confirm.html", hidden=hidden, needs_token=web.access.needs_token, **context)


def listing(web: LocksWeb, request: Request, token: str) -> Response:
    """``GET ./``: a page of the locks, filtered and sorted; limiters, beat leaders, counts."""
    q, state = filters(request.query)
    page_text = request.query.get("page", "1") or "1"
    sort = request.query.get("sort", "age") or "age"
    # (int() of thousands of digits is refused by Python itself: a 500 before this check)
    whole = page_text.isascii() and page_text.isdecimal() and len(page_text) <= 9
    if not whole or int(page_text) < 1:
        raise BadRequest(f"page must be a whole number >= 1, got {page_text[:20]!r}")
    if sort not in ("age", "-age"):
        raise BadRequest(
            f"sort must be 'age' (oldest first) or '-age' (newest first), got {sort!r}"
        )
    page, newest_first = int(page_text), sort == "-age"
    shared = web.source.shared.get()
    found = web.source.read(q) if state != LIMITER else shared
    views = [] if state == LIMITER else found.pick(q, state, newest_first)
    pages = max(1, -(-len(views) // web.page_size))
    if page > pages:
        raise BadRequest(f"page must be a whole number from 1 to {pages}, got {page}")
    shown = views[(page - 1) * web.page_size : page * web.page_size]
    keep = {k: v for k, v in (("q", q), ("state", state)) if v}
    if newest_first:
        keep["sort"] = "-age"
    limiters = [_limiter_row(prefix, r) for prefix, r in shared.limiters]
    limiters = [r for r in limiters if q.lower() in r["key"].lower()]
    # a slow read reloads less often: open tabs must not keep Redis busy
    refresh = max(web.refresh, min(60, round(web.source.shared.took * 20))) if web.refresh else 0
    done = request.cookies.get(OUTCOME_COOKIE)
    answer = _render(
        "list.html",
        refresh=refresh,
        locks=[_lock_row(v) for v in shown],
        limiters=[] if state and state != LIMITER else limiters,
        leaders=[_lock_row(v) for v in shared.leaders],
        counts=shared.counts,
        total=len(views),
        complete=found.complete,
        max_locks=web.source.max_locks,
        page=page,
        pages=pages,
        prev_href="./?" + urlencode({**keep, "page": page - 1}) if page > 1 else None,
        next_href="./?" + urlencode({**keep, "page": page + 1}) if page < pages else None,
        q=q,
        state=state,
        sort=sort,
        states=STATES,
        can_change=web.access.can_change(request.environ),
        purge_href="purge?" + urlencode(keep) if keep else "purge",
        message=web.outcomes.banner(done) if done else None,
    )
    if done:  # shown once
        answer.headers.append(("Set-Cookie", cookie(OUTCOME_COOKIE, "", request.mount, False, 0)))
    return answer


def lock_page(web: LocksWeb, request: Request, token: str) -> Response:
    """``GET ./lock?key=KEY``: everything known of one lock (404 when it is not held)."""
    key = _key(web, request.query, "lock?key=prefix:{name}")
    found = web.source.lock(key)
    if found is None:
        return error_page(HTTPStatus.NOT_FOUND, f"{key} is not held")
    view, permits = found
    link = None
    if web.link_pattern and view.holder and view.task:
        link = web.link_pattern.format(task_id=quote(view.holder, safe=""))
    fields = _lock_row(view)
    fields.update(holds=str(view.hold_count), result=_text(web.source.result_state(view)))
    return _render(
        "lock.html",
        fields=fields,
        link=link,
        permits=[_lock_row(p) for p in permits],
        can_change=web.access.can_change(request.environ),
    )


def release_confirm(web: LocksWeb, request: Request, token: str) -> Response:
    """``GET ./release?key=KEY``: the confirm form naming the key, task and holder."""
    key = _key(web, request.query, "release?key=prefix:{name}")
    limiter = web.source.limiter_of(key)
    found = None if limiter is not None else web.source.lock(key)
    if limiter is None and found is None:
        return error_page(HTTPStatus.NOT_FOUND, f"{key} is not held")
    view = found[0] if found else None
    hidden = {**key_query(key), "holder": (view.holder or "") if view else ""}
    return _confirm(web, token, hidden, action="release", key=key, view=view)


def _done(web: LocksWeb, request: Request, code: str, detail: str, did: str, what: str) -> Response:
    """Log the change (``did`` by who, from where, ``what``); 303 to the list, the outcome
    in a short-lived signed cookie."""
    log.warning("%s by %s %s%s", did, web.access.actor(request.environ), where(request), what)
    done = web.outcomes.cookie(code, detail, request.mount, request.secure)
    return Response(HTTPStatus.SEE_OTHER, b"", [("Location", "./"), ("Set-Cookie", done)])


def release_post(web: LocksWeb, request: Request) -> Response:
    """``POST ./release``: free the lock (or reset the limiter), log who did it, 303."""
    key, holder = _key(web, request.form, "the form's key field"), request.form.get("holder", "")
    result = web.source.release(key, holder or None)
    held = f" (held by {printable(holder)})" if holder else ""
    return _done(web, request, result, key, result, f": {printable(key)}{held}")


def purge_confirm(web: LocksWeb, request: Request, token: str) -> Response:
    """``GET ./purge?q=..&state=..``: the confirm form naming how many locks match."""
    q, state = filters(request.query)
    found = web.source.read(q, fresh=True)
    count = 0 if state == LIMITER else sum(matches(v, q, state) for v in found.locks)
    return _confirm(
        web,
        token,
        {"q": q, "state": state},
        action="purge",
        count=count,
        complete=found.complete,
        max_locks=web.source.max_locks,
        q=q,
        state=state,
    )


def purge_post(web: LocksWeb, request: Request) -> Response:
    """``POST ./purge``: free every lock the filter matches now, log who did it, 303."""
    q, state = filters(request.form)
    views = [] if state == LIMITER else web.source.read(q, fresh=True).locks
    freed = web.source.purge([v for v in views if matches(v, q, state)], state)
    what = f" (filter q={printable(repr(q))} state={printable(repr(state))})"
    return _done(web, request, "purged", str(freed), f"purged {freed} lock(s)", what)
