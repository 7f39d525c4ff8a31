"""The channel between the server and one worker process: a SOCK_SEQPACKET socket pair for small
``marshal``-encoded messages (one datagram each, so no framing) plus a shared-memory arena per direction
for tensor data.

Messages are tuples whose first item names them. Tensors travel as ``(name, dtype, shape, payload)``:
small ones inline in the message (a copy is cheaper than a block), larger ones as ``(segment, offset,
nbytes)`` in the sender's arena, read in place by the receiver. A new arena segment's file descriptor
rides along (SCM_RIGHTS) in a ``("+", id)`` message just before its first use. Several messages may
share one datagram as ``("*", [message, ...])`` (``send_many``, and ``hold``/``release`` on a worker), so a
burst costs one system call and one wake-up of the other process instead of one per message.
"""

from __future__ import annotations

import array
import marshal
import os
import select
import socket
import threading
from collections import deque
from typing import Any, Callable

import numpy as np

from naiad.backends.python.shm import Arena, SegmentMap
from naiad.core.datatypes import deserialize_bytes, serialize_bytes

INLINE_TENSOR = 16 * 1024  # bytes; larger tensors go through shared memory
MAX_MESSAGE = 64 * 1024  # larger messages (long tracebacks, many tensors) are parked in the arena
_FD_SPACE = socket.CMSG_SPACE(array.array("i", [0]).itemsize)
_DTYPES: dict[str, np.dtype] = {}

Message = tuple


def _dtype(code: str) -> np.dtype:
    dtype = _DTYPES.get(code)
    if dtype is None:
        dtype = _DTYPES[code] = np.dtype(code)
    return dtype


