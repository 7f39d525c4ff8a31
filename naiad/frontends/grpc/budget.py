"""What one lean-engine connection may hold of its requests: a byte budget, with HTTP/2 flow control opened only
within it (--grpc-max-connection-buffer).

Each stream may send ``window`` bytes unasked (SETTINGS_INITIAL_WINDOW_SIZE): small messages arrive at once, as
before. A message larger than that (its 5-byte gRPC prefix says how large) reserves its whole size from the
connection's budget before its stream's window opens for the rest; one that doesn't fit now waits, its stream
stalled, until others give room back (first come, first served); one larger than the budget can never fit and is
refused. Reserving whole messages keeps streams from deadlocking on half-received messages that together fill the
budget. Room comes back when the server is done with the bytes: a unary call's when the call ends (so the budget
also covers requests queued for the model), a streaming call's message when its handler takes it.

The window adapts to the connection (``Windows``), as grpc-core's grows from measured bandwidth: a message that had
to wait for its window costs a round trip to the client, which at 256 KiB is a fifth of the call. So when messages
outgrow the window and the connection has few streams open, the window is raised to hold them, and the stream limit
(SETTINGS_MAX_CONCURRENT_STREAMS) lowered so that windows times streams stays what it was; when the client opens
streams up to that limit, both go back. So a connection holds at most ``limit`` bytes of large messages plus
``streams * window`` (``limit / 2`` by default) of messages within their windows, whatever it sends.
"""

from __future__ import annotations

from collections import deque
from typing import Protocol

from naiad.frontends.http2.connection import H2Connection

PREFIX = 5  # a gRPC message's compressed flag and length


def message_need(body: bytes | bytearray | memoryview) -> int:
    """The bytes of the gRPC message at the start of ``body`` (at least its prefix), prefix included."""
    return PREFIX + int.from_bytes(body[1:PREFIX], "big")


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


STEP = 64 * 1024  # an adapted window holds the messages seen, rounded up to this
FEW_STREAMS = 16  # an adapted stream limit is never below this (nor below twice the streams recently open)
PEAK_SECONDS = 1.0  # how long the most streams seen open keeps the window from growing past them


class Windows:
    """The stream window and stream limit one connection announces, traded against each other within
    ``streams * window``: grown for the messages that outgrow the window while few streams are open, shrunk back
    as the client opens more."""

    __slots__ = ("h2", "least", "most", "streams", "exposure", "peak", "peak_since")

    def __init__(self, h2: H2Connection, limit: int, window: int) -> None:
        self.h2 = h2
        self.least = window  # the window announced first (``stream_window``)
        self.most = max(window, min(limit // 8, 16 * 1024 * 1024))
        self.streams = h2.limits.max_concurrent_streams
        self.exposure = max(limit // 2, self.streams * window)  # windows times streams: never more than at first
        self.peak = 0
        self.peak_since = 0.0

    def opened(self) -> None:
        """A stream opened: note how many are open, and give streams back if the client nears their limit."""
        h2 = self.h2
        n = len(h2.streams)
        now = h2.clock()
        if n > self.peak or now - self.peak_since > PEAK_SECONDS:
            self.peak, self.peak_since = n, now
        if h2.stream_window > self.least and n * 4 >= h2.max_streams * 3:
            self._announce(max(self.least, self.exposure // (4 * n)))

    def outgrown(self, need: int) -> None:
        """A message of ``need`` bytes (prefix included) did not fit its stream's window: a window that holds the
        next such message, if the streams recently open leave room for it. (One that still couldn't hold it would save
        little: the wait comes after the window's bytes instead of after the first, and a message that large takes
        longer to send than the wait.)"""
        h2 = self.h2
        if need <= h2.stream_window or h2.unacknowledged > 2:  # (a client that does not acknowledge gets no more)
            return
        streams = max(FEW_STREAMS, 2 * self.peak, len(h2.streams) + 1)
        window = min(self.most, -(-need // STEP) * STEP, self.exposure // streams)
        if window >= need:
            self._announce(window)

    def _announce(self, window: int) -> None:
        self.h2.settle(window, min(self.streams, self.exposure // window))


class Budget:
    __slots__ = ("h2", "limit", "windows", "reserved", "waiting")

    def __init__(self, h2: H2Connection, limit: int, window: int) -> None:
        self.h2 = h2
        self.limit = limit  # bytes of messages (their prefixes come on top)
        self.windows = Windows(h2, limit, window)
        self.reserved = 0
        self.waiting: deque[Held] = deque()

    def reserve(self, call: Held) -> int:
        """The message at the start of ``call.body`` is still arriving: if its stream's window can't take all of
        it, reserve room and open the window for the rest, or queue the call for room. Returns the message's size
        when it is larger than the budget (the caller refuses the call), else 0."""
        body = call.body
        if call.reserved or call.need or body is None or len(body) < PREFIX:
            return 0
        need = message_need(body)
        size = need - PREFIX
        if need <= self.h2.stream_window:
            return 0  # the stream's own window holds it
        if size > self.limit:
            return size
        self.windows.outgrown(need)
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
        window = h2.stream_window
        deficit = window - h2.receive_window(call.sid) - len(call.body or b"") - call.queued
        if deficit > 0 and (deficit >= window // 2 or not sizes):  # batched, but never left stalled
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
