"""Many locks read in few round trips: lua/inspect.lua once per lock, pipelined in batches.

Each call is one EVALSHA on one lock's own keys (one hash tag), so a batch works on Redis
Cluster too. redis-py refuses EVALSHA in a cluster pipeline: there the calls are grouped by
node and sent through each node's own client, as the renewal lane sends its renewals
(:mod:`.renewal`); a call a node refuses (its slot moved meanwhile) goes again, alone, through
the cluster client, which follows the redirect.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from redis.exceptions import NoScriptError

from . import scripts
from .checks import is_cluster
from .commands import LockState, backend_errors, lock_state
from .keys import LockKeys

#: inspect calls per pipeline: big enough that 10,000 locks take 20 round trips, small enough
#: that one reply (a few kB a lock at most) stays well under what a connection buffers
BATCH = 500


def _pipelined(client: Any, keys: Sequence[LockKeys]) -> list[Any]:
    """One INSPECT per lock of ``keys`` in one pipeline (one round trip); a reply may be the
    error of its own call. Loads the script and sends again on NOSCRIPT (a restarted server)."""

    def send() -> list[Any]:
        pipe = client.pipeline(transaction=False)
        for one in keys:
            scripts.INSPECT.queue(pipe, one.pair, ())
        replies: list[Any] = pipe.execute(raise_on_error=False)
        return replies

    replies = send()
    if any(isinstance(reply, NoScriptError) for reply in replies):
        scripts.INSPECT.load(client)
        replies = send()
    return replies


def _by_node(client: Any, keys: Sequence[LockKeys]) -> list[tuple[Any, list[int]]]:
    """The indexes of ``keys`` grouped by the cluster node that serves each, with that node's
    own client."""
    nodes: dict[str, tuple[Any, list[int]]] = {}
    for index, one in enumerate(keys):
        node = client.get_node_from_key(one.lock)
        nodes.setdefault(node.name, (node.redis_connection, []))[1].append(index)
    return list(nodes.values())


def inspect_many(client: Any, keys: Sequence[LockKeys], prefix: str) -> list[LockState]:
    """The state of each lock of ``keys``, in order, each read atomically (the batch as a whole
    is not one snapshot). Raises :class:`LockBackendError` when Redis fails a call."""
    subject = f"the locks under prefix {prefix!r}"
    replies: list[Any] = [None] * len(keys)
    with backend_errors("inspect", "", subject):
        if is_cluster(client):
            groups = _by_node(client, keys)
        else:
            groups = [(client, list(range(len(keys))))]
        for node_client, indexes in groups:
            for start in range(0, len(indexes), BATCH):
                chunk = indexes[start : start + BATCH]
                answered = _pipelined(node_client, [keys[i] for i in chunk])
                for index, reply in zip(chunk, answered, strict=True):
                    replies[index] = reply
        for index, reply in enumerate(replies):
            if isinstance(reply, Exception):
                if not is_cluster(client):
                    raise reply
                # a slot that moved: the cluster client follows the redirect
                replies[index] = scripts.INSPECT(client, keys[index].pair, ())
    return [lock_state(one, reply) for one, reply in zip(keys, replies, strict=True)]
