"""The served ports, each bound once by the process that owns it, so that a second server started on one fails as
Triton does ("Socket '0.0.0.0:8000' already in use") rather than joining it.

With ``--frontend-processes N`` the model host binds the HTTP, SageMaker and lean gRPC ports (``listen``) and its
front-end processes inherit the listening sockets and accept from them, as gunicorn's and uvicorn's supervisors
do: one accept queue, which a later process can't join (SO_REUSEPORT, the alternative, lets any process of the
same user bind the port too and take its share of the connections), and which a stopped front end leaves to the
others instead of having the kernel keep queueing its share. grpcio's server can't adopt a listening socket (no
such call in grpcio; grpc-core's systemd socket activation is not built into its wheels), so its front ends
listen with SO_REUSEPORT, the port held by the host's ``guard``.
"""

from __future__ import annotations

import asyncio
import errno
import socket
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

BACKLOG = 2048


@dataclass
class Port:
    """A served port's sockets: listening ones (``listen``), or a guard (``guard``) that serves nothing."""

    sockets: list[socket.socket]
    shared: bool = False  # other processes (sibling front ends) accept from these sockets too
    guard: bool = False
    ahead: Callable[[], bool] | None = None  # shared: whether this process holds more than its share of connections

    async def serve(self, factory: Callable[[], asyncio.BaseProtocol], context: ssl.SSLContext | None = None
                    ) -> list[Any]:
        """Serve the port's connections with ``factory``'s protocols: what comes back answers ``close()``."""
        if self.shared:
            from naiad.frontends.acceptor import Acceptor

            return [Acceptor(sock, factory, context, self.ahead) for sock in self.sockets]
        loop = asyncio.get_running_loop()
        return [await loop.create_server(factory, sock=sock, backlog=BACKLOG, ssl=context) for sock in self.sockets]

    def close(self) -> None:
        for sock in self.sockets:
            sock.close()


def bind_error(name: str, address: str, port: int, exc: OSError | None = None) -> str:
    """Triton's one line for a front end that can't listen (main.cc), with the OS's reason when it is not the
    usual one."""
    if exc is None or exc.errno == errno.EADDRINUSE:
        return f"error: failed to start {name} service: Unavailable - Socket '{address}:{port}' already in use"
    return f"error: failed to start {name} service: Unavailable - Socket '{address}:{port}': {exc.strerror or exc}"


def _addresses(address: str, port: int) -> list[tuple]:
    """Where asyncio's ``create_server(host, port)`` would listen: every address the host resolves to ("" is
    every interface)."""
    infos = socket.getaddrinfo(address or None, port, socket.AF_UNSPEC, socket.SOCK_STREAM, 0, socket.AI_PASSIVE)
    return list(dict.fromkeys((family, kind, proto, sockaddr) for family, kind, proto, _, sockaddr in infos))


def _bind(name: str, address: str, port: int, options: list[tuple[int, int]], listen: bool) -> list[socket.socket]:
    bound: list[socket.socket] = []
    try:
        for family, kind, proto, sockaddr in _addresses(address, port):
            sock = socket.socket(family, kind, proto)
            bound.append(sock)
            for option, value in options:
                sock.setsockopt(socket.SOL_SOCKET, option, value)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)  # (as asyncio: 0.0.0.0 is its own)
            sock.bind(sockaddr)
            if listen:
                sock.listen(BACKLOG)
                sock.setblocking(False)
    except OSError as exc:
        for sock in bound:
            sock.close()
        raise SystemExit(bind_error(name, address, port, exc)) from None
    return bound


def listen(name: str, address: str, port: int, reuse_port: bool = False) -> Port:
    """The port's listening sockets, as asyncio's ``create_server`` would make them (SO_REUSEADDR: a restart
    doesn't wait for the last run's connections in TIME_WAIT); SO_REUSEPORT only when the user asks for it
    (``--reuse-http-port``, ``--reuse-grpc-port``: then other servers that ask for it too may join). Triton's
    line (``SystemExit``) when the port is taken."""
    options = [(socket.SO_REUSEADDR, 1)] + ([(socket.SO_REUSEPORT, 1)] if reuse_port else [])
    return Port(_bind(name, address, port, options, listen=True))


def guard(name: str, address: str, port: int, reuse_port: bool = False) -> Port:
    """The port held for front ends that bind it themselves with SO_REUSEPORT (grpcio's): Triton's line when
    anything holds it already, else sockets bound to it that never listen (they take no connections).

    Linux lets a socket bind a taken port only when it and every socket there set SO_REUSEPORT (and share an
    owner), or when they all set SO_REUSEADDR and none listens. The check binds without SO_REUSEPORT, so it fails
    where anything is bound, another naiad's front ends included; the guard then sets SO_REUSEPORT alone, so the
    front ends join it (and rejoin it when restarted) while a server that doesn't set SO_REUSEPORT (naiad without
    --reuse-grpc-port, Triton) can't bind the port even while no front end listens. What it can't stop: a process
    of the same user that sets SO_REUSEPORT itself still joins, as on any SO_REUSEPORT port. With ``reuse_port``
    (the user's --reuse-grpc-port) there is no check: other servers that set it may share the port, as
    documented."""
    if not reuse_port:
        for sock in _bind(name, address, port, [(socket.SO_REUSEADDR, 1)], listen=False):
            sock.close()  # (a moment's window before the guard binds: a server started in it fails there)
    try:
        return Port(_bind(name, address, port, [(socket.SO_REUSEPORT, 1)], listen=False), guard=True)
    except SystemExit:
        # What refuses, where nothing listens (the check passed), is the last run's connections in TIME_WAIT
        # (a minute), which only SO_REUSEADDR binds over. With it a server without SO_REUSEPORT could bind the
        # port while no front end listens (never while one does).
        return Port(_bind(name, address, port, [(socket.SO_REUSEADDR, 1), (socket.SO_REUSEPORT, 1)], listen=False),
                    guard=True)
