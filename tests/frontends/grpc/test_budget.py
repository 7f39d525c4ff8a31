"""The lean engine's per-connection budget over the sans-IO HTTP/2 core: stream windows open only for messages the
connection has room for, and only once room comes back; messages that can never fit are refused."""

from __future__ import annotations

import struct
from collections import deque

from hpack import Encoder

from naiad.frontends.grpc.budget import Budget, stream_window
from naiad.frontends.http2.connection import H2Connection
from naiad.frontends.http2.events import DataReceived
from naiad.frontends.http2.limits import Limits
from tests.http2_frames import frame, frames_of

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, SETTINGS, WINDOW_UPDATE = 0, 1, 4, 8
END_STREAM, ACK, END_HEADERS = 0x1, 0x1, 0x4
WINDOW = 64 * 1024
LIMIT = 1 << 20


def window_updates(data: bytes) -> dict[int, int]:
    out: dict[int, int] = {}
    while data:
        length = int.from_bytes(data[:3], "big")
        if data[3] == WINDOW_UPDATE:
            sid = int.from_bytes(data[5:9], "big")
            out[sid] = out.get(sid, 0) + int.from_bytes(data[9:13], "big")
        data = data[9 + length:]
    return out


class Call:
    def __init__(self, sid: int, streaming: bool = False) -> None:
        self.sid = sid
        self.body: bytes | bytearray | None = None
        self.later = 0
        self.closed = False
        self.reserved = 0
        self.need = 0
        self.sizes: deque[tuple[int, int]] | None = deque() if streaming else None
        self.queued = 0


class Peer:
    """A client on one H2Connection with the budget's windows."""

    def __init__(self, window: int = WINDOW, ack: bool = True, limit: int = LIMIT, streams: int = 100) -> None:
        self.h2 = H2Connection(Limits(stream_window=window, max_concurrent_streams=streams))
        self.h2.initiate()
        # ACK: our windows apply (without it, a new stream has the default 65,535 bytes: RFC 9113 6.9.2)
        self.h2.receive(PREFACE + frame(SETTINGS, 0, 0) + (frame(SETTINGS, ACK, 0) if ack else b""))
        self.h2.data_to_send()
        self.budget = Budget(self.h2, limit, window)
        self.encoder = Encoder()

    def open(self, sid: int) -> None:
        block = self.encoder.encode([(":method", "POST"), (":scheme", "http"), (":path", "/p.S/M"),
                                     (":authority", "x"), ("content-type", "application/grpc")])
        self.h2.receive(frame(HEADERS, END_HEADERS, sid, block))
        if sid in self.h2.streams:
            self.budget.windows.opened()  # as the lean engine does for each call

    def send(self, call: Call, data: bytes, end: bool = False) -> None:
        events = self.h2.receive(frame(DATA, END_STREAM if end else 0, call.sid, data))
        for event in events:
            assert isinstance(event, DataReceived), event
            call.body = bytes(call.body or b"") + bytes(event.data)


def message_head(size: int) -> bytes:
    return b"\0" + size.to_bytes(4, "big")


def test_the_announced_window_is_the_budgets_and_small_messages_need_no_room() -> None:
    peer = Peer()
    peer.open(1)
    call = Call(1)
    peer.send(call, message_head(100) + b"x" * 50)
    assert peer.budget.reserve(call) == 0 and call.reserved == 0  # it fits the window each stream has
    assert window_updates(peer.h2.data_to_send()) == {}
    assert stream_window(64 << 20, 100) == 256 * 1024 and stream_window(1 << 16, 100) == 16 * 1024


def test_a_large_message_reserves_room_and_its_window_opens_for_exactly_the_rest() -> None:
    peer = Peer()
    peer.open(1)
    call = Call(1)
    size = 600 * 1024
    peer.send(call, message_head(size) + b"x" * 1000)
    assert peer.budget.reserve(call) == 0 and call.reserved == 5 + size
    granted = window_updates(peer.h2.data_to_send())[1]
    assert granted + WINDOW == 5 + size  # the stream's window now covers the whole message, no more
    peer.send(call, b"x" * (size - 1000))
    assert peer.h2.receive_window(1) == 0


