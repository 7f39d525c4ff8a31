"""The sans-IO HTTP/2 core, driven as uvicorn's and h2's tests drive theirs: bytes in, events and bytes out.

Frames are built here independently of the core (struct + the ``hpack`` package's encoder), and what the core
writes is parsed back into frames, so each test states the wire exchange RFC 9113 asks for."""

from __future__ import annotations

import random
import struct

import pytest
from hpack import Decoder, Encoder

from naiad.frontends.http2.connection import H2Connection
from naiad.frontends.http2.events import (
    ConnectionTerminated,
    DataReceived,
    GoAwayReceived,
    RequestReceived,
    StreamReset,
    TrailersReceived,
)
from naiad.frontends.http2.limits import Limits
from tests.http2_frames import frame, frames_of

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = range(10)
END_STREAM = ACK = 0x1
END_HEADERS, PADDED, PRIORITY_FLAG = 0x4, 0x8, 0x20
# RFC 9113 section 7.
NO_ERROR, PROTOCOL_ERROR, FLOW_CONTROL_ERROR, STREAM_CLOSED, FRAME_SIZE_ERROR = 0x0, 0x1, 0x3, 0x5, 0x6
REFUSED_STREAM, CANCEL, COMPRESSION_ERROR, ENHANCE_YOUR_CALM = 0x7, 0x8, 0x9, 0xB
REQUEST = [(":method", "POST"), (":scheme", "http"), (":path", "/pkg.Service/Method"), (":authority", "localhost"),
           ("content-type", "application/grpc"), ("te", "trailers")]


def settings(*pairs: tuple[int, int]) -> bytes:
    return frame(SETTINGS, 0, 0, b"".join(struct.pack(">HI", k, v) for k, v in pairs))


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Peer:
    """A client talking to one core: builds frames, feeds them, reads back what the core wrote."""

    def __init__(self, limits: Limits | None = None, ack: bool = True, **overrides: object) -> None:
        self.clock = Clock()
        self.conn = H2Connection(limits or Limits(**overrides), clock=self.clock)  # type: ignore[arg-type]
        self.encoder = Encoder()
        self.decoder = Decoder()
        self.conn.initiate()
        self.greeting = frames_of(self.conn.data_to_send())
        self.events = self.conn.receive(PREFACE + settings())
        self.written = frames_of(self.conn.data_to_send())  # our SETTINGS' ack
        if ack:  # the client acknowledges the core's SETTINGS, as clients do once they read them
            self.events += self.conn.receive(frame(SETTINGS, ACK, 0))

    def send(self, data: bytes) -> list:
        events = self.conn.receive(data)
        self.written = frames_of(self.conn.data_to_send())
        return events

    def block(self, headers: list[tuple[str, str]] = REQUEST) -> bytes:
        return self.encoder.encode(headers)

    def request(self, sid: int, body: bytes | None = b"hello") -> list:
        head = frame(HEADERS, END_HEADERS | (END_STREAM if body is None else 0), sid, self.block())
        return self.send(head + (frame(DATA, END_STREAM, sid, body) if body is not None else b""))

    def goaway(self) -> tuple[int, int, bytes]:
        """The last stream id, error code and debug data of the GOAWAY the core wrote."""
        (payload,) = [p for kind, _, _, p in self.written if kind == GOAWAY]
        last, code = struct.unpack(">II", payload[:8])
        return last, code, payload[8:]

    def resets(self) -> list[tuple[int, int]]:
        return [(sid, struct.unpack(">I", p)[0]) for kind, _, sid, p in self.written if kind == RST_STREAM]


def test_greeting_announces_the_limits_and_opens_the_windows() -> None:
    peer = Peer()
    (kind, flags, sid, payload), (kind2, _, sid2, increment) = peer.greeting
    assert (kind, flags, sid) == (SETTINGS, 0, 0)
    announced = dict(struct.unpack(">HI", payload[i:i + 6]) for i in range(0, len(payload), 6))
    # MAX_CONCURRENT_STREAMS, INITIAL_WINDOW_SIZE, MAX_FRAME_SIZE, MAX_HEADER_LIST_SIZE
    assert announced == {3: 100, 4: 2**31 - 1, 5: 1 << 20, 6: 16384}
    assert (kind2, sid2, struct.unpack(">I", increment)[0]) == (WINDOW_UPDATE, 0, 2**31 - 1 - 65535)
    assert peer.events == [] and [(k, f) for k, f, _, _ in peer.written] == [(SETTINGS, ACK)]


def test_unary_call_in_and_one_answer_out() -> None:
    peer = Peer()
    request, data = peer.request(1, b"\0\0\0\0\x02hi")
    assert isinstance(request, RequestReceived) and request.stream_id == 1 and not request.end_stream
    assert request.headers == REQUEST and request.oversize == 0
    assert isinstance(data, DataReceived) and bytes(data.data) == b"\0\0\0\0\x02hi" and data.end_stream
    peer.conn.respond(1, b"\x88", b"answer", b"trailers")
    peer.written = frames_of(peer.conn.data_to_send())
    assert peer.written == [(HEADERS, END_HEADERS, 1, b"\x88"), (DATA, 0, 1, b"answer"),
                            (HEADERS, END_HEADERS | END_STREAM, 1, b"trailers")]
    assert not peer.conn.is_open(1)


