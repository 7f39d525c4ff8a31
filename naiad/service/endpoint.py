"""One end of the channel between the model host and a front-end process, on an event loop: read when the socket
is readable, and what is sent during one turn of the loop goes out as one datagram (one system call and one
wake-up of the other side for a burst). ``hosting.Link`` (the host's end) and ``remote.RemoteService`` (the front
end's) build on it.

Every message crosses, whatever runs short. A tensor goes through the sender's shared-memory arena when it can and
inline in the message when the arena can't grow (memory, descriptors); a message too large for one datagram is
parked in the arena when it can and sent in datagram-sized parts (``PART``) when it can't. A datagram that can't be
read whole (its descriptor refused: the receiver is out of descriptors) costs the messages whose tensors it
announced, which are answered with an error, and the sender is asked to announce the segment again (``LOST``).

Resources come back at idle: every ``SWEEP_SECONDS`` an end whose arena holds segments to drop (retired, one-off)
or a current segment grown past ``KEEP_BYTES`` by a burst, and that sent nothing since the last sweep, releases
them and tells the other end (before, they went only with the next message).
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import socket
from typing import Any

from naiad.backends.python import messages as M
from naiad.backends.python.shm import Arena
from naiad.backends.python.transport import MAX_MESSAGE, TYPESTRS, Channel
from naiad.core.datatypes import serialize_bytes
from naiad.core.errors import InferError, unavailable
from naiad.service import wire

log = logging.getLogger("naiad")

SWEEP_SECONDS = 1.0
# How often each end says it is there when it has nothing else to say: a front end that hears nothing from the host
# for a while knows the host stalled; a host that hears nothing from a front end for longer restarts it.
BEAT_SECONDS = 0.25
KEEP_BYTES = 4 << 20  # a current segment reserved past this is replaced by a fresh (sparse) one at idle
PART_BYTES = MAX_MESSAGE - 1024  # a part's data, leaving room for its header in the datagram
_BATCH = int(M.Kind.BATCH)
_PART, _LOST, _BEAT = wire.PART, wire.LOST, wire.BEAT
_SHORT = (InferError, OSError)  # what an arena raises when memory or descriptors run out


def inline(name: str, array: Any) -> tuple:
    """``array`` as a ``messages.Tensor`` record with its bytes in the message (``Channel.unpack`` reads it)."""
    if array.dtype.kind in "OSU":
        return M.tensor(name, "BYTES", array.shape, serialize_bytes(array))
    return M.tensor(name, TYPESTRS[array.dtype], array.shape, array.tobytes())


class ChannelEnd:
    channel: Channel
    loop: asyncio.AbstractEventLoop | None
    closed = False
    _out: list[tuple]

    def _open(self, sock: socket.socket) -> None:
        self.channel = Channel(sock, Arena(), self._blocked)
        self.loop = None
        self._out = []
        self._parts: dict[int, bytearray] = {}  # messages arriving in parts, by the sender's number
        self._next_part = 0
        self._packed = False  # tensors went out since the last sweep (the arena is busy)
        self._sweeper: asyncio.TimerHandle | None = None
        self._short_logged = False

    def attach(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        loop.add_reader(self.channel.sock.fileno(), self._on_readable)
        self._sweeper = loop.call_later(SWEEP_SECONDS, self._sweep)

    def _blocked(self) -> None:
        if self.loop is not None:
            self.loop.add_writer(self.channel.sock.fileno(), self._on_writable)

    def _on_writable(self) -> None:
        if self.channel.flush() and self.loop is not None:
            self.loop.remove_writer(self.channel.sock.fileno())

    # --- sending ------------------------------------------------------------------------------------------------

    def records(self, arrays: dict[str, Any]) -> list[tuple]:
        """``arrays`` as tensor records: in the arena where it has room, else inline (never an error for want of
        shared memory or descriptors: the message then crosses in parts)."""
        pack = self.channel.pack
        self._packed = True
        out = []
        for name, array in arrays.items():
            try:
                out.append(pack(name, array))
            except _SHORT as exc:
                self._short(exc)
                out.append(inline(name, array))
        return out

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
            self._send_out(out)
        except EOFError:
            self._channel_lost()

    def _send_out(self, out: list[tuple]) -> None:
        """``Channel.send_many``, but a message that can't be parked for want of shared memory goes in parts."""
        channel = self.channel
        with channel.lock:
            dumps = channel._dumps
            data = dumps(out[0] if len(out) == 1 else (_BATCH, out))
            if channel._sent_now(data):
                return
            if len(out) == 1 or len(data) <= MAX_MESSAGE:
                self._send_data(data)
                return
            for message in out:
                self._send_data(dumps(message))

    def _send_data(self, data: bytes) -> None:
        channel = self.channel
        try:
            channel._send(data)
            return
        except _SHORT as exc:  # (only a message larger than a datagram needs the arena here)
            self._short(exc)
        self._next_part += 1
        number, dumps, size = self._next_part, channel._dumps, len(data)
        for start in range(0, size, PART_BYTES):
            channel._send(dumps((_PART, number, start + PART_BYTES >= size, data[start:start + PART_BYTES])))

    def _short(self, exc: BaseException) -> None:
        if not self._short_logged:  # once: under pressure every message would say it again
            self._short_logged = True
            log.warning("shared memory for the front-end channel ran short (%s); tensors cross inline meanwhile",
                        exc)

    # --- receiving ----------------------------------------------------------------------------------------------

    def _receive(self) -> list[tuple] | None:
        """The messages of the next datagram (empty: a datagram that could not be read; None: nothing waits). One
        datagram at a time: a datagram that fails costs its own messages only. Raises EOFError."""
        try:
            messages = self.channel.receive(False, True)
        except EOFError:
            raise
        except Exception as exc:  # noqa: BLE001 - a segment whose descriptor was refused, a parked message lost
            self._short(exc)
            return []
        if not messages:
            return None
        if messages[0][0] == _PART:  # (a part travels alone in its datagram)
            return self._assemble(messages)
        return messages

    def _assemble(self, messages: list[tuple]) -> list[tuple]:
        """Messages with parts joined: a whole message where its last part came."""
        out = []
        for message in messages:
            if message[0] != _PART:
                out.append(message)
                continue
            _, number, last, data = message
            buffer = self._parts.setdefault(number, bytearray())
            buffer += data
            if last:
                del self._parts[number]
                out.append(self.channel._loads(bytes(buffer)))
        return out

    def _unreadable(self, exc: BaseException) -> InferError:
        """The error for a message whose tensors could not be read (its segment never came: ``LOST`` asks for it)."""
        if isinstance(exc, KeyError) and exc.args:
            self.send((_LOST, exc.args[0]))
        return unavailable(f"a tensor could not cross between naiad's processes ({type(exc).__name__}: {exc}); "
                           "the server is short of file descriptors or memory")

    def _announce_again(self, seg_id: int) -> None:
        """The other end lost segment ``seg_id``'s announcement (``LOST``): send it again, if it is still ours."""
        arena = self.channel.arena
        for segment in (arena.current, *arena.retired, *arena.one_off):
            if segment.id == seg_id and segment.fd >= 0:
                try:
                    arena.new_fds.append((seg_id, os.dup(segment.fd)))
                except OSError:
                    return  # out of descriptors here too: asked again by the next message that fails
                self.send((_BEAT,))
                return

    # --- idle ---------------------------------------------------------------------------------------------------

    def _sweep(self) -> None:
        if self.closed or self.loop is None:
            return
        self._sweeper = self.loop.call_later(SWEEP_SECONDS, self._sweep)
        if self._packed:
            self._packed = False
            return
        arena = self.channel.arena
        trimmed = _trim(arena)
        if trimmed or arena.retired or arena.one_off or arena.dropped or arena.new_fds:
            self.send((_BEAT,))  # (announces what was dropped and the fresh segment; the receiver ignores it)

    def _stop_sweeping(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None

    def _on_readable(self) -> None:
        raise NotImplementedError

    def _channel_lost(self) -> None:
        """The other side is gone (a send found the channel closed)."""
        raise NotImplementedError


def _trim(arena: Arena) -> bool:
    """Replace the arena's current segment with a fresh one of the same size when a burst left it reserved past
    ``KEEP_BYTES`` and nothing in it is in use: a segment is sparse, so the fresh one costs pages only as it is
    reached again, and the old one's pages go once the receiver unmaps it (``DROPPED``). True when replaced."""
    current = arena.current
    if current.limit <= KEEP_BYTES or not current.drained():
        return False
    try:
        fresh = arena._open(current.size)
    except (InferError, OSError) as exc:
        if getattr(exc, "errno", None) not in (errno.EMFILE, errno.ENFILE, None):
            log.debug("could not trim the channel's arena: %s", exc)
        return False
    arena.retired.append(current)
    arena.current = fresh
    arena._drop_drained()
    return True