def test_a_message_that_does_not_fit_now_waits_for_room_and_one_that_never_fits_is_refused() -> None:
    peer = Peer()
    for sid in (1, 3, 5):
        peer.open(sid)
    first, second, huge = Call(1), Call(3), Call(5)
    peer.send(first, message_head(700 * 1024))
    peer.send(second, message_head(700 * 1024))
    peer.send(huge, message_head(LIMIT + 1))
    assert peer.budget.reserve(first) == 0 and peer.budget.reserve(second) == 0
    assert set(window_updates(peer.h2.data_to_send())) == {1}  # the second stalls at its initial window
    assert second.need and not second.reserved
    assert peer.budget.reserve(huge) == LIMIT + 1  # the caller answers RESOURCE_EXHAUSTED
    first.closed = True
    peer.budget.release(first)  # the first call ended: its room goes to the second
    assert set(window_updates(peer.h2.data_to_send())) == {3} and second.reserved and peer.budget.reserved == (
        second.reserved)


def test_a_streaming_calls_room_comes_back_when_its_handler_takes_the_message() -> None:
    peer = Peer()
    peer.open(1)
    call = Call(1, streaming=True)
    size = 300 * 1024
    peer.send(call, message_head(size))
    peer.budget.reserve(call)
    peer.h2.data_to_send()
    peer.send(call, b"x" * size)
    call.body = None
    peer.budget.queue(call, 5 + size)  # decoded and queued for the handler: still held
    assert peer.budget.reserved == 5 + size and peer.h2.receive_window(1) == 0
    peer.budget.handed(call)  # taken: room back, and the stream may send a window's worth again
    assert peer.budget.reserved == 0
    assert window_updates(peer.h2.data_to_send()) == {1: WINDOW}  # (a window of LIMIT // 8 couldn't hold it: not grown)
    # small messages: each gives its bytes back as the handler takes it
    peer.send(call, message_head(10) + b"y" * 10)
    call.body = None
    peer.budget.queue(call, 15)
    assert window_updates(peer.h2.data_to_send()) == {}  # not before it is taken
    peer.budget.handed(call)
    assert window_updates(peer.h2.data_to_send()) == {1: 15}


def test_room_reserved_before_the_client_acknowledged_a_smaller_window_still_covers_the_message() -> None:
    """The frames of the lean bomb test's stall (a full run with front-end processes): the client sent its first
    DATA on the default 65,535-byte window before reading our SETTINGS (33,554 with the default budget); the budget
    reserved the message on reading the first frame, and the client's ACK then shrank the stream's window by the
    difference. The grant must leave the client a window for the whole message after the ACK, as the client
    counts it, or the message stalls for good (no more room will ever be asked for it)."""
    window = 33554
    peer = Peer(window, ack=False)
    peer.open(1)
    call = Call(1)
    size = 900 * 1024
    peer.send(call, message_head(size) + b"x" * (16384 - 5))  # one read: the first frame alone
    assert peer.budget.reserve(call) == 0 and call.reserved == 5 + size
    granted = window_updates(peer.h2.data_to_send())[1]
    peer.send(call, b"x" * 16384)  # the rest of the client's default window
    peer.send(call, b"x" * 16384)
    peer.send(call, b"x" * 16383)
    peer.h2.receive(frame(SETTINGS, ACK, 0))
    sent = len(call.body or b"")
    assert sent == 65535
    # The client applies our SETTINGS' delta when it reads them and the grant when it reads the WINDOW_UPDATE.
    client_window = 65535 + (window - 65535) + granted - sent
    assert client_window == peer.h2.receive_window(1) == 5 + size - sent
    peer.send(call, b"x" * (5 + size - sent - 1))
    peer.send(call, b"x", end=True)
    assert len(call.body or b"") == 5 + size


def test_a_window_topped_up_before_the_ack_is_topped_up_to_the_budgets_window() -> None:
    """A streaming call's handler took a message before the client acknowledged our smaller window: the top-up
    counts the window the client will have after the ACK, so the stream isn't left short of a message's room."""
    window = 33554
    peer = Peer(window, ack=False)
    peer.open(1)
    call = Call(1, streaming=True)
    peer.send(call, message_head(30000) + b"y" * 30000)
    call.body = None
    peer.budget.queue(call, 30005)
    peer.budget.handed(call)
    peer.h2.data_to_send()
    peer.h2.receive(frame(SETTINGS, ACK, 0))
    assert peer.h2.receive_window(1) == window