def test_every_split_of_the_input_gives_the_same_events() -> None:
    """Reads end anywhere: inside the preface, a frame header, a payload."""
    encoder = Encoder()
    wire = (PREFACE + settings() + frame(HEADERS, END_HEADERS, 1, encoder.encode(REQUEST)) +
            frame(DATA, PADDED, 1, b"\x02" + b"abc" + b"\0\0") + frame(DATA, END_STREAM, 1, b"def") +
            frame(PING, 0, 0, b"12345678"))
    for cut in range(1, len(wire)):
        conn = H2Connection()
        events = conn.receive(wire[:cut]) + conn.receive(wire[cut:])
        assert [type(e) for e in events] == [RequestReceived, DataReceived, DataReceived], cut
        assert b"".join(bytes(e.data) for e in events[1:]) == b"abcdef"
    conn = H2Connection()
    events = [e for byte in range(len(wire)) for e in conn.receive(wire[byte:byte + 1])]
    assert [type(e) for e in events] == [RequestReceived, DataReceived, DataReceived]


def test_a_repeated_block_decodes_as_the_table_says_each_time() -> None:
    """Identical indexed-only blocks are decoded once, but a block that changed the table invalidates that."""
    peer = Peer()
    first = peer.block(REQUEST + [("x-id", "one")])
    again = peer.block(REQUEST + [("x-id", "one")])  # all references to the dynamic table now
    assert peer.send(frame(HEADERS, END_HEADERS | END_STREAM, 1, first))[0].headers[-1] == ("x-id", "one")
    assert peer.send(frame(HEADERS, END_HEADERS | END_STREAM, 3, again))[0].headers[-1] == ("x-id", "one")
    # Shrinking the table to nothing and inserting another entry: the same bytes now mean something else.
    encoder = peer.encoder
    encoder.header_table_size = 0
    flush = encoder.encode([(":method", "POST")])
    encoder.header_table_size = 4096
    peer.send(frame(HEADERS, END_HEADERS | END_STREAM, 5, flush))
    changed = encoder.encode(REQUEST + [("x-id", "two")])
    assert peer.send(frame(HEADERS, END_HEADERS | END_STREAM, 7, changed))[0].headers[-1] == ("x-id", "two")
    # The cached decoding of ``again`` would say "one"; the table now says "two".
    assert peer.send(frame(HEADERS, END_HEADERS | END_STREAM, 9, again))[0].headers[-1] == ("x-id", "two")


@pytest.mark.parametrize(("block", "leaves"), [
    (b"\x82\x84", True),  # indexed fields
    (b"\x04\x03abc\x86", True),  # literal without indexing, indexed name (:path), as nghttp2 sends :path
    (b"\x00\x01a\x01b", True),  # ... with a literal name
    (b"\x10\x01a\x81b", True),  # never indexed, Huffman flag on the value
    (b"\x04\x7f\x01" + b"x" * 128 + b"\x82", True),  # a value length past the 7-bit prefix
    (b"\x82\x40\x01a\x01b", False),  # literal with incremental indexing: the table changes
    (b"\x3f\xe1\x1f\x82", False),  # a table size update
    (b"\x04\x05ab", False),  # truncated
])
def test_blocks_that_leave_the_table_as_it_is(block: bytes, leaves: bool) -> None:
    from naiad.frontends.http2.frames import leaves_table
    assert leaves_table(block) is leaves


def test_a_repeated_literal_block_decodes_as_the_table_says_each_time() -> None:
    """nghttp2's :path literal without indexing next to references to the dynamic table: kept, and dropped once
    another block changed the table."""
    peer = Peer()
    peer.send(frame(HEADERS, END_HEADERS | END_STREAM, 1, peer.block([(":method", "POST"), ("x-id", "one")])))
    repeated = b"\x83\x04\x05/a/b1\xbe"  # :method POST, :path /a/b1 (not indexed), dynamic entry 62
    for sid in (3, 5):
        assert peer.send(frame(HEADERS, END_HEADERS | END_STREAM, sid, repeated))[0].headers == [
            (":method", "POST"), (":path", "/a/b1"), ("x-id", "one")]
    peer.send(frame(HEADERS, END_HEADERS | END_STREAM, 7, peer.block([("x-id", "two")])))  # now entry 62
    assert peer.send(frame(HEADERS, END_HEADERS | END_STREAM, 9, repeated))[0].headers[-1] == ("x-id", "two")


def test_ping_and_settings_are_acknowledged() -> None:
    peer = Peer(max_ping_strikes=0)
    peer.send(frame(PING, 0, 0, b"naiad-42"))
    assert peer.written == [(PING, ACK, 0, b"naiad-42")]
    peer.send(frame(PING, ACK, 0, b"naiad-42"))  # an ack is not answered
    assert peer.written == []
    peer.send(settings((4, 1000), (5, 20000)))
    assert peer.written == [(SETTINGS, ACK, 0, b"")]
    assert (peer.conn.initial_window, peer.conn.max_frame) == (1000, 20000)


