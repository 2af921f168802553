"""A connection per thread for the lock's scripts, kept out of a plain redis-py client's pool.

Every acquire and release is one EVALSHA; through ``client.execute_command`` redis-py checks a
connection out of its pool and back in for each command (a lock, a readiness poll on the
socket, metrics) and wraps it in its retry and observability machinery: about as much client
time as sending the command and reading the reply. For a plain ``redis.Redis`` over a plain
``ConnectionPool``, :func:`execute` sends the command on a connection the calling thread keeps
checked out instead, under the connection's own retry policy (the same one ``execute_command``
uses: retried on connection errors and timeouts, the connection closed before each retry),
and within the deadline of the lock operation in progress (:mod:`.deadline`): no resend past it,
and no wait for a reply past it either, however long the socket timeout.

Anything else goes through ``client.execute_command`` as before: Cluster and Sentinel clients,
a single-connection client, a client with client-side caching, and any client whose
``execute_command`` was replaced or wrapped (instrumentation, mocks). At most a quarter of a
pool's ``max_connections`` are kept out this way (threads past that use the pool as before), so
the rest of the application always finds connections in it.

The connection returns to its pool when the thread ends, is never used after a fork (the child
checks out its own), and is closed whenever a command on it fails, so a reply can never be left
unread on it for the next command.
"""

from __future__ import annotations

import inspect
import os
import threading
import weakref
from collections.abc import Sequence
from typing import Any

import redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from .deadline import call_with_retry, time_left

__all__ = ["execute"]

_local = threading.local()
#: seconds: how far past the deadline a socket timeout may end and still be the one that ends
#: the wait for a reply (see _Borrowed._execute)
REPLY_SLACK = 0.1
#: pool -> connections kept out of it (by all threads)
_kept: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()
_kept_lock = threading.Lock()


# redis-py before 5.3 requires a command name (which it ignores); later versions deprecate it.
_NAME_REQUIRED = (
    inspect.signature(redis.ConnectionPool.get_connection).parameters["command_name"].default
    is inspect.Parameter.empty
)


def _after_fork_in_child() -> None:
    # The child keeps nothing out of its pools yet (redis-py gives it fresh ones), and a lock
    # held by another thread of the parent at the fork would never be released here.
    global _kept, _kept_lock
    _kept = weakref.WeakKeyDictionary()
    _kept_lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)


def _keep_one(pool: Any) -> bool:
    """Count one more connection kept out of ``pool``, unless that would pass its quota."""
    limit = getattr(pool, "max_connections", None) or 2**31
    with _kept_lock:
        kept = _kept.get(pool, 0)
        if kept + 1 > limit // 4:
            return False
        _kept[pool] = kept + 1
        return True


def _give_back(pool: Any) -> None:
    with _kept_lock:
        _kept[pool] = max(_kept.get(pool, 1) - 1, 0)


def _pack(command: Sequence[Any], encoding: str, errors: str) -> list[bytes] | None:
    """The RESP form of ``command``, as ``conn.pack_command`` makes it (its encoder's
    encoding for str, decimal digits for int) in about a third of its time: the lock's
    commands are an EVALSHA of about ten short arguments, and redis-py's general packer costs
    as much as 4 % of an acquire+release cycle. ``None`` for any other argument type."""
    name = command[0]
    if type(name) is not str:
        return None
    # like redis-py: the command name in UTF-8 whatever the encoding, "CLIENT KILL" as two
    words = name.encode().split()
    parts = [b"*%d\r\n" % (len(words) + len(command) - 1)]
    append = parts.append
    for word in words:
        append(b"$%d\r\n%s\r\n" % (len(word), word))
    for arg in command[1:]:
        kind = type(arg)
        if kind is str:
            data = arg.encode(encoding, errors)
        elif kind is int:
            data = b"%d" % arg
        elif kind is bytes:
            data = arg
        else:
            return None
        append(b"$%d\r\n" % len(data))
        append(data)
        append(b"\r\n")
    return [b"".join(parts)]


#: redis-py's packer when hiredis is installed (it writes str in UTF-8, ignoring the encoding)
_HIREDIS_PACKER: type | None = getattr(redis.connection, "HiredisRespSerializer", None)


def packing_encoding(conn: Any) -> tuple[str | None, str]:
    """How redis-py's packer of ``conn`` encodes a str: (encoding, errors); encoding ``None``
    for a connection class without redis-py's encoder (redis-py then packs the commands)."""
    if _HIREDIS_PACKER is not None and isinstance(
        getattr(conn, "_command_packer", None), _HIREDIS_PACKER
    ):
        # With hiredis installed redis-py packs every str in UTF-8, whatever the client's
        # encoding: the lock's own commands must name the same keys as redis-py's.
        return "utf-8", "strict"
    encoder = getattr(conn, "encoder", None)
    return getattr(encoder, "encoding", None), getattr(encoder, "encoding_errors", "strict")


