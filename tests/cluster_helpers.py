"""A real Redis Cluster for the tests: primaries started on free ports, slots split evenly.

It runs on every server the README names: Redis 7.0 and later (and Valkey) take the cluster
bus port as ``--cluster-port`` and the slots as ranges; Redis 6.2 has neither, so there the bus
is the client port + 10000 and the slots are added one by one.
"""

from __future__ import annotations

import contextlib
import shutil
import socket
from collections.abc import Iterator
from typing import Any

from lock_helpers import server_version, wait_until

from celery_singleton_lock.testing import RedisServer, free_port

#: Redis 6.2's fixed offset of a node's cluster bus port from its client port
BUS_OFFSET = 10000


def _free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _ports() -> tuple[int, int]:
    """(client port, cluster bus port), both free now."""
    if server_version() >= (7, 0):
        return free_port(), free_port()
    for _ in range(100):
        port = free_port()
        if port + BUS_OFFSET <= 65535 and _free(port + BUS_OFFSET):
            return port, port + BUS_OFFSET
    raise RuntimeError(f"found no free port whose port + {BUS_OFFSET} is free too")


def _node(port: int, bus: int) -> RedisServer:
    args = [
        "--cluster-enabled", "yes",
        "--cluster-config-file", "nodes.conf",
        "--cluster-node-timeout", "5000",
    ]  # fmt: skip
    if server_version() >= (7, 0):
        args += ["--cluster-port", str(bus)]
    return RedisServer(*args, port=port)


@contextlib.contextmanager
def redis_cluster(nodes: int = 3) -> Iterator[list[RedisServer]]:
    """A Redis Cluster of ``nodes`` primaries on free ports, slots split evenly (node i has
    slots ``i * 16384 // nodes`` up to the next node's first), ready when it yields."""
    servers: list[RedisServer] = []
    buses: list[int] = []
    try:
        for _ in range(nodes):
            port, bus = _ports()
            servers.append(_node(port, bus).start())
            buses.append(bus)
        first = servers[0].client()
        for server, bus in zip(servers[1:], buses[1:], strict=True):
            first.execute_command("CLUSTER", "MEET", "127.0.0.1", server.port, bus)
        size = 16384 // nodes
        for i, server in enumerate(servers):
            last = 16383 if i == nodes - 1 else (i + 1) * size - 1
            # ADDSLOTS, not ADDSLOTSRANGE: Redis 6.2 has only the former
            server.client().execute_command("CLUSTER", "ADDSLOTS", *range(i * size, last + 1))

        def ready() -> bool:
            for server in servers:
                client = server.client()
                info = client.execute_command("CLUSTER", "INFO")
                info = info.decode() if isinstance(info, bytes) else info
                if (
                    "cluster_state:ok" not in info
                    or len(client.execute_command("CLUSTER", "SLOTS")) != nodes
                ):
                    return False
            return True

        wait_until(ready, 30, "the cluster to agree on its slots", interval=0.1)
        yield servers
    finally:
        for server in servers:
            server.stop()
            shutil.rmtree(server.dir, ignore_errors=True)


class Migration:
    """One slot moved from ``source`` to ``target``, step by step, as redis-cli does."""

    def __init__(self, source: RedisServer, target: RedisServer, slot: int) -> None:
        self.source, self.target, self.slot = source.client(), target.client(), slot
        self.target_port = target.port
        self.source_id = text(self.source.execute_command("CLUSTER", "MYID"))
        self.target_id = text(self.target.execute_command("CLUSTER", "MYID"))

    def begin(self) -> None:
        self.target.execute_command("CLUSTER", "SETSLOT", self.slot, "IMPORTING", self.source_id)
        self.source.execute_command("CLUSTER", "SETSLOT", self.slot, "MIGRATING", self.target_id)

    def move(self, *keys: str) -> None:
        self.source.execute_command(
            "MIGRATE", "127.0.0.1", self.target_port, "", 0, 5000, "KEYS", *keys
        )

    def end(self) -> None:
        """Move what is left of the slot, then give it to the target on both nodes."""
        left = self.source.execute_command("CLUSTER", "GETKEYSINSLOT", self.slot, 1000)
        if left:
            self.move(*(text(key) for key in left))
        for node in (self.target, self.source):
            node.execute_command("CLUSTER", "SETSLOT", self.slot, "NODE", self.target_id)


def text(value: Any) -> str:
    """A reply as ``str``."""
    return value.decode() if isinstance(value, bytes) else str(value)
