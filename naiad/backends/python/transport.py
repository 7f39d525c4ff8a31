"""The channel between the server and one worker process: a SOCK_SEQPACKET socket pair for small
messages (one datagram each, so no framing) plus a shared-memory arena per direction for tensor data.

Messages are the tuples of ``messages.py``, encoded by the codec the handshake picked (``marshal`` unless
the two interpreters differ). Tensors travel as ``messages.Tensor`` records, made by ``pack`` and read by
``unpack``: small ones inline in the message (a copy is cheaper than a block), larger ones as a
``messages.Block`` in the sender's arena, read in place by the receiver (or copied out at once, when the
sender's arena is in copy mode; see shm.py). A new arena segment's file descriptor rides along
(SCM_RIGHTS) in a ``SEGMENT`` message just before its first use. Several messages may share one datagram
as a ``BATCH`` (``send_many``, and ``hold``/``release`` on a worker), so a burst costs one system call and
one wake-up of the other process instead of one per message.
"""

from __future__ import annotations

import array
import os
import select
import socket
import threading
from collections import deque
from typing import Any, Callable

import numpy as np

from naiad.backends.python import messages as M
from naiad.backends.python.messages import MARSHAL, Block, Codec, Kind, Tensor, reads
from naiad.backends.python.shm import Arena, SegmentMap
from naiad.core.datatypes import BF16, BF16_CODES, deserialize_bytes, serialize_bytes

INLINE_TENSOR = 16 * 1024  # bytes; larger tensors go through shared memory
MAX_MESSAGE = 64 * 1024  # larger messages (long tracebacks, many tensors) are parked in the arena
_FD_SPACE = socket.CMSG_SPACE(array.array("i", [0]).itemsize)
_SEGMENT, _DROPPED, _PARKED, _BATCH = int(Kind.SEGMENT), int(Kind.DROPPED), int(Kind.PARKED), int(Kind.BATCH)
_tensor, _block = M.tensor, M.block
if M.Batch._fields != ("kind", "messages"):  # (send_many writes it inline)
    raise ImportError("transport.py's inline BATCH message must follow messages.Batch's fields")

Message = tuple


class _Dtypes(dict):
    """NumPy dtypes by type string, made once each (a subscript, no call, on the hot path)."""

    def __missing__(self, code: str) -> np.dtype:
        # bfloat16's type string is a bare 2-byte void, which np.dtype would make a void type.
        dtype = self[code] = BF16 if code in BF16_CODES else np.dtype(code)
        return dtype


_DTYPES = _Dtypes()


class _Typestrs(dict):
    """Each dtype's type string, made once (``dtype.str`` builds a new string at every call)."""

    def __missing__(self, dtype: np.dtype) -> str:
        code = self[dtype] = dtype.str
        return code


TYPESTRS = _Typestrs()
_CLOSING = threading.Lock()  # close() runs once per channel, whichever thread calls it first


