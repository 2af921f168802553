"""The operator info stored with a task's hold: which task, which id, queued or running, where.

``celery locks list`` shows it, and the revoked-holder check reads it back.
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Callable
from json.encoder import encode_basestring_ascii as _json_str
from typing import Any

from .._lock import LockSpace, text

__all__ = ["HOST", "holder_info", "queued_by", "release_queued"]

HOST = socket.gethostname()
_HOST_JSON = _json_str(HOST)


def holder_info(task_name: str, task_id: str, state: str, limit: int = 1) -> str:
    """``json.dumps({"task", "id", "state", "host", "pid"}, separators=(",", ":"))``, spelled
    out (every publish and run writes one; this is about five times cheaper than building a
    JSON encoder for it), with ``"limit"`` after them when the job has more than one slot."""
    slots = f',"limit":{int(limit)}' if limit != 1 else ""
    if not (type(task_name) is str and type(task_id) is str and type(state) is str):
        info: dict[str, object] = {
            "task": task_name,
            "id": task_id,
            "state": state,
            "host": HOST,
            "pid": os.getpid(),
        }
        if limit != 1:
            info["limit"] = int(limit)
        return json.dumps(info, separators=(",", ":"))
    return (
        f'{{"task":{_json_str(task_name)},"id":{_json_str(task_id)},'
        f'"state":{_json_str(state)},"host":{_HOST_JSON},"pid":{os.getpid()}{slots}}}'
    )


def queued_by(info: Any, holder: str) -> bool:
    """Whether a hold's info says ``holder`` holds it from the queue (a publish or a parked
    retry), not from a run."""
    try:
        data = json.loads(text(info))
    except ValueError:
        return False
    return isinstance(data, dict) and data.get("state") == "queued" and data.get("id") == holder


def release_queued(
    space: LockSpace, name: str, holder: str, also: Callable[[], bool] | None = None
) -> bool:
    """Force-release ``name`` from ``holder`` only while ``holder`` holds it for its queued
    message (its info says so and no run has entered it) and ``also()`` agrees; returns
    whether it was released. The force release checks the holder and the run token again in
    Redis, in one step, so a run that enters meanwhile keeps its lock."""
    if not holder:
        return False
    state = space.inspect(name)
    if state.run_token or not queued_by(state.info, holder):
        return False
    if also is not None and not also():
        return False
    return space.force_release(name, holder=holder, unentered=True)
