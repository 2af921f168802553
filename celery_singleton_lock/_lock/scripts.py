"""The Lua scripts, read once from the package and run through redis-py's public API.

The ``.lua`` files live in the repository's top-level ``lua/`` folder and are copied into the
wheel as ``celery_singleton_lock/lua/``; a source checkout (or an editable install) reads them
from ``lua/`` directly.

A call is ``client.evalsha``, and ``client.script_load`` then the same call again when the
server answers NOSCRIPT (a restarted, failed-over or flushed server), which is what redis-py's
own ``Script`` does. Not ``client.register_script``: its ``Script`` keeps its client, and the
lock must never keep a client alive that its user dropped (see :mod:`.runtime`). The script
cache lives in Redis, per server; nothing about it is kept here but the source and its SHA1.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from typing import Any

from redis.exceptions import NoScriptError

from .deadline import expired, time_left

__all__ = [
    "ACQUIRE",
    "CANCEL",
    "FORCE_RELEASE",
    "INSPECT",
    "META_RETENTION_MS",
    "PARK",
    "RECORD_IF_HELD",
    "RELEASE",
    "RENEW",
    "WAIT_CLAIM",
    "WAIT_END",
    "WAIT_MARK",
    "WAIT_PARK",
    "Script",
]

#: How long the meta hash (last fencing token, operator info) outlives a lock or its lease: an
#: argument of most scripts. It bounds the keys a released lock leaves behind to one hash that
#: expires after a minute.
META_RETENTION_MS = 60_000


def _read(filename: str) -> str:
    packaged = resources.files("celery_singleton_lock").joinpath("lua", filename)
    if packaged.is_file():
        return packaged.read_text(encoding="utf-8")
    checkout = Path(__file__).resolve().parents[2] / "lua" / filename
    if checkout.is_file():
        return checkout.read_text(encoding="utf-8")
    raise RuntimeError(
        f"celery_singleton_lock cannot find its Lua script {filename!r}: the installation is "
        "incomplete; reinstall the package (pip install --force-reinstall celery-singleton-lock)"
    )


class Script:
    """One Lua script: its source and SHA1, run by EVALSHA and loaded on NOSCRIPT."""

    __slots__ = ("idempotent", "name", "sha", "source")

    def __init__(self, filename: str, *, idempotent: bool) -> None:
        self.name = filename
        #: safe to send twice: each call carries a request id, or running it again changes
        #: nothing (redis-py's retry policy resends any command; this says which may be)
        self.idempotent = idempotent
        self.source = _read(filename)
        self.sha = hashlib.sha1(self.source.encode("utf-8")).hexdigest()

    def __call__(self, client: Any, keys: Sequence[str], args: Sequence[Any]) -> Any:
        # A call made once its operation's deadline has passed is not sent at all, whatever
        # the client's retry policy (a DeadlineRetry would refuse it too; redis-py's own would
        # send it and wait up to the socket timeout for nothing).
        left = time_left()
        if left is not None and left <= 0:
            raise expired()
        try:
            return client.evalsha(self.sha, len(keys), *keys, *args)
        except NoScriptError:
            # A restarted, failed-over or flushed server: load once, then run it again.
            client.script_load(self.source)
            return client.evalsha(self.sha, len(keys), *keys, *args)

    def queue(self, pipe: Any, keys: Sequence[str], args: Sequence[Any]) -> None:
        """Add a call to a pipeline; the caller reloads on NOSCRIPT (see :meth:`load`)."""
        pipe.evalsha(self.sha, len(keys), *keys, *args)

    def load(self, client: Any) -> None:
        """Load the script into ``client``'s server (after a pipeline met NOSCRIPT)."""
        client.script_load(self.source)

    def __repr__(self) -> str:
        return f"<Script {self.name} {self.sha[:8]}>"


ACQUIRE = Script("acquire.lua", idempotent=True)  # per request id
RELEASE = Script("release.lua", idempotent=True)  # per request id
RENEW = Script("renew.lua", idempotent=True)
INSPECT = Script("inspect.lua", idempotent=True)  # reads only
# Sent twice, it could free a lock taken in between by a new holder.
FORCE_RELEASE = Script("force_release.lua", idempotent=False)
PARK = Script("park.lua", idempotent=True)
CANCEL = Script("cancel.lua", idempotent=True)  # clears the request id it matched
RECORD_IF_HELD = Script("record_if_held.lua", idempotent=True)  # writes the same record again
WAIT_PARK = Script("wait_park.lua", idempotent=True)  # writes the same record again
WAIT_CLAIM = Script("wait_claim.lua", idempotent=True)  # a resend finds its own claim
WAIT_END = Script("wait_end.lua", idempotent=True)  # deletes only what is still there
WAIT_MARK = Script("wait_mark.lua", idempotent=True)  # writes the same mark again