# (frames after a healthy start, the GOAWAY code): every malformed frame is a connection error with RFC 9113's code.
CONNECTION_ERRORS = {
    "window update of 3 bytes": (frame(WINDOW_UPDATE, 0, 0, b"\0\0\1"), FRAME_SIZE_ERROR),
    "window update of 5 bytes": (frame(WINDOW_UPDATE, 0, 0, b"\0\0\0\1\0"), FRAME_SIZE_ERROR),
    "connection window update of 0": (frame(WINDOW_UPDATE, 0, 0, b"\0\0\0\0"), PROTOCOL_ERROR),
    "connection window past 2^31-1": (frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", 2**31 - 1)), FLOW_CONTROL_ERROR),
    "window update on an idle stream": (frame(WINDOW_UPDATE, 0, 11, b"\0\0\0\1"), PROTOCOL_ERROR),
    "ping of 7 bytes": (frame(PING, 0, 0, b"1234567"), FRAME_SIZE_ERROR),
    "ping on a stream": (frame(PING, 0, 1, b"12345678"), PROTOCOL_ERROR),
    "settings of 5 bytes": (frame(SETTINGS, 0, 0, b"\0\4\0\0\0"), FRAME_SIZE_ERROR),
    "settings on a stream": (frame(SETTINGS, 0, 1, b""), PROTOCOL_ERROR),
    "settings ack with a payload": (frame(SETTINGS, ACK, 0, b"\0\4\0\0\0\1"), FRAME_SIZE_ERROR),
    "initial window past 2^31-1": (settings((4, 2**31)), FLOW_CONTROL_ERROR),
    "max frame size below 16384": (settings((5, 16383)), PROTOCOL_ERROR),
    "max frame size past 2^24-1": (settings((5, 2**24)), PROTOCOL_ERROR),
    "enable push of 2": (settings((2, 2)), PROTOCOL_ERROR),
    "rst_stream of 3 bytes": (frame(RST_STREAM, 0, 1, b"\0\0\0"), FRAME_SIZE_ERROR),
    "rst_stream on stream 0": (frame(RST_STREAM, 0, 0, b"\0\0\0\x08"), PROTOCOL_ERROR),
    "rst_stream on an idle stream": (frame(RST_STREAM, 0, 9, b"\0\0\0\x08"), PROTOCOL_ERROR),
    "priority on stream 0": (frame(PRIORITY, 0, 0, b"\0\0\0\1\x10"), PROTOCOL_ERROR),
    "goaway of 7 bytes": (frame(GOAWAY, 0, 0, b"\0" * 7), FRAME_SIZE_ERROR),
    "goaway on a stream": (frame(GOAWAY, 0, 1, b"\0" * 8), PROTOCOL_ERROR),
    "push_promise from a client": (frame(PUSH_PROMISE, END_HEADERS, 1, b"\0\0\0\2\x82"), PROTOCOL_ERROR),
    "data on stream 0": (frame(DATA, 0, 0, b"x"), PROTOCOL_ERROR),
    "data on an idle stream": (frame(DATA, 0, 5, b"x"), PROTOCOL_ERROR),
    "data padding past its end": (frame(DATA, PADDED, 1, b"\x05abc"), PROTOCOL_ERROR),
    "headers on stream 0": (frame(HEADERS, END_HEADERS, 0, b"\x82"), PROTOCOL_ERROR),
    "headers on an even stream": (frame(HEADERS, END_HEADERS, 2, b"\x82"), PROTOCOL_ERROR),
    "headers padding past its end": (frame(HEADERS, END_HEADERS | PADDED, 3, b"\x09\x82"), PROTOCOL_ERROR),
    "headers too short for priority": (frame(HEADERS, END_HEADERS | PRIORITY_FLAG, 3, b"\0\0"), FRAME_SIZE_ERROR),
    "continuation without headers": (frame(CONTINUATION, END_HEADERS, 3, b"\x82"), PROTOCOL_ERROR),
    "a frame inside a header block": (frame(HEADERS, 0, 3, b"\x82") + frame(PING, 0, 0, b"12345678"),
                                      PROTOCOL_ERROR),
    "continuation of another stream": (frame(HEADERS, 0, 3, b"\x82") + frame(CONTINUATION, END_HEADERS, 5, b"\x84"),
                                       PROTOCOL_ERROR),
    "invalid hpack": (frame(HEADERS, END_HEADERS, 3, b"\xff\xff\xff\xff\xff\xff\x7f"), COMPRESSION_ERROR),
    "frame past our max frame size": (struct.pack(">I", (1 << 20) + 1)[1:] + bytes((DATA, 0)) + b"\0\0\0\1",
                                      FRAME_SIZE_ERROR),
    "too many settings in one frame": (settings(*[(4, 100)] * 33), ENHANCE_YOUR_CALM),
}


@pytest.mark.parametrize("case", list(CONNECTION_ERRORS))
def test_malformed_frames_are_connection_errors(case: str) -> None:
    wire, code = CONNECTION_ERRORS[case]
    peer = Peer()
    peer.request(1, body=None)  # stream 1 is open, so "idle" means above it
    events = peer.send(wire)
    assert [type(e) for e in events][-1:] == [ConnectionTerminated] and events[-1].error_code == code
    last, sent_code, _ = peer.goaway()
    assert (last, sent_code) == (1, code)
    # Nothing more is read, and nothing more is said.
    assert peer.send(frame(PING, 0, 0, b"12345678")) == [] and peer.written == []


def test_the_preface_must_be_http2_and_end_with_settings() -> None:
    conn = H2Connection()
    events = conn.receive(b"GET / HTTP/1.1\r\n")
    assert isinstance(events[0], ConnectionTerminated) and events[0].error_code == PROTOCOL_ERROR
    conn = H2Connection()
    events = conn.receive(PREFACE + frame(PING, 0, 0, b"12345678"))
    assert isinstance(events[0], ConnectionTerminated) and events[0].error_code == PROTOCOL_ERROR
    conn = H2Connection()
    assert conn.receive(PREFACE[:10]) == []  # so far, so good


@pytest.mark.parametrize("case", ["zero increment", "window past 2^31-1", "priority of 4 bytes",
                                  "priority on itself", "data after end of stream", "trailers without end of stream"])
def test_stream_errors_reset_the_stream_and_keep_the_connection(case: str) -> None:
    peer = Peer()
    if case == "data after end of stream":
        peer.request(1, body=None)
    else:
        peer.send(frame(HEADERS, END_HEADERS, 1, peer.block()))  # a call still sending
    wire, code = {
        "zero increment": lambda: (frame(WINDOW_UPDATE, 0, 1, b"\0\0\0\0"), PROTOCOL_ERROR),
        "window past 2^31-1": lambda: (frame(WINDOW_UPDATE, 0, 1, struct.pack(">I", 2**31 - 1)), FLOW_CONTROL_ERROR),
        "priority of 4 bytes": lambda: (frame(PRIORITY, 0, 1, b"\0\0\0\3"), FRAME_SIZE_ERROR),
        "priority on itself": lambda: (frame(PRIORITY, 0, 1, b"\0\0\0\1\x10"), PROTOCOL_ERROR),
        "data after end of stream": lambda: (frame(DATA, 0, 1, b"late"), STREAM_CLOSED),
        "trailers without end of stream": lambda: (frame(HEADERS, END_HEADERS, 1, peer.block([("x-t", "1")])),
                                                   PROTOCOL_ERROR),
    }[case]()
    events = peer.send(wire)
    assert peer.resets() == [(1, code)]
    assert [(type(e), e.stream_id, e.error_code, e.remote) for e in events] == [(StreamReset, 1, code, False)]
    assert not peer.conn.is_open(1)
    assert isinstance(peer.request(3)[0], RequestReceived)  # the connection still serves


def test_client_reset_is_reported_and_late_frames_for_it_are_ignored() -> None:
    peer = Peer()
    peer.request(1, body=None)
    events = peer.send(frame(RST_STREAM, 0, 1, struct.pack(">I", CANCEL)))
    assert [(type(e), e.stream_id, e.error_code, e.remote) for e in events] == [(StreamReset, 1, CANCEL, True)]
    peer.conn.respond(1, b"\x88", b"too late", b"t")  # the application answering meanwhile is harmless
    assert peer.conn.data_to_send() == b""
    assert peer.send(frame(WINDOW_UPDATE, 0, 1, b"\0\0\0\1") + frame(RST_STREAM, 0, 1, b"\0\0\0\x08")) == []
    assert peer.written == []


def test_trailers_end_the_request() -> None:
    peer = Peer()
    peer.send(frame(HEADERS, END_HEADERS, 1, peer.block()) + frame(DATA, 0, 1, b"abc"))
    events = peer.send(frame(HEADERS, END_HEADERS | END_STREAM, 1, peer.block([("x-trailer", "1")])))
    assert [type(e) for e in events] == [TrailersReceived] and events[0].headers == [("x-trailer", "1")]


def test_streams_past_the_limit_are_refused_and_their_blocks_still_decoded() -> None:
    peer = Peer(max_concurrent_streams=3)
    for sid in (1, 3, 5):
        assert isinstance(peer.request(sid, body=None)[0], RequestReceived)
    # Stream 7 indexes a new field; stream 9's block refers to it: skipping 7's block would break 9.
    block7 = peer.block(REQUEST + [("x-new", "value")])
    assert peer.send(frame(HEADERS, END_HEADERS | END_STREAM, 7, block7)) == []
    assert peer.resets() == [(7, REFUSED_STREAM)]
    peer.conn.respond(1, b"\x88", None, b"t")
    peer.conn.data_to_send()
    block9 = peer.block(REQUEST + [("x-new", "value")])
    (event,) = peer.send(frame(HEADERS, END_HEADERS | END_STREAM, 9, block9))
    assert event.stream_id == 9 and event.headers[-1] == ("x-new", "value")


def test_header_list_over_the_limit_opens_the_stream_for_the_application_to_refuse() -> None:
    peer = Peer()
    (small,) = peer.request(1, body=None)
    assert small.oversize == 0
    (large,) = peer.send(frame(
        HEADERS, END_HEADERS | END_STREAM, 3, peer.encoder.encode(REQUEST + [("x-big", "a" * 17000)], huffman=False)))
    size = sum(len(n) + len(v) + 32 for n, v in REQUEST) + len("x-big") + 17000 + 32
    assert isinstance(large, RequestReceived) and large.oversize == size
    assert peer.conn.is_open(3)


def test_continuation_flood_closes_before_it_is_buffered() -> None:
    """2,000 CONTINUATION frames of 16 KiB once buffered 31 MiB: now the block stops at 64 KiB."""
    peer = Peer()
    chunk = frame(CONTINUATION, 0, 1, b"\x82" * 16384)
    events = peer.send(frame(HEADERS, 0, 1, b"\x82") + chunk * 2000)
    assert isinstance(events[-1], ConnectionTerminated) and events[-1].error_code == ENHANCE_YOUR_CALM
    assert peer.goaway()[1] == ENHANCE_YOUR_CALM
    assert len(peer.conn._block) <= Limits().max_header_block and not peer.conn._buf


def test_many_tiny_continuations_close_the_connection() -> None:
    peer = Peer()
    events = peer.send(frame(HEADERS, 0, 1, b"\x82") + frame(CONTINUATION, 0, 1, b"") * 64)
    assert isinstance(events[-1], ConnectionTerminated) and events[-1].error_code == ENHANCE_YOUR_CALM


def test_hpack_bomb_closes_the_connection() -> None:
    """A 4 KiB table entry referenced thousands of times: a tiny block, a huge header list."""
    peer = Peer()
    bomb_entry = peer.block([("x-bomb", "b" * 4000)])
    peer.send(frame(HEADERS, END_HEADERS | END_STREAM, 1, peer.block(REQUEST) + bomb_entry))
    index = b"\xbe"  # the newest dynamic entry (62)
    events = peer.send(frame(HEADERS, END_HEADERS | END_STREAM, 3, index * 40))
    assert isinstance(events[-1], ConnectionTerminated) and events[-1].error_code == ENHANCE_YOUR_CALM


def test_rapid_reset_runs_out_of_tokens() -> None:
    peer = Peer(reset_burst=10, reset_rate=1.0)
    wire = b""
    for i in range(10):
        sid = 1 + 2 * i
        wire += frame(HEADERS, END_HEADERS, sid, peer.block()) + frame(RST_STREAM, 0, sid, b"\0\0\0\x08")
    events = peer.send(wire)
    assert sum(isinstance(e, StreamReset) for e in events) == 10 and not peer.conn.terminated
    peer.clock.now += 1.0  # one token back
    sid = 21
    assert not any(isinstance(e, ConnectionTerminated) for e in peer.send(
        frame(HEADERS, END_HEADERS, sid, peer.block()) + frame(RST_STREAM, 0, sid, b"\0\0\0\x08")))
    events = peer.send(frame(HEADERS, END_HEADERS, 23, peer.block()) + frame(RST_STREAM, 0, 23, b"\0\0\0\x08"))
    assert isinstance(events[-1], ConnectionTerminated) and events[-1].error_code == ENHANCE_YOUR_CALM


def test_resets_at_a_sustainable_rate_never_trip() -> None:
    peer = Peer(reset_burst=10, reset_rate=10.0)
    for i in range(200):
        sid = 1 + 2 * i
        peer.clock.now += 0.1
        peer.send(frame(HEADERS, END_HEADERS, sid, peer.block()) + frame(RST_STREAM, 0, sid, b"\0\0\0\x08"))
    assert not peer.conn.terminated


def test_streams_answered_before_the_reset_do_not_count() -> None:
    peer = Peer(reset_burst=2)
    for i in range(10):
        sid = 1 + 2 * i
        peer.request(sid, body=None)
        peer.conn.respond(sid, b"\x88", b"x", b"t")
        peer.send(frame(RST_STREAM, 0, sid, b"\0\0\0\x08"))
    assert not peer.conn.terminated


def test_deadline_resets_of_calls_being_served_do_not_count() -> None:
    """A client whose deadlines expire: whole requests, reset 50 ms after they opened (grpc's RST_STREAM CANCEL)."""
    peer = Peer(reset_burst=2, reset_rate=0.0)
    for i in range(50):
        sid = 1 + 2 * i
        peer.request(sid, body=None)
        peer.clock.now += 0.05
        assert [type(e) for e in peer.send(frame(RST_STREAM, 0, sid, b"\0\0\0\x08"))] == [StreamReset]
    assert not peer.conn.terminated


def test_resets_right_after_opening_count_even_for_whole_requests() -> None:
    peer = Peer(reset_burst=5, reset_rate=0.0)
    wire = b"".join(frame(HEADERS, END_HEADERS | END_STREAM, 1 + 2 * i, peer.block())
                    + frame(RST_STREAM, 0, 1 + 2 * i, b"\0\0\0\x08") for i in range(6))
    events = peer.send(wire)
    assert isinstance(events[-1], ConnectionTerminated) and events[-1].error_code == ENHANCE_YOUR_CALM
    peer = Peer(reset_burst=5, reset_rate=0.0)
    for i in range(6):  # 9 ms: still the rapid-reset pattern
        sid = 1 + 2 * i
        peer.request(sid, body=None)
        peer.clock.now += 0.009
        events = peer.send(frame(RST_STREAM, 0, sid, b"\0\0\0\x08"))
    assert isinstance(events[-1], ConnectionTerminated)


def test_late_resets_of_requests_still_arriving_count() -> None:
    """The request never reached a handler: however old the stream, its reset is the attack's shape."""
    peer = Peer(reset_burst=5, reset_rate=0.0)
    for i in range(6):
        sid = 1 + 2 * i
        peer.send(frame(HEADERS, END_HEADERS, sid, peer.block()) + frame(DATA, 0, sid, b"\0\0\0"))
        peer.clock.now += 1.0
        events = peer.send(frame(RST_STREAM, 0, sid, b"\0\0\0\x08"))
    assert isinstance(events[-1], ConnectionTerminated) and events[-1].error_code == ENHANCE_YOUR_CALM


def test_refused_streams_count_like_resets() -> None:
    peer = Peer(max_concurrent_streams=1, reset_burst=5, reset_rate=0.0)
    peer.request(1, body=None)
    wire = b"".join(frame(HEADERS, END_HEADERS | END_STREAM, 3 + 2 * i, peer.block()) for i in range(6))
    events = peer.send(wire)
    assert isinstance(events[-1], ConnectionTerminated) and events[-1].error_code == ENHANCE_YOUR_CALM


def test_ping_strikes_follow_grpc_core() -> None:
    peer = Peer()  # 300 s between pings, 2 strikes, pings without calls not permitted (2 h)
    for _ in range(3):  # the first ping sets the clock; two strikes are allowed
        peer.send(frame(PING, 0, 0, b"12345678"))
        assert peer.written == [(PING, ACK, 0, b"12345678")]
    events = peer.send(frame(PING, 0, 0, b"12345678"))
    assert isinstance(events[-1], ConnectionTerminated) and peer.goaway()[1:] == (ENHANCE_YOUR_CALM, b"too_many_pings")


def test_pings_spaced_out_or_between_answers_are_fine() -> None:
    peer = Peer()
    peer.request(1, body=None)  # a call in flight: 300 s suffice
    for _ in range(10):
        peer.clock.now += 301
        peer.send(frame(PING, 0, 0, b"12345678"))
    assert not peer.conn.terminated
    peer = Peer()
    for i in range(10):  # sending HEADERS or DATA forgives earlier pings
        peer.request(1 + 2 * i, body=None)
        peer.send(frame(PING, 0, 0, b"12345678"))
        peer.conn.respond(1 + 2 * i, b"\x88", b"x", b"t")
    assert not peer.conn.terminated
    peer = Peer(max_ping_strikes=0)  # --grpc-http2-max-ping-strikes 0: no limit
    peer.send(frame(PING, 0, 0, b"12345678") * 100)
    assert not peer.conn.terminated


def test_idle_pings_need_two_hours_unless_permitted() -> None:
    peer = Peer()
    for _ in range(4):
        peer.clock.now += 400  # past 300 s, but no call is in flight
        peer.send(frame(PING, 0, 0, b"12345678"))
    assert peer.conn.terminated
    peer = Peer(ping_without_calls=True)
    for _ in range(4):
        peer.clock.now += 400
        peer.send(frame(PING, 0, 0, b"12345678"))
    assert not peer.conn.terminated


@pytest.mark.parametrize("flood", [frame(PING, 0, 0, b"12345678"), settings()])
def test_control_frames_queued_for_a_peer_that_does_not_read(flood: bytes) -> None:
    peer = Peer(max_ping_strikes=0, max_induced_frames=100)
    peer.send(flood * 1000)  # written as fast as asked: no limit
    assert not peer.conn.terminated
    peer.conn.pause_writing()
    peer.send(flood * 100)
    peer.conn.resume_writing()  # it read: the count starts again
    peer.conn.pause_writing()
    events = peer.send(flood * 101)
    assert isinstance(events[-1], ConnectionTerminated) and peer.goaway()[1] == ENHANCE_YOUR_CALM


def test_send_flow_control_follows_the_peers_windows() -> None:
    peer = Peer()
    peer.send(settings((4, 10)))  # 10-byte stream windows
    peer.request(1)
    peer.conn.send_headers(1, b"\x88")
    peer.conn.send_data(1, b"0123456789abcdef")
    peer.conn.send_headers(1, b"trailers", end_stream=True)
    assert [(k, p) for k, _, _, p in frames_of(peer.conn.data_to_send())] == [(HEADERS, b"\x88"),
                                                                            (DATA, b"0123456789")]
    peer.send(settings((4, 13)))  # the change applies to open streams
    assert [(k, p) for k, _, _, p in peer.written] == [(SETTINGS, b""), (DATA, b"abc")]
    peer.send(frame(WINDOW_UPDATE, 0, 1, struct.pack(">I", 100)))
    assert [(k, f, p) for k, f, _, p in peer.written] == [(DATA, 0, b"def"),
                                                          (HEADERS, END_HEADERS | END_STREAM, b"trailers")]
    assert not peer.conn.is_open(1)


def test_connection_window_is_shared_and_large_data_is_framed() -> None:
    peer = Peer()
    peer.request(1)
    peer.conn.send_data(1, b"x" * 70000)
    sizes = [len(p) for k, _, _, p in frames_of(peer.conn.data_to_send()) if k == DATA]
    assert sizes == [16384, 16384, 16384, 16383]  # the peer's max frame size, then the 65535 window
    peer.send(frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", 10)))
    assert [len(p) for k, _, _, p in peer.written if k == DATA] == []  # the stream's window is spent too
    peer.send(frame(WINDOW_UPDATE, 0, 1, struct.pack(">I", 100000)))
    assert [len(p) for k, _, _, p in peer.written if k == DATA] == [10]


def test_long_header_blocks_go_out_in_continuation_frames() -> None:
    peer = Peer()
    peer.request(1)
    peer.conn.send_headers(1, b"\x82" * 40000, end_stream=True)
    written = frames_of(peer.conn.data_to_send())
    assert [(k, f, len(p)) for k, f, _, p in written] == [
        (HEADERS, END_STREAM, 16384), (CONTINUATION, 0, 16384), (CONTINUATION, END_HEADERS, 40000 - 32768)]


def test_receive_windows_are_topped_up_and_enforced() -> None:
    peer = Peer(receive_window=100000)
    peer.send(frame(HEADERS, END_HEADERS, 1, peer.block()))
    peer.send(frame(DATA, 0, 1, b"x" * 40000))
    assert peer.written == []
    peer.send(frame(DATA, 0, 1, b"x" * 20000))  # below half: both windows are topped up
    assert [(k, s, struct.unpack(">I", p)[0]) for k, _, s, p in peer.written] == [
        (WINDOW_UPDATE, 0, 60000), (WINDOW_UPDATE, 1, 60000)]
    peer = Peer(receive_window=100000)
    peer.send(frame(HEADERS, END_HEADERS, 1, peer.block()))
    # More than the window in one frame: the connection window is exceeded first.
    events = peer.send(frame(DATA, 0, 1, b"x" * 100001))
    assert isinstance(events[-1], ConnectionTerminated) and events[-1].error_code == FLOW_CONTROL_ERROR


def test_before_the_client_acknowledges_our_settings_a_stream_has_the_default_window() -> None:
    """RFC 9113 6.9.2: a client may send on a new stream as the default 65,535-byte window allows until it has read
    (and acknowledged) a smaller SETTINGS_INITIAL_WINDOW_SIZE; then its windows shrink by the difference."""
    peer = Peer(ack=False, stream_window=16384)
    peer.send(frame(HEADERS, END_HEADERS, 1, peer.block()))
    events = peer.send(frame(DATA, 0, 1, b"x" * 60000))
    assert [type(e) for e in events] == [DataReceived] and peer.resets() == []
    assert peer.conn.streams[1].recv_window == 5535
    # The window the application reads is the one the client is sure of: ours (smaller), before the ACK as after.
    assert peer.conn.receive_window(1) == 5535 - (65535 - 16384)
    peer.send(frame(SETTINGS, ACK, 0))
    assert peer.conn.receive_window(1) == 5535 - (65535 - 16384)  # as the client now counts it: negative
    peer.send(frame(HEADERS, END_HEADERS, 3, peer.block()))
    assert peer.conn.receive_window(3) == 16384
    peer.send(frame(DATA, 0, 3, b"x" * 16385))
    assert peer.resets() == [(3, FLOW_CONTROL_ERROR)]


def test_answer_before_the_request_ended_resets_the_rest() -> None:
    """As grpc-core does: trailers, then RST_STREAM NO_ERROR; the request's later DATA is not an error."""
    peer = Peer()
    peer.send(frame(HEADERS, END_HEADERS, 1, peer.block()))
    peer.conn.send_headers(1, b"\x88trailers-only", end_stream=True)
    written = frames_of(peer.conn.data_to_send())
    assert [(k, f) for k, f, _, _ in written] == [(HEADERS, END_HEADERS | END_STREAM), (RST_STREAM, 0)]
    assert written[1][3] == struct.pack(">I", NO_ERROR)
    assert peer.send(frame(DATA, END_STREAM, 1, b"rest")) == [] and peer.written == []


def test_goaway_both_ways() -> None:
    peer = Peer()
    peer.request(1, body=None)
    events = peer.send(frame(GOAWAY, 0, 0, struct.pack(">II", 0, NO_ERROR)))
    assert [(type(e), e.error_code) for e in events] == [(GoAwayReceived, NO_ERROR)]
    peer.conn.close()
    assert peer.conn.data_to_send() == frame(GOAWAY, 0, 0, struct.pack(">II", 1, NO_ERROR))
    assert peer.send(frame(HEADERS, END_HEADERS | END_STREAM, 3, peer.block())) == []
    assert peer.resets() == [(3, REFUSED_STREAM)]
    peer.conn.respond(1, b"\x88", b"x", b"t")  # streams in flight still finish
    assert [k for k, _, _, _ in frames_of(peer.conn.data_to_send())] == [HEADERS, DATA, HEADERS]


def test_random_frames_never_raise() -> None:
    """Whatever arrives, the core answers with frames and events, not exceptions."""
    rng = random.Random(11)
    for _ in range(300):
        peer = Peer(max_ping_strikes=0)
        for _ in range(30):
            kind = rng.choice([DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY,
                               WINDOW_UPDATE, CONTINUATION, 0x20])
            payload = rng.randbytes(rng.choice([0, 1, 3, 4, 5, 6, 8, 9, 12, 30]))
            if kind == HEADERS and rng.random() < 0.5:
                payload = peer.block()
            peer.send(frame(kind, rng.randrange(256), rng.choice([0, 1, 2, 3, 5, 2**31 - 1]), payload))
            peer.conn.respond(1, b"\x88", b"x", b"t")
            if peer.conn.terminated:
                break


def test_big_data_frame_is_handed_on_as_it_arrives() -> None:
    peer = Peer(max_frame_size=1 << 20)
    peer.send(frame(HEADERS, END_HEADERS, 1, peer.block()))
    body = bytes(range(256)) * 1024  # 256 KiB in one DATA frame, read in three pieces
    wire = frame(DATA, END_STREAM, 1, body)
    pieces = [wire[:5], wire[5:100000], wire[100000:200000], wire[200000:]]
    got = []
    for piece in pieces:
        events = peer.send(bytes(piece))
        got += [e for e in events if isinstance(e, DataReceived)]
    assert b"".join(bytes(e.data) for e in got) == body
    assert [e.end_stream for e in got] == [False] * (len(got) - 1) + [True]
    assert peer.conn.receive_window(1) == 0  # the client ended the stream
    # The windows counted the whole frame when its header came: a frame past them is refused at once.
    peer = Peer(receive_window=100000)
    peer.send(frame(HEADERS, END_HEADERS, 1, peer.block()))
    events = peer.send(frame(DATA, 0, 1, b"x" * 100001)[:70000])
    assert isinstance(events[-1], ConnectionTerminated) and events[-1].error_code == FLOW_CONTROL_ERROR


def test_a_big_payload_read_to_the_applications_memory_comes_back_as_views_of_it() -> None:
    peer = Peer(max_frame_size=1 << 20)
    peer.send(frame(HEADERS, END_HEADERS, 1, peer.block()))
    body = bytes(range(256)) * 1024
    wire = frame(DATA, END_STREAM, 1, body)
    assert peer.conn.payload_due() == (0, 0) and peer.conn.header_due() == 9
    # The frame's header split over two reads (gathered, not bytes) still hands the payload on as it comes.
    events = peer.send(wire[:4])
    assert peer.conn.header_due() == 5
    events += peer.send(wire[4:1009])
    assert peer.conn.header_due() == 0
    assert [bytes(e.data) for e in events] == [body[:1000]]
    assert peer.conn.payload_due() == (1, len(body) - 1000)
    mine = bytearray(len(body))  # where the application keeps the stream's data; the rest is read to it
    at = 1000
    for size in (60000, 100000, len(body) - 161000):
        mine[at:at + size] = body[at:at + size]  # (what a read from the socket into this memory would do)
        (event,) = peer.send(memoryview(mine)[at:at + size])  # type: ignore[arg-type]
        assert event.data.obj is mine and bytes(event.data) == body[at:at + size]  # a view, not a copy
        at += size
        assert peer.conn.payload_due() == ((1, len(body) - at) if at < len(body) else (0, 0))
    assert event.end_stream


def test_big_data_frame_for_an_answered_stream_is_dropped_and_the_next_frame_read() -> None:
    peer = Peer(max_frame_size=1 << 20)
    peer.send(frame(HEADERS, END_HEADERS, 1, peer.block()))
    wire = frame(DATA, END_STREAM, 1, b"y" * 200000)
    assert [type(e) for e in peer.send(wire[:70000])] == [DataReceived]
    peer.conn.respond(1, b"\x88", b"", b"\x88")  # answered before the request ended: the rest is not wanted
    events = peer.send(wire[70000:] + frame(HEADERS, END_HEADERS | END_STREAM, 3, peer.block()))
    assert [type(e) for e in events] == [RequestReceived]
    assert events[0].stream_id == 3


def test_big_data_payloads_are_sent_apart_from_their_headers() -> None:
    peer = Peer()  # the client's SETTINGS: 1 MiB frames (5), 4 MiB stream windows (4)
    peer.send(settings((5, 1 << 20), (4, 1 << 22)) + frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", 1 << 22)))
    peer.request(1)
    payload = memoryview(bytes(range(256)) * 8192)  # 2 MiB: two frames of the peer's 1 MiB
    peer.conn.send_data(1, payload)
    buffers = peer.conn.buffers_to_send()
    assert [len(b) for b in buffers] == [9, 1 << 20, 9, 1 << 20]
    assert all(type(b) is memoryview for b in buffers[1::2])  # views of the payload, not copies
    assert [len(p) for k, _, _, p in frames_of(b"".join(buffers)) if k == DATA] == [1 << 20, 1 << 20]
    assert b"".join(buffers[1::2]) == payload


def test_a_raised_stream_window_counts_at_once_and_a_lowered_one_from_its_ack() -> None:
    """``settle``: the client applies our SETTINGS as it reads them, so a larger window may be used at once (what a
    stream may receive grows now) while the application counts only on the smaller until the ACK; a smaller one
    holds from its ACK on (streams opened meanwhile may still be sent the larger)."""
    peer = Peer(stream_window=16384)
    peer.conn.settle(65536, 50)
    assert [(k, struct.unpack(">HIHI", p)) for k, _, _, p in frames_of(peer.conn.data_to_send())] == [
        (SETTINGS, (0x3, 50, 0x4, 65536))]
    peer.send(frame(HEADERS, END_HEADERS, 1, peer.block()))
    assert peer.conn.receive_window(1) == 16384  # the client may not have read it yet
    peer.send(frame(DATA, 0, 1, b"x" * 60000))  # it had: within the larger window
    assert peer.resets() == [] and peer.conn.receive_window(1) == 16384 - 60000
    peer.send(frame(SETTINGS, ACK, 0))
    assert peer.conn.receive_window(1) == 65536 - 60000 and peer.conn.unacknowledged == 0
    peer.conn.settle(16384, 100)
    peer.send(frame(HEADERS, END_HEADERS, 3, peer.block()))
    assert peer.conn.streams[3].recv_window == 65536 and peer.conn.receive_window(3) == 16384
    peer.send(frame(SETTINGS, ACK, 0))
    assert peer.conn.receive_window(3) == 16384 and peer.conn.receive_window(1) == 16384 - 60000
    peer.send(frame(DATA, 0, 3, b"x" * 16385))
    assert peer.resets() == [(3, FLOW_CONTROL_ERROR)]


def test_streams_opened_past_a_lowered_limit_before_the_client_read_it_are_refused() -> None:
    peer = Peer(max_concurrent_streams=100, reset_burst=2, reset_rate=0.0)
    peer.conn.settle(65536, 2)
    peer.send(frame(HEADERS, END_HEADERS, 1, peer.block()) + frame(HEADERS, END_HEADERS, 3, peer.block()))
    assert peer.resets() == []
    for sid in (5, 7, 9):
        peer.send(frame(HEADERS, END_HEADERS, sid, peer.block()))
        assert peer.resets() == [(sid, REFUSED_STREAM)]  # clients retry a refused stream
    # The client hadn't read the lower limit: those refusals cost it none of its reset tokens (2 here). Once it
    # acknowledged the limit, streams past it count as before.
    peer.send(frame(SETTINGS, ACK, 0))
    for sid in (11, 13):
        peer.send(frame(HEADERS, END_HEADERS, sid, peer.block()))
    assert not peer.conn.terminated
    events = peer.send(frame(HEADERS, END_HEADERS, 15, peer.block()))
    assert isinstance(events[-1], ConnectionTerminated) and events[-1].error_code == ENHANCE_YOUR_CALM
