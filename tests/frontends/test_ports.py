"""naiad/frontends/ports.py against the kernel: what a later socket may do beside the ports it binds. The live
checks (a second server on the ports, a stopped front end) are in tests/test_ports.py."""

from __future__ import annotations

import socket
import time

import pytest

from naiad.frontends import ports
from tests.server import free_port


def _socket(*options: int) -> socket.socket:
    sock = socket.socket()
    for option in options:
        sock.setsockopt(socket.SOL_SOCKET, option, 1)
    return sock


def _taken(sock: socket.socket, port: int) -> bool:
    try:
        sock.bind(("127.0.0.1", port))
        sock.listen()
        return False
    except OSError:
        return True
    finally:
        sock.close()


def test_a_listening_port_refuses_every_later_bind_sharing_or_not() -> None:
    listening = ports.listen("HTTP", "127.0.0.1", 0)
    port = listening.sockets[0].getsockname()[1]
    try:
        assert _taken(_socket(socket.SO_REUSEADDR), port)
        assert _taken(_socket(socket.SO_REUSEADDR, socket.SO_REUSEPORT), port)  # what SO_REUSEPORT alone let in
        with pytest.raises(SystemExit, match=f"^error: failed to start HTTP service: Unavailable - Socket "
                                             f"'127.0.0.1:{port}' already in use$"):
            ports.listen("HTTP", "127.0.0.1", port)
    finally:
        listening.close()


def test_the_guard_lets_sharing_front_ends_in_and_keeps_other_servers_out() -> None:
    guard = ports.guard("GRPC", "127.0.0.1", free_port())
    port = guard.sockets[0].getsockname()[1]
    front_end = _socket(socket.SO_REUSEADDR, socket.SO_REUSEPORT)  # as grpcio binds with grpc.so_reuseport
    try:
        front_end.bind(("127.0.0.1", port))
        front_end.listen()
        assert _taken(_socket(socket.SO_REUSEADDR), port)  # a server that doesn't share: while one listens...
        front_end.close()
        assert _taken(_socket(socket.SO_REUSEADDR), port)  # ... and while none does (between restarts)
        with pytest.raises(SystemExit, match="already in use"):  # another naiad's guard: its check fails
            ports.guard("GRPC", "127.0.0.1", port)
    finally:
        front_end.close()
        guard.close()


def test_the_guard_refuses_a_port_where_others_listen_sharing() -> None:
    """Another naiad's grpcio front ends (SO_REUSEPORT) would let the guard itself in: the check binds without."""
    other = _socket(socket.SO_REUSEADDR, socket.SO_REUSEPORT)
    other.bind(("127.0.0.1", 0))
    other.listen()
    try:
        with pytest.raises(SystemExit, match="already in use"):
            ports.guard("GRPC", "127.0.0.1", other.getsockname()[1])
    finally:
        other.close()


def test_the_guard_binds_over_the_last_runs_connections_in_time_wait() -> None:
    """A server that closed its connections first leaves them in TIME_WAIT on its port for a minute: a restart
    binds over them (SO_REUSEADDR), with front-end processes too."""
    listener = ports.listen("GRPC", "127.0.0.1", 0).sockets[0]
    port = listener.getsockname()[1]
    client = socket.create_connection(("127.0.0.1", port))
    listener.setblocking(True)
    accepted, _ = listener.accept()
    accepted.close()  # the server's side first: its end waits in TIME_WAIT
    time.sleep(0.1)
    client.close()
    listener.close()
    ports.guard("GRPC", "127.0.0.1", port).close()
