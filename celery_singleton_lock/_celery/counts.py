"""Recent counts of duplicates, refusals and lost locks, per minute, in Redis: what the web page
shows of the last hour (read by :func:`celery_singleton_lock._ops.counts.recent_counts`).

A task pays one dict increment, only on a duplicate, refusal or lost-lock path; a daemon thread
per process (started at the first count) writes what was counted every :data:`FLUSH_INTERVAL`
seconds, one pipeline of ``HINCRBY`` + ``EXPIREAT`` per client: every key on its own, so it
works on Redis Cluster. Keys are ``<prefix>:counts:<epoch minute>`` hashes (field
``duplicates:<action>``, ``refusals:<reason>`` or ``lost``) that expire :data:`RETENTION_S`
after their minute: never a lock's ``<prefix>:{name}`` nor a limiter's ``<prefix>:rate:{name}``.
A flush that Redis fails keeps its counts for the next try (those of minutes older than the
retention are dropped: their keys would be gone already). A prefork child starts with an empty
buffer and no thread (its parent flushes its own); a worker process flushes at its shutdown.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import time
from collections import Counter
from typing import Any

__all__ = [
    "FLUSH_INTERVAL",
    "LOST",
    "RETENTION_S",
    "count",
    "counts_key",
    "flush",
    "pending",
]

log = logging.getLogger("celery_singleton_lock.counts")

#: seconds between two writes of a process's counts (while it has some)
FLUSH_INTERVAL = 1.0
#: longest wait between two tries while Redis keeps failing the write
MAX_BACKOFF = 60.0
#: how long a minute's hash lives after that minute ends
RETENTION_S = 2 * 3600
#: the field of a lock lost while its run held it
LOST = "lost"

#: (client id, prefix, epoch minute, field) -> count not yet written
_pending: Counter[tuple[int, str, int, str]] = Counter()
#: client id -> the client (kept while it has counts pending)
_clients: dict[int, Any] = {}
_mutex = threading.Lock()
_wake = threading.Condition(_mutex)
_thread: threading.Thread | None = None
#: the last write failed: the process's exit does not wait on a Redis that is down
_failing = False


def counts_key(prefix: str, minute: int) -> str:
    """The hash of the counts of epoch minute ``minute`` (Unix seconds // 60) under ``prefix``."""
    return f"{prefix}:counts:{minute}"


def count(task: Any, field: str) -> None:
    """Count one ``field`` (``duplicates:skipped``, ``refusals:rate``, :data:`LOST`) for
    ``task``, under its keys' prefix, unless its app's ``singleton_lock_counts`` is off. Never
    raises: a count is not worth failing a task for."""
    try:
        bound = task.locking.bound(task.app)
        if not bound.config.counts:
            return
        client = bound.config.client
        key = (id(client), bound.space.prefix, int(time.time() // 60), field)
    except Exception:  # a task without a lock config (a stub, an app being torn down)
        log.debug("%s not counted for %r", field, task, exc_info=True)
        return
    with _mutex:
        idle = not _pending  # the thread waits only while nothing is pending
        _pending[key] += 1
        _clients[key[0]] = client
        if _thread is None:
            _start()
        elif idle:
            _wake.notify()


def pending() -> dict[tuple[str, int, str], int]:
    """What this process has counted and not written yet: (prefix, minute, field) -> count."""
    with _mutex:
        merged: Counter[tuple[str, int, str]] = Counter()
        for (_, prefix, minute, field), n in _pending.items():
            merged[prefix, minute, field] += n
        return dict(merged)


def _start() -> None:
    """Start the flushing thread (with :data:`_mutex` held)."""
    global _thread
    _thread = threading.Thread(target=_run, name="celery-singleton-lock-counts", daemon=True)
    _thread.start()
    atexit.register(_at_exit)


def _run() -> None:
    me = threading.current_thread()
    backoff = FLUSH_INTERVAL
    while True:
        with _mutex:
            while not _pending and _thread is me:
                _wake.wait()
            if _thread is not me:  # replaced (a fork's child runs no copy of this loop)
                return
        time.sleep(backoff)
        backoff = FLUSH_INTERVAL if flush() else min(backoff * 2, MAX_BACKOFF)


def flush() -> bool:
    """Write what this process counted; whether every client's write went through (what one
    failed stays pending, logged on ``celery_singleton_lock.counts``)."""
    with _mutex:
        taken = dict(_pending)
        clients = dict(_clients)
        _pending.clear()
        _clients.clear()
    by_client: dict[int, list[tuple[str, int, str, int]]] = {}
    for (client_id, prefix, minute, field), n in taken.items():
        by_client.setdefault(client_id, []).append((prefix, minute, field, n))
    global _failing
    ok = True
    for client_id, rows in by_client.items():
        try:
            _write(clients[client_id], rows)
        except Exception as exc:
            ok = False
            log.warning(
                "could not write %d lock counts to Redis (%s: %s); kept for the next try",
                sum(row[3] for row in rows),
                type(exc).__name__,
                exc,
            )
            _keep(clients[client_id], rows)
    _failing = not ok
    return ok


def _at_exit() -> None:
    """At the interpreter's exit (a publisher's): write what is left, unless Redis failed the
    last write (the exit would wait on it)."""
    if _pending and not _failing:
        flush()


def _write(client: Any, rows: list[tuple[str, int, str, int]]) -> None:
    pipe = client.pipeline(transaction=False)
    for prefix, minute, field, n in rows:
        key = counts_key(prefix, minute)
        pipe.hincrby(key, field, n)
        pipe.expireat(key, (minute + 1) * 60 + RETENTION_S)
    pipe.execute()


def _keep(client: Any, rows: list[tuple[str, int, str, int]]) -> None:
    """Put back the counts of a failed write, but those whose minute's key would have expired
    by now (what keeps the buffer bounded while Redis is down)."""
    oldest = int(time.time() // 60) - RETENTION_S // 60
    with _mutex:
        for prefix, minute, field, n in rows:
            if minute >= oldest:
                _pending[id(client), prefix, minute, field] += n
                _clients[id(client)] = client


def on_shutdown(**_: Any) -> None:
    """``worker_process_shutdown`` / ``worker_shutdown``: write what is left now."""
    if _pending:
        flush()


def _after_fork_in_child() -> None:
    """A forked child counts from zero with a lock and no thread of its own (its parent
    writes what it had counted)."""
    global _mutex, _wake, _thread, _failing
    _pending.clear()
    _clients.clear()
    _mutex = threading.Lock()
    _wake = threading.Condition(_mutex)
    _thread = None
    _failing = False


os.register_at_fork(after_in_child=_after_fork_in_child)
