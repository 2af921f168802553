"""The operator info stored with a task's hold: which task, which id, queued or running, where.

``celery locks list`` shows it, and the revoked-holder check reads it back.
"""

from __future__ import annotations

import json
import os
import socket
from json.encoder import encode_basestring_ascii as _json_str
from typing import Any

from .._lock import text

__all__ = ["HOST", "holder_info", "queued_by"]

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
