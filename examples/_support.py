"""What the examples share: plain-words output, checks, and where Redis comes from."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import redis

#: what did not go as described (an example exits 1 when this is not empty)
problems: list[str] = []


def say(text: str = "") -> None:
    print(text, flush=True)


def check(ok: bool, what: str) -> None:
    if not ok:
        problems.append(what)
        say(f"   UNEXPECTED: {what}")


def reachable(url: str) -> bool:
    client = redis.Redis.from_url(url, socket_connect_timeout=0.5, socket_timeout=2)
    try:
        client.ping()
        return True
    except redis.RedisError:
        return False
    finally:
        client.close()


@contextlib.contextmanager
def redis_url(embedded: bool, local: str | None = None) -> Iterator[str]:
    """Where the example runs: ``$REDIS_URL`` when it answers, else ``local`` (a server on
    this machine) when it answers, else a throw-away server of its own; the first line says
    which, and why."""
    url = os.environ.get("REDIS_URL")
    if url and not embedded:
        if reachable(url):
            say(f"Using the Redis at $REDIS_URL ({url}).")
            yield url
            return
        say(f"No Redis answered at $REDIS_URL ({url}); starting one of our own.")
    elif local and not embedded and reachable(local):
        say(f"Using the Redis at {local} ($REDIS_URL is not set; only this run's keys are used).")
        yield local
        return
    from celery_singleton_lock.testing import RedisServer

    with RedisServer() as server:
        say(f"Started a throw-away Redis on 127.0.0.1:{server.port} ({server.binary}).")
        yield server.url
