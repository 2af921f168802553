"""What operators see: every lock under a prefix, found by SCAN (never KEYS), read atomically."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Any

from . import _backend
from ._keys import LockKeys, check_prefix

__all__ = ["LockView", "find_locks", "purge", "release", "show"]


@dataclass(frozen=True)
class LockView:
    key: str
    name: str
    task: str | None
    holder: str | None
    host: str | None
    pid: int | None
    state: str | None
    age_s: float | None
    lease_s: float | None
    fence: int | None
    hold_count: int

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _view(state: _backend.LockState, now_ms: float) -> LockView:
    try:
        info = json.loads(state.info) if state.info else {}
    except ValueError:
        info = {}
    if not isinstance(info, dict):
        info = {}
    task = info.get("task")
    if task is None and ":" in state.keys.name:
        task = state.keys.name.rsplit(":", 1)[0]
    holder = state.holder
    return LockView(
        key=state.keys.lock,
        name=state.keys.name,
        task=task,
        holder=holder,
        host=info.get("host"),
        pid=info.get("pid"),
        state=info.get("state") or ("held" if holder else None),
        age_s=None if state.since_ms is None else max(0.0, (now_ms - state.since_ms) / 1000),
        lease_s=None if state.pttl < 0 else state.pttl / 1000,
        fence=state.fence,
        hold_count=state.owners.get(holder, 0) if holder else 0,
    )


def _server_ms(client: Any) -> float:
    try:
        seconds, micros = client.time()
        return float(seconds) * 1000 + float(micros) / 1000
    except Exception:  # a cluster answers per node; the local clock is close enough
        return time.time() * 1000


def _lock_keys(client: Any, prefix: str, pattern: str) -> Iterator[LockKeys]:
    with _backend.backend_errors("scan", prefix):
        for raw in client.scan_iter(match=f"{prefix}:{{{pattern}}}", count=500):
            key = _backend.text(raw)
            if key.endswith("}"):
                yield LockKeys.from_lock_key(key)


def find_locks(client: Any, prefix: str = "lock", pattern: str = "*") -> list[LockView]:
    """Every held lock under ``prefix`` whose name matches the glob ``pattern``."""
    check_prefix(prefix)
    now = _server_ms(client)
    views = []
    for keys in _lock_keys(client, prefix, pattern):
        state = _backend.inspect(client, keys)
        if state.held:
            views.append(_view(state, now))
    return sorted(views, key=lambda v: v.key)


def _keys_of(key_or_name: str, prefix: str) -> LockKeys:
    if key_or_name.startswith(f"{prefix}:{{") and key_or_name.endswith("}"):
        return LockKeys.from_lock_key(key_or_name)
    return LockKeys.for_name(prefix, key_or_name)


def show(client: Any, key_or_name: str, prefix: str = "lock") -> LockView | None:
    state = _backend.inspect(client, _keys_of(key_or_name, check_prefix(prefix)))
    return _view(state, _server_ms(client)) if state.held else None


def release(client: Any, key_or_name: str, prefix: str = "lock", holder: str = "") -> bool:
    return _backend.force_release(client, _keys_of(key_or_name, check_prefix(prefix)), holder)


def purge(client: Any, prefix: str = "lock", pattern: str = "*") -> int:
    """Force-release every lock under ``prefix`` matching ``pattern``; returns how many."""
    check_prefix(prefix)
    return sum(
        _backend.force_release(client, keys) for keys in list(_lock_keys(client, prefix, pattern))
    )
