"""Accepting from a listening socket that sibling processes accept from too (the front ends of
``--frontend-processes N``, naiad/frontends/ports.py), so that new connections spread over them.

uvloop's server (libuv) accepts every connection queued when it wakes, so a burst of new connections (a client
pool opening, a benchmark starting) lands on whichever front end woke first. Every front end wakes for each new
connection (one accept queue), so here each takes one connection per wake, and one that holds more than its share
of the port's connections (``ahead``: the counts the front ends share) lets the others take the next for a moment
before it takes it itself. Measured with 2 front ends, 16 connections opened at once, 8 tries: libuv's accept
gave 16 / 0 twice; SO_REUSEPORT's hash (each its own socket), 3 / 13 at worst.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
from collections.abc import Callable

log = logging.getLogger("naiad")

PAUSE_SECONDS = 1.0  # how long a front end out of descriptors leaves the queue to the others
# How long one ahead of its share waits for the others to take a new connection: a wake on a busy core takes up to
# a scheduler tick or so. (When the others can't accept, a stopped one say, each new connection waits this long.)
DEFER_SECONDS = 0.002


class Acceptor:
    """Serves ``sock``'s connections with ``factory``'s protocols until ``close()``, as an asyncio server would."""

    def __init__(self, sock: socket.socket, factory: Callable[[], asyncio.BaseProtocol],
                 context: ssl.SSLContext | None = None, ahead: Callable[[], bool] | None = None) -> None:
        self.loop = asyncio.get_running_loop()
        self.sock = sock
        self.factory = factory
        self.context = context
        self.ahead = ahead
        self.fd = sock.fileno()
        self._later: asyncio.TimerHandle | None = None
        self.closed = False
        sock.setblocking(False)
        self.loop.add_reader(self.fd, self._readable)

    def _readable(self) -> None:
        if self.ahead is not None and self.ahead():
            self._wait(DEFER_SECONDS)  # the others' turn first
            return
        self._accept()

    def _accept(self) -> None:
        try:
            conn, _ = self.sock.accept()
        except (BlockingIOError, InterruptedError, ConnectionAbortedError):
            return  # another front end took it, or the client left before it was accepted
        except OSError as exc:
            # Out of descriptors or memory here (EMFILE, ENFILE, ENOBUFS, ENOMEM): the others take the queue for a
            # moment, as asyncio's own server pauses (libuv would accept and reset the connection instead).
            log.warning("accepting a connection failed (%s); leaving new connections to the other front ends for "
                        "%g s", exc.strerror or exc, PAUSE_SECONDS)
            self._wait(PAUSE_SECONDS)
            return
        conn.setblocking(False)
        task = self.loop.create_task(self.loop.connect_accepted_socket(self.factory, conn, ssl=self.context))
        task.add_done_callback(_connected)

    def _wait(self, seconds: float) -> None:
        """Stop watching the socket (it stays readable) for ``seconds``, then take what is still queued."""
        self.loop.remove_reader(self.fd)
        self._later = self.loop.call_later(seconds, self._resume)

    def _resume(self) -> None:
        self._later = None
        if self.closed:
            return
        self._accept()
        if self._later is None:  # (unless that failed and waits again)
            self.loop.add_reader(self.fd, self._readable)

    def close(self) -> None:
        """Stop accepting (this process's copy of the socket closes; its connections stay)."""
        if self.closed:
            return
        self.closed = True
        if self._later is not None:
            self._later.cancel()
        self.loop.remove_reader(self.fd)
        self.sock.close()


def _connected(task: asyncio.Task) -> None:
    """A connection that failed to start (a TLS handshake that failed or timed out) was closed by the loop."""
    if not task.cancelled() and task.exception() is not None:
        log.debug("connection not started: %s", task.exception())
