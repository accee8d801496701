"""Listening sockets a binary upgrade passes from the running parent to its successor.

The successor serves `/metrics` and the dashboard on the very sockets the running
parent listened on, so the port never closes: a connection that arrives while the
two hand over waits in the socket's backlog instead of being refused.
"""

from __future__ import annotations

import socket
import socketserver
from typing import Any


class AlreadyBound(socket.socket):
    """An inherited socket, bound and listening already: `bind()` does nothing, so a
    `socketserver` server can take it through its usual `server_bind()`."""

    __slots__ = ()

    def bind(self, address: Any) -> None:
        del address


def adopt(fd: int, host: str, port: int) -> AlreadyBound | None:
    """The inherited socket on `fd` if it listens where `host:port` says (port 0: on
    any port of that address), else None and the descriptor is closed: the config
    moved the listener, which then binds afresh."""
    sock = AlreadyBound(fileno=fd)
    sock.set_inheritable(False)
    try:
        wanted = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        family, address = wanted[0][0], wanted[0][4]
        bound = sock.getsockname()
    except OSError:
        sock.close()
        return None
    if sock.family != family or bound[0] != address[0] or (port and bound[1] != port):
        sock.close()
        return None
    return sock


def serve_on(server: socketserver.TCPServer, sock: socket.socket | None) -> None:
    """Bind and activate `server` (made with `bind_and_activate=False`) on its own new
    socket, or on `sock` when one was adopted. OSError as from a plain bind."""
    if sock is not None:
        server.socket.close()
        server.socket = sock
    try:
        server.server_bind()
        server.server_activate()
    except BaseException:
        server.server_close()
        raise


__all__ = ["AlreadyBound", "adopt", "serve_on"]