class Channel:
    """One end. ``send`` may be called from any thread; ``receive`` from one thread only.

    ``on_blocked`` (server side) is called when the socket buffer is full: the owner then calls
    ``flush`` when the socket is writable again. Without it (worker side) a send waits for room.
    """

    def __init__(self, sock: socket.socket, arena: Arena, on_blocked: Callable[[], None] | None = None,
                 blocking: bool = False) -> None:
        # The server's end is non-blocking (an event loop reads it); a worker's end may block, since a
        # worker that waits for room or for its next message has nothing else to do.
        sock.setblocking(blocking)
        self.sock = sock
        self.arena = arena
        self.segments = SegmentMap()
        self.lock = threading.RLock()
        self._on_blocked = on_blocked
        self._backlog: deque[tuple[bytes, list[int]]] = deque()
        self._buffer = bytearray(MAX_MESSAGE)
        self._held: list[Message] = []  # messages ``hold`` kept back; the next send takes them along
        self.closed = False

    # --- tensors (callers hold ``lock`` while packing and sending, since packing allocates in the arena) -----

    def pack(self, name: str, array_: np.ndarray) -> tuple:
        if array_.dtype.kind in "OSU":
            data = serialize_bytes(array_)
            if len(data) <= INLINE_TENSOR:
                return (name, "BYTES", array_.shape, data)
            return (name, "BYTES", array_.shape, (*self.arena.put(data, len(data)), len(data)))
        nbytes = array_.nbytes
        if nbytes <= INLINE_TENSOR:
            return (name, array_.dtype.str, array_.shape, array_.tobytes())
        # Straight into the block, whatever the array's layout: no temporary contiguous copy.
        seg_id, offset, view = self.arena.alloc(nbytes)
        np.copyto(np.frombuffer(view, array_.dtype).reshape(array_.shape), array_, casting="no")
        view.release()
        return (name, array_.dtype.str, array_.shape, (seg_id, offset, nbytes))

    def unpack(self, desc: tuple, writable: bool = False) -> np.ndarray:
        _, code, shape, payload = desc
        if type(payload) is bytes:
            if code == "BYTES":
                return deserialize_bytes(payload).reshape(shape)
            array_ = np.frombuffer(payload, _dtype(code)).reshape(shape)
            return array_.copy() if writable else array_
        seg, offset, nbytes = payload
        if code == "BYTES":  # copied out into bytes objects, so the block is free again at once
            return deserialize_bytes(memoryview(self.segments.view(seg, offset, nbytes)).cast("B")).reshape(shape)
        return self.segments.array(seg, offset, nbytes, _dtype(code), shape)

    # --- messages -------------------------------------------------------------------------------------------

    def send(self, message: Message) -> None:
        with self.lock:
            if self._held:
                self._held.append(message)
                self.release()
                return
            self._send(marshal.dumps(message))

    def send_many(self, messages: list[Message]) -> None:
        """Send ``messages`` in order, in one datagram when they fit (else one each)."""
        with self.lock:
            if self._held:
                messages = self._held + messages
                self._held = []
            if len(messages) == 1:
                self._send(marshal.dumps(messages[0]))
                return
            data = marshal.dumps(("*", messages))
            if len(data) <= MAX_MESSAGE:
                self._send(data)
                return
            for message in messages:
                self._send(marshal.dumps(message))

    def hold(self, message: Message) -> None:
        """Keep ``message`` back until ``release`` or the next send (the caller has more to send soon)."""
        with self.lock:
            self._held.append(message)

    def release(self) -> None:
        with self.lock:
            if self._held:
                held, self._held = self._held, []
                self.send_many(held)

    def _send(self, data: bytes) -> None:
        if len(data) > MAX_MESSAGE:
            seg, offset = self.arena.put(data, len(data))
            data = marshal.dumps(("@", seg, offset, len(data)))
        new_fds, dropped = self.arena.take_announcements()
        for seg_id, fd in new_fds:
            self._write(marshal.dumps(("+", seg_id)), [fd])
        if dropped:
            self._write(marshal.dumps(("-", dropped)), [])
        self._write(data, [])

    def _write(self, data: bytes, fds: list[int]) -> None:
        if self.closed:
            for fd in fds:
                os.close(fd)
            raise EOFError("the worker process is gone")
        if self._backlog:
            self._backlog.append((data, fds))
            return
        while True:
            try:
                self._send_now(data, fds)
                return
            except BlockingIOError:
                if self._on_blocked is not None:
                    self._backlog.append((data, fds))
                    self._on_blocked()
                    return
                select.select([], [self.sock], [])
            except OSError as exc:
                for fd in fds:
                    os.close(fd)
                self.closed = True
                raise EOFError(f"the worker process is gone ({exc})") from None

    def _send_now(self, data: bytes, fds: list[int]) -> None:
        """One datagram, with the descriptors it carries; ours are closed once the worker holds copies."""
        if fds:
            socket.send_fds(self.sock, [data], fds)
            for fd in fds:
                os.close(fd)
        else:
            self.sock.send(data)

    def flush(self) -> bool:
        """Send what waited for room; True when nothing is left."""
        with self.lock:
            while self._backlog:
                data, fds = self._backlog[0]
                try:
                    self._send_now(data, fds)
                except BlockingIOError:
                    return False
                except OSError:
                    self.closed = True
                    return True
                self._backlog.popleft()
            return True

    def receive(self, wait: bool = False) -> list[Message]:
        """Every message waiting now (possibly none); with ``wait`` (blocking socket) the next message, waiting
        for it. Raises EOFError once the other end is gone."""
        out: list[Message] = []
        buffer = self._buffer
        view = memoryview(buffer)
        recvmsg_into = self.sock.recvmsg_into
        flags_in = 0 if wait else socket.MSG_DONTWAIT
        while True:
            try:
                n, ancdata, flags, _ = recvmsg_into([buffer], _FD_SPACE, flags_in)
            except (BlockingIOError, InterruptedError):
                return out
            except OSError as exc:
                self.closed = True
                if out:
                    return out
                raise EOFError(str(exc)) from None
            if n == 0:
                self.closed = True
                if out:
                    return out
                raise EOFError("the other end closed the channel")
            message = marshal.loads(view[:n])
            kind = message[0]
            if kind == "+":  # (a segment announcement is never the message a waiting reader returns)
                fds = array.array("i")
                for level, type_, data in ancdata:
                    if level == socket.SOL_SOCKET and type_ == socket.SCM_RIGHTS:
                        fds.frombytes(data[: len(data) - (len(data) % fds.itemsize)])
                self.segments.add(message[1], fds[0])
                continue
            if kind == "-":
                for seg_id in message[1]:
                    self.segments.drop(seg_id)
                continue
            if kind == "@":
                _, seg, offset, nbytes = message
                message = marshal.loads(bytes(self.segments.view(seg, offset, nbytes)))
            if kind == "*":
                out.extend(message[1])
            else:
                out.append(message)
            if wait:
                return out

    def wait_readable(self, timeout: float | None = None) -> bool:
        return bool(select.select([self.sock], [], [], timeout)[0])

    def close(self) -> None:
        self.closed = True
        try:
            self.sock.close()
        except OSError:
            pass
        self.arena.close()
        self.segments.close()
