"""Sending a lane's due renewals: one RENEW script call per batch of locks, all in one pipeline.

A thousand held locks on one server cost one round trip per renewal period. On Redis Cluster a
script may touch one slot only and redis-py refuses EVALSHA in a cluster pipeline, so the calls
are grouped by slot and sent in one pipeline per node, through that node's own client.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from redis.exceptions import NoScriptError

from . import scripts
from .hold import Hold
from .scripts import META_RETENTION_MS

__all__ = ["BATCH", "RenewalBatches"]

#: locks per EVALSHA: keeps one script run short, so Redis serves other clients in between
BATCH = 250


def _is_cluster(client: Any) -> bool:
    return hasattr(client, "keyslot") and hasattr(client, "get_nodes")


def _call_args(group: Sequence[Hold]) -> tuple[list[str], list[Any]]:
    """The RENEW call of a group: KEYS = (lock, meta) pairs, ARGV = (owner, lease, retention)
    triples (lua/renew.lua)."""
    keys: list[str] = []
    args: list[Any] = []
    for hold in group:
        keys += hold.keys.pair
        args += (hold.owner, hold.lease_ms, META_RETENTION_MS)
    return keys, args


class RenewalBatches:
    """Renews holds in batches and counts the pipelines it sent (:attr:`round_trips`)."""

    __slots__ = ("round_trips",)

    def __init__(self) -> None:
        #: pipelines sent so far, for benchmarks and operators
        self.round_trips = 0

    def renew(self, client: Any, holds: Sequence[Hold]) -> list[int | Exception]:
        """One result per hold: 1 renewed, 0 gone, or the error that kept it from renewing.
        Raises when the whole batch failed (a single server that did not answer)."""
        if _is_cluster(client):
            return self._renew_cluster(client, holds)
        groups = [list(holds[i : i + BATCH]) for i in range(0, len(holds), BATCH)]
        results: dict[int, int] = {}
        for group, reply in zip(groups, self._pipelined(client, groups), strict=True):
            if isinstance(reply, Exception):
                raise reply
            for hold, ok in zip(group, reply, strict=True):
                results[id(hold)] = int(ok)
        return [results[id(hold)] for hold in holds]

    def _renew_cluster(self, client: Any, holds: Sequence[Hold]) -> list[int | Exception]:
        # A call the node refuses (a slot that moved) goes again through the cluster client,
        # which follows the redirect; a node that fails costs only its own holds.
        slots: dict[int, list[Hold]] = {}
        for hold in holds:
            slots.setdefault(client.keyslot(hold.keys.lock), []).append(hold)
        nodes: dict[str, tuple[Any, list[list[Hold]]]] = {}
        for in_slot in slots.values():
            node = client.get_node_from_key(in_slot[0].keys.lock)
            groups = nodes.setdefault(node.name, (node.redis_connection, []))[1]
            groups += [in_slot[i : i + BATCH] for i in range(0, len(in_slot), BATCH)]
        results: dict[int, int | Exception] = {}
        for node_client, groups in nodes.values():
            try:
                replies: list[Any] = self._pipelined(node_client, groups)
            except Exception as exc:
                replies = [exc] * len(groups)
            for group, reply in zip(groups, replies, strict=True):
                if isinstance(reply, Exception):
                    try:
                        reply = scripts.RENEW(client, *_call_args(group))
                    except Exception as exc:
                        reply = [exc] * len(group)
                for hold, ok in zip(group, reply, strict=True):
                    results[id(hold)] = ok if isinstance(ok, Exception) else int(ok)
        return [results[id(hold)] for hold in holds]

    def _pipelined(self, client: Any, groups: Sequence[Sequence[Hold]]) -> list[Any]:
        """One RENEW call per group in one pipeline (one round trip); reloads on NOSCRIPT."""

        def send() -> list[Any]:
            pipe = client.pipeline(transaction=False)
            for group in groups:
                scripts.RENEW.queue(pipe, *_call_args(group))
            self.round_trips += 1
            replies: list[Any] = pipe.execute(raise_on_error=False)
            return replies

        replies = send()
        if any(isinstance(r, NoScriptError) for r in replies):
            scripts.RENEW.load(client)
            self.round_trips += 1
            replies = send()
        return replies
