"""The Lua scripts of lua/ (``celery_singleton_lock/lua/`` in the wheel), run by EVALSHA and
loaded on NOSCRIPT; not redis-py's ``register_script``, whose ``Script`` keeps its client alive.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from typing import Any

from redis.exceptions import NoScriptError

from .deadline import expired, time_left

#: one script call's keys and arguments
Call = tuple[Sequence[str], Sequence[Any]]

#: How long the meta hash (fence, request ids, void marks) outlives a lock or its lease, ms.
META_RETENTION_MS = 60_000


def _read(filename: str) -> str:
    packaged = resources.files("celery_singleton_lock").joinpath("lua", filename)
    if packaged.is_file():
        return packaged.read_text(encoding="utf-8")
    checkout = Path(__file__).resolve().parents[2] / "lua" / filename
    if checkout.is_file():
        return checkout.read_text(encoding="utf-8")
    from .._errors import install_hint

    raise RuntimeError(
        f"celery_singleton_lock cannot find its Lua script {filename!r}: the installation is "
        f"incomplete; reinstall the package: {install_hint(pip='pip install --force-reinstall')}"
    )


class Script:
    """One Lua script of lua/; not sent once the current operation's deadline has passed."""

    __slots__ = ("name", "sha", "source")

    def __init__(self, filename: str) -> None:
        self.name = filename
        self.source = _read(filename)
        self.sha = hashlib.sha1(self.source.encode("utf-8")).hexdigest()

    def __call__(self, client: Any, keys: Sequence[str], args: Sequence[Any]) -> Any:
        left = time_left()
        if left is not None and left <= 0:
            raise expired()
        try:
            return client.evalsha(self.sha, len(keys), *keys, *args)
        except NoScriptError:
            client.script_load(self.source)
            return client.evalsha(self.sha, len(keys), *keys, *args)

    def pipelined(self, client: Any, calls: Sequence[Call]) -> list[Any]:
        """One call per ``(keys, args)`` in one pipeline; a reply may be its call's error."""

        def send() -> list[Any]:
            pipe = client.pipeline(transaction=False)
            for keys, args in calls:
                pipe.evalsha(self.sha, len(keys), *keys, *args)
            replies: list[Any] = pipe.execute(raise_on_error=False)
            return replies

        replies = send()
        if any(isinstance(reply, NoScriptError) for reply in replies):
            client.script_load(self.source)
            replies = send()
        return replies

    def __repr__(self) -> str:
        return f"<Script {self.name} {self.sha[:8]}>"


# Every script is safe to resend but force_release, which could free a lock taken in between.
ACQUIRE = Script("acquire.lua")
RELEASE = Script("release.lua")
RENEW = Script("renew.lua")
INSPECT = Script("inspect.lua")
FORCE_RELEASE = Script("force_release.lua")
PARK = Script("park.lua")
CANCEL = Script("cancel.lua")
RATE_TAKE = Script("rate_take.lua")
RATE_PAUSE = Script("rate_pause.lua")
RATE_INSPECT = Script("rate_inspect.lua")
