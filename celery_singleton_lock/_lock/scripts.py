"""The Lua scripts, loaded once from the package and run by EVALSHA with a NOSCRIPT fallback.

The ``.lua`` files live in the repository's top-level ``lua/`` folder and are copied into the
wheel as ``celery_singleton_lock/lua/``; a source checkout (or an editable install) reads them
from ``lua/`` directly.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from typing import Any

from redis.exceptions import NoScriptError

from . import connection

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
        #: safe to send twice (see connection.execute): each call carries a request id, or
        #: running it again changes nothing
        self.idempotent = idempotent
        self.source = _read(filename)
        self.sha = hashlib.sha1(self.source.encode("utf-8")).hexdigest()

    def __call__(self, client: Any, keys: Sequence[str], args: Sequence[Any]) -> Any:
        # What client.evalsha() does, minus the calls that only forward their arguments, and on
        # the thread's own connection where it can be (connection.py): every acquire's and release's
        # hot path.
        try:
            return connection.execute(
                client, "EVALSHA", self.sha, len(keys), *keys, *args, resend=self.idempotent
            )
        except NoScriptError:
            # A restarted, failed-over or flushed server: load once, then run it again.
            client.script_load(self.source)
            return connection.execute(
                client, "EVALSHA", self.sha, len(keys), *keys, *args, resend=self.idempotent
            )

    def queue(self, pipe: Any, keys: Sequence[str], args: Sequence[Any]) -> None:
        """Add a call to a pipeline; the caller reloads on NOSCRIPT (see :meth:`load`)."""
        pipe.evalsha(self.sha, len(keys), *keys, *args)

    def load(self, client: Any) -> None:
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