class Channel:
    """One end. ``send`` may be called from any thread; ``receive`` from one thread only.

    ``on_blocked`` (server side) is called when the socket buffer is full: the owner then calls
    ``flush`` when the socket is writable again. Without it (worker side) a send waits for room.
    """

    def __init__(self, sock: socket.socket, arena: Arena, on_blocked: Callable[[], None] | None = None,
                 blocking: bool = False, codec: Codec = MARSHAL) -> None:
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
        self._view = memoryview(self._buffer)  # (made once: receive slices it per datagram)
        self._held: list[Message] = []  # messages ``hold`` kept back; the next send takes them along
        self.closed = False
        self._released = False  # close() has run (``closed`` is also set when the peer goes)
        self.use(codec)

    def use(self, codec: Codec) -> None:
        """Encode and decode with ``codec`` from now on (the handshake's choice)."""
        self.codec = codec
        self._dumps = codec.dumps
        self._loads = codec.loads

    # --- tensors (callers hold ``lock`` while packing and sending, since packing allocates in the arena) -----

    def pack(self, name: str, array_: np.ndarray) -> tuple:
        """``array_`` as a ``messages.Tensor`` record (the one encoder of that record)."""
        if array_.dtype.kind in "OSU":
            data = serialize_bytes(array_)
            nbytes = len(data)
            if nbytes <= INLINE_TENSOR:
                return _tensor(name, "BYTES", array_.shape, data)
            seg_id, offset = self.arena.put(data, nbytes)
            return _tensor(name, "BYTES", array_.shape, _block(seg_id, offset, nbytes, True))
        nbytes = array_.nbytes
        if nbytes <= INLINE_TENSOR:
            return _tensor(name, TYPESTRS[array_.dtype], array_.shape, array_.tobytes())
        # Straight into the block, whatever the array's layout: no temporary contiguous copy.
        seg_id, offset, view, copy = self.arena.alloc(nbytes)
        np.copyto(np.frombuffer(view, array_.dtype).reshape(array_.shape), array_, casting="no")
        view.release()
        return _tensor(name, TYPESTRS[array_.dtype], array_.shape, _block(seg_id, offset, nbytes, copy))

    @reads(Tensor)
    def unpack(self, writable: bool, name: str, dtype: str, shape: tuple, payload: Any) -> tuple[str, np.ndarray]:
        """A ``messages.Tensor`` record, given as ``unpack(writable, *record)``, as ``(name, array)`` (the one
        decoder of that record). ``writable``: the receiver may write into the array."""
        if type(payload) is bytes:
            if dtype == "BYTES":
                return name, deserialize_bytes(payload).reshape(shape)
            # Over the bytes in one call (frombuffer then reshape takes two): read-only, as bytes are. The record
            # is ``pack``'s, whose bytes are exactly this shape's.
            array_ = np.ndarray(shape, _DTYPES[dtype], payload)
            return name, (array_.copy() if writable else array_)
        return name, self._from_block(dtype, shape, *payload)

    @reads(Block)
    def _from_block(self, dtype: str, shape: tuple, segment: int, offset: int, nbytes: int, copy: bool) -> np.ndarray:
        if dtype == "BYTES":  # copied out into bytes objects, so the block is free again at once
            view = self.segments.view(segment, offset, nbytes)
            return deserialize_bytes(memoryview(view).cast("B")).reshape(shape)
        if copy:
            return self.segments.take(segment, offset, nbytes, _DTYPES[dtype], shape)
        return self.segments.array(segment, offset, nbytes, _DTYPES[dtype], shape)

    # --- messages -------------------------------------------------------------------------------------------

    def send(self, message: Message) -> None:
        with self.lock:
            if self._held:
                self._held.append(message)
                self.release()
                return
            data = self._dumps(message)
            if not self._sent_now(data):
                self._send(data)

    def send_many(self, messages: list[Message]) -> None:
        """Send ``messages`` in order, in one datagram when they fit (else one each)."""
        with self.lock:
            if self._held:
                messages = self._held + messages
                self._held = []
            dumps = self._dumps
            data = dumps(messages[0] if len(messages) == 1 else (_BATCH, messages))
            if self._sent_now(data):
                return
            if len(messages) == 1 or len(data) <= MAX_MESSAGE:
                self._send(data)
                return
            for message in messages:
                self._send(dumps(message))

    def _sent_now(self, data: bytes) -> bool:
        """The common case in one call: a datagram that fits, with nothing to announce or queued before it, sent
        now. False: the general path (``_send``) waits, queues, parks or reports the end."""
        arena = self.arena
        if (len(data) > MAX_MESSAGE or self._backlog or arena.new_fds or arena.dropped or arena.retired
                or arena.one_off or self.closed):
            return False
        try:
            self.sock.send(data)
        except (BlockingIOError, OSError):
            return False
        return True

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
            data = self._dumps(M.parked(seg, offset, len(data)))
        new_fds, dropped = self.arena.take_announcements()
        for seg_id, fd in new_fds:
            self._write(self._dumps(M.segment(seg_id)), [fd])
        if dropped:
            self._write(self._dumps(M.dropped(dropped)), [])
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

    def receive(self, wait: bool = False, one: bool = False) -> list[Message]:
        """Every message waiting now (possibly none); with ``one``, those of the next datagram only (none if none
        waits); with ``wait`` (blocking socket) the next message, waiting for it. Raises EOFError once the other
        end is gone."""
        out: list[Message] = []
        buffer = self._buffer
        view = self._view
        recvmsg_into = self.sock.recvmsg_into
        loads = self._loads
        flags_in = 0 if wait else socket.MSG_DONTWAIT
        reset = False
        while True:
            try:
                n, ancdata, flags, _ = recvmsg_into([buffer], _FD_SPACE, flags_in)
            except (BlockingIOError, InterruptedError):
                return out
            except ConnectionResetError:
                if reset:
                    self.closed = True
                    if out:
                        return out
                    raise EOFError("the other end closed the channel") from None
                # The other end closed with messages of ours unread, and the kernel reports that ahead of the
                # datagrams it sent before it went (a worker's last answer, its poisoned notice): read those.
                reset = True
                continue
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
            message = loads(view[:n])
            kind = message[0]
            if kind == _SEGMENT:  # (a segment announcement is never the message a waiting reader returns)
                fds = array.array("i")
                for level, type_, data in ancdata:
                    if level == socket.SOL_SOCKET and type_ == socket.SCM_RIGHTS:
                        fds.frombytes(data[: len(data) - (len(data) % fds.itemsize)])
                self.segments.add(M.Segment.of(message).id, fds[0])  # type: ignore[attr-defined]
                continue
            if kind == _DROPPED:
                for seg_id in M.Dropped.of(message).ids:  # type: ignore[attr-defined]
                    self.segments.drop(seg_id)
                continue
            if kind == _PARKED:
                parked = M.Parked.of(message)  # type: ignore[attr-defined]
                message = loads(bytes(self.segments.view(parked.segment, parked.offset, parked.nbytes)))
                kind = message[0]
            if kind == _BATCH:
                out.extend(message[1])  # (Batch's messages: see send_many)
            else:
                out.append(message)
            if wait or one:
                return out

    def receive_raw(self) -> bytes:
        """The next datagram as it came (the handshake, before a codec is chosen); b"" once the other end is
        gone. Call after ``wait_readable``."""
        try:
            return self.sock.recv(MAX_MESSAGE)
        except BlockingIOError:
            return self.receive_raw() if self.wait_readable() else b""
        except OSError:
            self.closed = True
            return b""

    def wait_readable(self, timeout: float | None = None) -> bool:
        return bool(select.select([self.sock], [], [], timeout)[0])

    def close(self) -> None:
        # Once, whoever comes first: a worker's restart (an executor thread) and an unload (the loop) may both
        # close a starting worker's channel, and closing its segments' descriptors twice would close whatever
        # file took their numbers in between.
        with _CLOSING:
            if self._released:
                return
            self._released = True
        self.closed = True
        try:
            self.sock.close()
        except OSError:
            pass
        self.arena.close()
        self.segments.close()
