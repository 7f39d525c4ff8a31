"""What one lean-engine connection may hold of its requests: a byte budget, with HTTP/2 flow control opened only
within it (--grpc-max-connection-buffer).

Each stream may send ``window`` bytes unasked (SETTINGS_INITIAL_WINDOW_SIZE): small messages arrive at once, as
before. A message larger than that (its 5-byte gRPC prefix says how large) reserves its whole size from the
connection's budget before its stream's window opens for the rest; one that doesn't fit now waits, its stream
stalled, until others give room back (first come, first served); one larger than the budget can never fit and is
refused. Reserving whole messages keeps streams from deadlocking on half-received messages that together fill the
budget. Room comes back when the server is done with the bytes: a unary call's when the call ends (so the budget
also covers requests queued for the model), a streaming call's message when its handler takes it. So a connection
holds at most ``limit`` bytes of large messages plus ``window`` bytes per stream, whatever it sends.
"""

from __future__ import annotations

from collections import deque
from typing import Protocol

from naiad.frontends.http2.connection import H2Connection

PREFIX = 5  # a gRPC message's compressed flag and length


class Held(Protocol):
    """What the budget reads and keeps on a call (``lean.Call``)."""

    sid: int
    body: bytes | bytearray | memoryview | None  # received bytes not yet made into messages: a message's beginning first
    later: int  # received bytes of a unary call's message kept apart, after ``body``
    closed: bool
    reserved: int  # room reserved for the message at the start of ``body``
    need: int  # room that message waits for (0: none)
    sizes: deque[tuple[int, int]] | None  # streaming: messages queued for the handler, (size, room reserved)
    queued: int  # bytes of those that reserved no room


def stream_window(limit: int, streams: int) -> int:
    """The window each stream gets unasked: at most half the budget over all streams, 16-256 KiB."""
    return min(256 * 1024, max(16 * 1024, limit // (2 * streams)))


class Budget:
    __slots__ = ("h2", "limit", "window", "reserved", "waiting")

    def __init__(self, h2: H2Connection, limit: int, window: int) -> None:
        self.h2 = h2
        self.limit = limit  # bytes of messages (their prefixes come on top)
        self.window = window
        self.reserved = 0
        self.waiting: deque[Held] = deque()

    def reserve(self, call: Held) -> int:
        """The message at the start of ``call.body`` is still arriving: if its stream's window can't take all of
        it, reserve room and open the window for the rest, or queue the call for room. Returns the message's size
        when it is larger than the budget (the caller refuses the call), else 0."""
        body = call.body
        if call.reserved or call.need or body is None or len(body) < PREFIX:
            return 0
        size = int.from_bytes(body[1:PREFIX], "big")
        need = PREFIX + size
        if need <= self.window:
            return 0  # the stream's own window holds it
        if size > self.limit:
            return size
        call.need = need
        if self.waiting or self.reserved + need > self.limit + PREFIX:
            self.waiting.append(call)
        else:
            self._grant(call)
        return 0

    def _grant(self, call: Held) -> None:
        need, call.need = call.need, 0
        self.reserved += need
        call.reserved = need
        h2 = self.h2
        missing = need - len(call.body or b"") - call.later - h2.receive_window(call.sid)
        if missing > 0:
            h2.grant(call.sid, missing)

    def queue(self, call: Held, size: int) -> None:
        """A streaming call's message, decoded, goes to its handler's queue (the first after a reservation holds
        it)."""
        held, call.reserved = call.reserved, 0
        if not held:
            call.queued += size
        call.sizes.append((size, held))  # type: ignore[union-attr]

    def handed(self, call: Held) -> None:
        """The handler took the oldest queued message: its room comes back, and the stream may send as much
        again."""
        sizes = call.sizes
        if not sizes:
            return
        size, held = sizes.popleft()
        if held:
            self._give_back(held)
        else:
            call.queued -= size
        if call.closed:
            return
        h2 = self.h2
        deficit = self.window - h2.receive_window(call.sid) - len(call.body or b"") - call.queued
        if deficit > 0 and (deficit >= self.window // 2 or not sizes):  # batched, but never left stalled
            h2.grant(call.sid, deficit)

    def release(self, call: Held) -> None:
        """The call ended: everything it held comes back."""
        held, call.reserved = call.reserved, 0
        if call.need:  # still waiting for room
            call.need = 0
            try:
                self.waiting.remove(call)
            except ValueError:
                pass
        if call.sizes:
            held += sum(h for _, h in call.sizes)
            call.sizes.clear()
        if held:
            self._give_back(held)

    def _give_back(self, n: int) -> None:
        self.reserved -= n
        waiting = self.waiting
        while waiting:
            call = waiting[0]
            if call.closed or not call.need:
                waiting.popleft()
                continue
            if self.reserved + call.need > self.limit + PREFIX:
                return
            waiting.popleft()
            self._grant(call)