class _Borrowed:
    __slots__ = ("conn", "encoding", "errors", "pid", "pool", "used")

    def __init__(self, pool: Any) -> None:
        # counted by the caller (_keep_one)
        self.conn = pool.get_connection("EVALSHA") if _NAME_REQUIRED else pool.get_connection()
        self.pid = os.getpid()
        self.pool = weakref.ref(pool)
        # None (a connection class without redis-py's encoder): redis-py packs the commands
        self.encoding, self.errors = packing_encoding(self.conn)
        #: a command went through on the connection since it was (re)connected
        self.used = False

    def execute(self, command: Sequence[Any], resend: bool) -> Any:
        try:
            return self._execute(command)
        except RedisTimeoutError:
            raise
        except RedisConnectionError:
            if not (resend and self.used):
                raise
        # The kept connection had worked before and now failed (not timed out): most likely
        # the server closed it (a restart, a failover, an idle timeout) while it sat unused. A
        # pool checks for that at every checkout (and reconnects); this connection is never
        # checked in, so it is checked here, after the fact: one more try on a new
        # connection. Only for commands that are safe to send twice (``resend``).
        self.used = False
        return self._execute(command)

    def _execute(self, command: Sequence[Any]) -> Any:
        conn = self.conn

        packed = None if self.encoding is None else _pack(command, self.encoding, self.errors)

        def send() -> Any:
            if packed is None:
                conn.send_command(*command)
            else:
                conn.send_packed_command(packed)
            # Under a deadline that ends before the socket timeout would, wait for the reply
            # only until the deadline (can_read is redis-py's public poll of the socket; the
            # data it reads stays in the parser's buffer for read_response). Not when the
            # socket timeout ends at most REPLY_SLACK after it: a poll with a timeout of its
            # own costs two more system calls per command, and the default deadline is the
            # socket timeout.
            left = time_left()
            if left is not None:
                timeout = getattr(conn, "socket_timeout", None)
                if (timeout is None or left < timeout - REPLY_SLACK) and not conn.can_read(
                    max(left, 0.0)
                ):
                    raise RedisTimeoutError("Timeout reading from socket: no reply by the deadline")
            return conn.read_response()

        try:
            reply = call_with_retry(conn.retry, send, lambda _error: conn.disconnect())
        except ResponseError:
            self.used = True
            raise  # an error reply, read whole: the connection is in order
        except BaseException:
            # Possibly a reply left unread (an exception between the send and the read): close
            # the connection, the next command opens a new one.
            conn.disconnect()
            raise
        self.used = True
        should_reconnect = getattr(conn, "should_reconnect", None)
        if should_reconnect is not None and should_reconnect():
            conn.disconnect()  # a server maintenance notice asked for it
            self.used = False
        return reply

    def __del__(self) -> None:
        # The thread ended, or the pool is gone. Never touch a parent process's connection.
        if getattr(self, "pid", None) != os.getpid():  # (or __init__ failed)
            return
        pool = self.pool()
        try:
            if pool is not None:
                pool.release(self.conn)
                _give_back(pool)
            else:
                self.conn.disconnect()
        except Exception:  # pragma: no cover - interpreter shutdown
            pass


def _plain_pool(client: Any) -> Any:
    """The client's pool when commands may bypass ``execute_command``, else ``None``."""
    if type(client) is not redis.Redis or "execute_command" in client.__dict__:
        return None
    if client.connection is not None:  # single_connection_client=True
        return None
    pool = client.connection_pool
    if type(pool) is not redis.ConnectionPool:
        return None
    if getattr(pool, "cache", None) is not None:  # client-side caching
        return None
    return pool


def execute(client: Any, *command: Any, resend: bool = False) -> Any:
    """``client.execute_command(*command)``, on this thread's own connection when it can be.

    ``resend``: the command is safe to send twice (idempotent), so a kept connection that the
    server closed while it sat unused is replaced and the command sent again (what a pool's
    checkout check does before the command is sent)."""
    pool = _plain_pool(client)
    if pool is None:
        return client.execute_command(*command)
    borrowed_by_pool = _local.__dict__.get("by_pool")
    if borrowed_by_pool is None:
        borrowed_by_pool = _local.by_pool = weakref.WeakKeyDictionary()
    borrowed = borrowed_by_pool.get(pool)
    if borrowed is None or borrowed.pid != os.getpid():
        if borrowed is not None:  # inherited through fork: the parent's, never used here
            del borrowed_by_pool[pool]
        if not _keep_one(pool):
            return client.execute_command(*command)
        try:
            borrowed = borrowed_by_pool[pool] = _Borrowed(pool)
        except BaseException:
            _give_back(pool)
            raise
    return borrowed.execute(command, resend)
