"""One end of the channel between the model host and a front-end process, on an event loop: read when the socket
is readable, and what is sent during one turn of the loop goes out as one datagram (one system call and one
wake-up of the other side for a burst). ``hosting.Link`` (the host's end) and ``remote.RemoteService`` (the front
end's) build on it.
"""

from __future__ import annotations

import asyncio
import socket

from naiad.backends.python.shm import Arena
from naiad.backends.python.transport import Channel


class ChannelEnd:
    channel: Channel
    loop: asyncio.AbstractEventLoop | None
    closed = False
    _out: list[tuple]

    def _open(self, sock: socket.socket) -> None:
        self.channel = Channel(sock, Arena(), self._blocked)
        self.loop = None
        self._out = []

    def attach(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        loop.add_reader(self.channel.sock.fileno(), self._on_readable)

    def _blocked(self) -> None:
        if self.loop is not None:
            self.loop.add_writer(self.channel.sock.fileno(), self._on_writable)

    def _on_writable(self) -> None:
        if self.channel.flush() and self.loop is not None:
            self.loop.remove_writer(self.channel.sock.fileno())

    def send(self, message: tuple) -> None:
        """Queue ``message``; what is queued goes in one datagram at the end of this turn of the loop."""
        if self.closed:
            return
        if not self._out:
            self.loop.call_soon(self._flush)  # type: ignore[union-attr]
        self._out.append(message)

    def _flush(self) -> None:
        out, self._out = self._out, []
        if self.closed or not out:
            return
        try:
            self.channel.send_many(out)
        except EOFError:
            self._channel_lost()

    def _on_readable(self) -> None:
        raise NotImplementedError

    def _channel_lost(self) -> None:
        """The other side is gone (a send found the channel closed)."""
        raise NotImplementedError
