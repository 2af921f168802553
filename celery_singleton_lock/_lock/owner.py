"""Default owner tokens: unique per process and thread, and new in a forked child."""

from __future__ import annotations

import itertools
import os
import socket
import threading
import uuid

_local = threading.local()
_process_token = uuid.uuid4().hex[:12]
_request_ids = itertools.count(1)
#: the OS reuses a thread id as soon as its thread ends, and a new thread must not inherit the
#: token (and the holds) of one that is gone
_thread_numbers = itertools.count(1)


def after_fork_in_child() -> None:
    global _process_token, _request_ids
    _process_token = uuid.uuid4().hex[:12]
    _request_ids = itertools.count(1)


def default_owner() -> str:
    """The calling thread's owner token, ``host:pid:token:thread-n``: ``n`` is never reused, and
    ``token`` is new in a forked child, so a child never holds its parent's locks."""
    token: str | None = getattr(_local, "token", None)
    if token is None or _local.process != _process_token:
        thread = f"{threading.get_ident()}-{next(_thread_numbers)}"
        token = f"{socket.gethostname()}:{os.getpid()}:{_process_token}:{thread}"
        _local.token = token
        _local.process = _process_token
    return token


def new_request_id() -> str:
    """An id unique to one call (an acquire, so a resend is recognised in Redis; or a run
    token): the process's random token and a counter, cheaper than a uuid4 and as unique."""
    return f"{_process_token}:{next(_request_ids)}"


new_run_token = new_request_id
