"""Recent counts of duplicates, refusals and lost locks, per minute, in Redis (the web page's
last hour). A task pays one dict increment; each app config's :class:`RecentCounter` thread
writes them every second as ``HINCRBY`` + ``EXPIREAT`` on ``<prefix>:counts:<epoch minute>``
hashes (one key each: fine on Redis Cluster). A failed write keeps its counts for the next try;
a forked child starts empty; workers write the rest at shutdown, :func:`close` at once.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import time
from collections import Counter
from typing import Any

log = logging.getLogger("celery_singleton_lock.counts")

#: seconds between two writes of a process's counts (while it has some)
FLUSH_INTERVAL = 1.0
#: longest wait between two tries while Redis keeps failing the write
MAX_BACKOFF = 60.0
#: how long a minute's hash lives after that minute ends
RETENTION_S = 2 * 3600
#: longest wait of :meth:`RecentCounter.close` for a write under way (bounded by the socket
#: timeout and redis-py's retries)
CLOSE_WAIT = 30.0
#: the field of a lock lost while its run held it
LOST = "lost"


def counts_key(prefix: str, minute: int) -> str:
    """The hash of the counts of epoch minute ``minute`` under ``prefix``."""
    return f"{prefix}:counts:{minute}"


def count(task: Any, field: str) -> None:
    """Count one ``field`` (``duplicates:skipped``, ``refusals:rate``, :data:`LOST`) for
    ``task`` unless ``singleton_lock_counts`` is off. Never raises."""
    try:
        bound = task.locking.bound(task.app)
        if bound.config.counts:
            bound.config.counter.add(bound.space.prefix, field)
    except Exception:  # a task without a lock config (a stub, an app being torn down)
        log.debug("%s not counted for %r", field, task, exc_info=True)


class RecentCounter:
    """The counts of one app config not written yet, and the thread that writes them."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self._reset()

    def _reset(self) -> None:
        #: (prefix, epoch minute, field) -> count not written yet
        self._pending: Counter[tuple[str, int, str]] = Counter()
        self._mutex = threading.Lock()
        self._wake = threading.Condition(self._mutex)
        self._thread: threading.Thread | None = None
        #: the last write failed: the process's exit does not wait on a Redis that is down
        self._failing = False
        self._pid = os.getpid()

    def add(self, prefix: str, field: str, n: int = 1) -> None:
        """Count ``n`` of ``field`` under ``prefix`` in the current minute."""
        if self._pid != os.getpid():
            # A forked child: the parent's buffer, thread and (maybe held) mutex are not its own.
            self._reset()
        key = (prefix, int(time.time() // 60), field)
        with self._mutex:
            idle = not self._pending  # the thread waits only while nothing is pending
            self._pending[key] += n
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="celery-singleton-lock-counts", daemon=True
                )
                self._thread.start()
                atexit.unregister(self._at_exit)  # once, however often the thread starts
                atexit.register(self._at_exit)
            elif idle:
                self._wake.notify()

    def close(self) -> bool:
        """Stop the writer thread (waiting up to :data:`CLOSE_WAIT` s for a write under way)
        and write what is pending; whether Redis took it (if not, it stays pending)."""
        if self._pid != os.getpid():
            self._reset()  # a forked child: the parent's thread and counts are not its own
        with self._mutex:
            thread, self._thread = self._thread, None
            self._wake.notify_all()
        if thread is not None and thread is not threading.current_thread():
            thread.join(CLOSE_WAIT)
        return self.flush()

    def flush(self) -> bool:
        """Write what was counted; whether Redis took it (else it stays pending, logged)."""
        with self._mutex:
            taken, self._pending = self._pending, Counter()
        if not taken:
            return True
        try:
            pipe = self.client.pipeline(transaction=False)
            for (prefix, minute, field), n in taken.items():
                key = counts_key(prefix, minute)
                pipe.hincrby(key, field, n)
                pipe.expireat(key, (minute + 1) * 60 + RETENTION_S)
            pipe.execute()
        except Exception as exc:
            log.warning(
                "could not write %d lock counts to Redis (%s: %s); kept for the next try",
                sum(taken.values()),
                type(exc).__name__,
                exc,
            )
            # put back but those whose key would have expired by now (a bounded buffer)
            oldest = int(time.time() // 60) - RETENTION_S // 60
            with self._mutex:
                for (prefix, minute, field), n in taken.items():
                    if minute >= oldest:
                        self._pending[prefix, minute, field] += n
            self._failing = True
            return False
        self._failing = False
        return True

    def _run(self) -> None:
        me = threading.current_thread()
        backoff = FLUSH_INTERVAL
        while True:
            with self._mutex:
                while not self._pending and self._thread is me:
                    self._wake.wait()
                # the interval between two writes, cut short by close()
                self._wake.wait_for(lambda: self._thread is not me, backoff)
                if self._thread is not me:  # closed (close() writes the rest) or replaced
                    return
            backoff = FLUSH_INTERVAL if self.flush() else min(backoff * 2, MAX_BACKOFF)

    def _at_exit(self) -> None:
        """At exit: write what is left, unless the last write failed (exit would wait)."""
        if self._pid == os.getpid() and self._pending and not self._failing:
            self.flush()