def settings_sent(data: bytes) -> list[dict[int, int]]:
    return [dict(struct.iter_unpack(">HI", payload)) for kind, flags, _, payload in frames_of(data)
            if kind == SETTINGS and not flags & ACK]


INITIAL_WINDOW_SIZE, MAX_CONCURRENT_STREAMS = 0x4, 0x3
DEFAULTS = {"window": stream_window(64 << 20, 1000), "limit": 64 << 20, "streams": 1000}  # the engine's defaults


def test_messages_that_outgrow_the_window_grow_it_for_the_next_within_the_same_bytes_of_windows() -> None:
    """A 256 KiB request waited a round trip for its window (the client sent 32 KiB, then waited for the
    WINDOW_UPDATE). The next need not: the window grows to hold such messages, and the stream limit comes down so
    that streams times window stays what the connection had at first (half the budget)."""
    peer = Peer(**DEFAULTS)  # type: ignore[arg-type]
    peer.open(1)
    first = Call(1)
    size = 256 * 1024 + 40
    peer.send(first, message_head(size))
    assert peer.budget.reserve(first) == 0 and first.reserved == 5 + size  # this one still waits for its window
    out = peer.h2.data_to_send()
    assert settings_sent(out) == [{MAX_CONCURRENT_STREAMS: (32 << 20) // (320 << 10), INITIAL_WINDOW_SIZE: 320 << 10}]
    assert window_updates(out) == {1: 5 + size - DEFAULTS["window"]}
    peer.h2.receive(frame(SETTINGS, ACK, 0))
    assert peer.h2.stream_window * peer.h2.max_streams <= 32 << 20
    peer.open(3)
    second = Call(3)
    peer.send(second, message_head(size) + b"x" * size, end=True)  # all of it at once, in the window it had
    assert peer.budget.reserve(second) == 0 and second.reserved == 0 and len(second.body or b"") == 5 + size
    assert window_updates(peer.h2.data_to_send()) == {}


def test_the_window_grows_only_where_the_streams_open_leave_room_and_shrinks_as_the_client_opens_more() -> None:
    peer = Peer(**DEFAULTS)  # type: ignore[arg-type]
    sids = list(range(1, 2 * 40, 2))
    for sid in sids:  # 40 streams open
        peer.open(sid)
    huge = Call(sids[0])
    peer.send(huge, message_head(4 << 20))
    peer.budget.reserve(huge)
    # 80 streams (twice those open) of 4 MiB would be 320 MiB of windows: the window stays.
    assert settings_sent(peer.h2.data_to_send()) == []
    call = Call(sids[1])
    peer.send(call, message_head(300 << 10))
    peer.budget.reserve(call)
    (announced,) = settings_sent(peer.h2.data_to_send())
    assert announced == {INITIAL_WINDOW_SIZE: 320 << 10, MAX_CONCURRENT_STREAMS: (32 << 20) // (320 << 10)}
    peer.h2.receive(frame(SETTINGS, ACK, 0))
    limit = peer.h2.max_streams
    more = list(range(sids[-1] + 2, sids[-1] + 2 + 2 * (-(-limit * 3 // 4) - 40), 2))
    for sid in more:  # the client nears the lowered limit: the window gives way to streams
        peer.open(sid)
    (shrunk,) = settings_sent(peer.h2.data_to_send())
    assert shrunk[MAX_CONCURRENT_STREAMS] > limit and shrunk[INITIAL_WINDOW_SIZE] < announced[INITIAL_WINDOW_SIZE]
    assert shrunk[MAX_CONCURRENT_STREAMS] * shrunk[INITIAL_WINDOW_SIZE] <= 32 << 20
    assert not peer.h2.streams.keys() - set(sids + more)  # and none was refused
    assert len(peer.h2.streams) == len(sids + more)


def test_a_client_that_does_not_acknowledge_settings_gets_no_more_of_them() -> None:
    peer = Peer(**DEFAULTS)  # type: ignore[arg-type]
    sizes = [100 << 10, 200 << 10, 300 << 10, 400 << 10, 500 << 10]
    for index, size in enumerate(sizes):
        sid = 2 * index + 1
        peer.open(sid)
        call = Call(sid)
        peer.send(call, message_head(size))
        peer.budget.reserve(call)
    assert len(settings_sent(peer.h2.data_to_send())) == 3 and peer.h2.unacknowledged == 3
