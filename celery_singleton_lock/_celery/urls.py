"""Where the locks' Redis is, as a setting names it: the schemes a Redis URL may have, and a
``sentinel://`` list read as Celery's broker reads it."""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

__all__ = ["REDIS_SCHEMES", "SENTINEL_PORT", "SentinelURL", "parse_sentinel_url", "scheme_of"]

REDIS_SCHEMES = ("redis", "rediss", "unix", "sentinel")


def scheme_of(url: object) -> str:
    """A URL shown without its host, credentials or path (``amqp://…``), for errors."""
    if not url or not isinstance(url, str):
        return "none configured"
    return url.split(":", 1)[0] + "://…"


#: the port of a ``sentinel://`` URL that gives none (Sentinel's, and kombu's default)
SENTINEL_PORT = 26379


@dataclass(frozen=True)
class SentinelURL:
    """What a ``sentinel://`` URL list says: the sentinels to ask, in order, and the user,
    password and database of the master's connections."""

    sentinels: tuple[tuple[str, int], ...]
    username: str | None
    password: str | None
    db: int


def parse_sentinel_url(url: str, name: str) -> SentinelURL:
    """Read ``sentinel://s1:26379;sentinel://s2:26379/0`` as Celery's broker (kombu's Redis
    transport) reads it: every ``;``-separated URL names a sentinel (empty ones, as after a
    trailing ``;``, are skipped), and the user, password and database come from the first
    URL (``sentinel://user:pw@s1:26379/2``); like the broker's, they are the master's, never
    the sentinels' (those take ``sentinel_kwargs``). ``name`` is where the URL came from, for
    the errors: a URL of another scheme in the list (kombu would drop it from the sentinels
    without a word), a later URL with a user, password or database that differs from the
    first's (kombu would use the first's), a port or database that is no number."""
    parts = [part.strip() for part in url.split(";")]
    parts = [part for part in parts if part]
    if not parts:
        raise ValueError(f"{name} names no sentinel: give 'sentinel://host:26379;...'")
    sentinels: list[tuple[str, int]] = []
    first: tuple[str | None, str | None, int | None] | None = None
    for part in parts:
        parsed = urlsplit(part)
        if parsed.scheme.lower() != "sentinel":
            raise ValueError(
                f"{name} mixes {scheme_of(part)} into a sentinel:// list: every URL separated "
                "by ';' must be a sentinel:// URL (give the locks a URL of their own in "
                "singleton_lock_redis_url if the broker's cannot be one)"
            )
        try:
            port = parsed.port or SENTINEL_PORT
        except ValueError:
            raise ValueError(
                f"{name}: the port of sentinel {parsed.hostname or '?'} is not a number"
            ) from None
        host = parsed.hostname or "127.0.0.1"
        sentinels.append((host, port))
        path = parsed.path.strip("/")
        try:
            db = int(path) if path else None
        except ValueError:
            raise ValueError(
                f"{name}: the database of sentinel {host}:{port} must be a number "
                "(sentinel://host:26379/0)"
            ) from None
        given = (
            unquote(parsed.username) if parsed.username else None,
            unquote(parsed.password) if parsed.password else None,
            db,
        )
        if first is None:
            first = given
        elif any(
            value is not None and value != wanted
            for value, wanted in zip(given, first, strict=True)
        ):
            raise ValueError(
                f"{name}: sentinel {host}:{port} gives another user, password or database "
                "than the first URL (the broker uses the first URL's for the master): give "
                "them in the first URL only, or the same in every URL"
            )
    username, password, db = first or (None, None, None)
    return SentinelURL(tuple(sentinels), username, password, db or 0)
