"""The HTTP/1.1 protocol's limits, fed raw bytes: a fake transport records what is written and when reading pauses,
and a clock the test advances drives the connection's timer (deferred answers are futures the test completes)."""

from __future__ import annotations

import asyncio
import heapq
from collections.abc import Callable

import httptools
import orjson
import pytest

from naiad.frontends.http.limits import HttpLimits, Listener
from naiad.frontends.http.protocol import LINGER, HttpProtocol
from naiad.frontends.replies import Deferred, Reply, Streamed


class Transport:
    def __init__(self) -> None:
        self.out = bytearray()
        self.events: list[str] = []  # pause / resume / eof / close / abort, in order
        self.reading = True
        self.high: int | None = None
        self.buffered = 0  # bytes the "transport" still holds (not yet handed to the kernel)

    def write(self, data: bytes) -> None:
        assert "close" not in self.events and "abort" not in self.events, "written after close"
        self.out += data

    def writelines(self, chunks: list[bytes]) -> None:
        for chunk in chunks:
            self.write(chunk)

    def pause_reading(self) -> None:
        assert self.reading, "paused twice"
        self.reading = False
        self.events.append("pause")

    def resume_reading(self) -> None:
        assert not self.reading, "resumed while reading"
        self.reading = True
        self.events.append("resume")

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        self.high = high

    def get_write_buffer_size(self) -> int:
        return self.buffered

    def get_extra_info(self, name: str, default: object = None) -> object:
        return ("127.0.0.1", 50000) if name == "peername" else default

    def can_write_eof(self) -> bool:
        return True

    def write_eof(self) -> None:
        self.events.append("eof")

    def close(self) -> None:
        self.events.append("close")

    def abort(self) -> None:
        self.events.append("abort")

    @property
    def closed(self) -> bool:
        return "close" in self.events or "abort" in self.events

    def responses(self) -> list[tuple[int, dict[bytes, bytes], bytes]]:
        return parse_responses(bytes(self.out))


class Clock:
    """The two loop methods the protocol's timer uses, on a time the test moves."""

    def __init__(self) -> None:
        self.now = 0.0
        self.queue: list[tuple[float, int, Handle]] = []
        self.count = 0

    def time(self) -> float:
        return self.now

    def call_at(self, when: float, callback: Callable[[], None]) -> Handle:
        handle = Handle(callback)
        self.count += 1
        heapq.heappush(self.queue, (when, self.count, handle))
        return handle

    def call_later(self, delay: float, callback: Callable[[], None]) -> Handle:
        return self.call_at(self.now + delay, callback)

    def advance(self, seconds: float) -> None:
        end = self.now + seconds
        while self.queue and self.queue[0][0] <= end:
            when, _, handle = heapq.heappop(self.queue)
            self.now = max(self.now, when)
            if not handle.cancelled:
                handle.callback()
        self.now = end

    def armed(self) -> int:
        return sum(not h.cancelled for _, _, h in self.queue)


class Handle:
    def __init__(self, callback: Callable[[], None]) -> None:
        self.callback = callback
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class Work:
    """A deferred answer's future, completed by the test (callbacks run at once)."""

    def __init__(self) -> None:
        self.callbacks: list[Callable] = []
        self.state = "pending"
        self.value = b""

    def add_done_callback(self, callback: Callable) -> None:
        self.callbacks.append(callback)

    def done(self) -> bool:
        return self.state != "pending"

    def cancelled(self) -> bool:
        return self.state == "cancelled"

    def cancel(self) -> None:
        self.state = "cancelled"

    def finish(self, value: bytes) -> None:
        self.state, self.value = "done", value
        for callback in self.callbacks:
            callback(self)


class Router:
    """``/now/<x>`` answers inline, ``/later/<x>`` once the test finishes its work, ``/stream`` in parts."""

    def __init__(self) -> None:
        self.work: list[Work] = []
        self.seen: list[str] = []
        self.stream: Streamed | None = None

    def handle(self, method: bytes, path: str, headers: dict, body: bytes | bytearray) -> Reply | Deferred | Streamed:
        self.seen.append(path)
        if path.startswith("/later/"):
            work = Work()
            self.work.append(work)
            return Deferred(work, lambda w: Reply(200, w.value))  # type: ignore[arg-type]
        if path == "/stream" and self.stream is not None:
            return self.stream
        return Reply(200, path.encode() + b"|" + bytes(body))


def parse_responses(data: bytes) -> list[tuple[int, dict[bytes, bytes], bytes]]:
    out: list[tuple[int, dict[bytes, bytes], bytes]] = []

    class Sink:
        def on_message_begin(self) -> None:
            self.headers: dict[bytes, bytes] = {}
            self.body = b""

        def on_header(self, name: bytes, value: bytes) -> None:
            self.headers[name.lower()] = value

        def on_body(self, body: bytes) -> None:
            self.body += body

        def on_message_complete(self) -> None:
            out.append((parser.get_status_code(), self.headers, self.body))

    sink = Sink()
    parser = httptools.HttpResponseParser(sink)
    parser.feed_data(data)
    return out


def connect(clock: Clock | None = None, router: Router | None = None, listener: Listener | None = None,
            max_body: int = 1 << 20, **limits: float) -> tuple[HttpProtocol, Transport, Router, Clock]:
    clock = clock or Clock()
    router = router or Router()
    protocol = HttpProtocol(router, max_body, listener or Listener(HttpLimits(**limits)), loop=clock)  # type: ignore[arg-type]
    transport = Transport()
    protocol.connection_made(transport)  # type: ignore[arg-type]
    return protocol, transport, router, clock


def get(path: str, extra: bytes = b"") -> bytes:
    return b"GET %s HTTP/1.1\r\nHost: x\r\n%s\r\n" % (path.encode(), extra)


def lingering(transport: Transport) -> bool:
    """Closed the nginx way after an error: the answer and a FIN sent, the client's leftovers read and dropped
    (not left unread, which would turn the close into a reset that can destroy the answer)."""
    return "eof" in transport.events and transport.reading and not transport.closed


def error(response: tuple[int, dict[bytes, bytes], bytes]) -> str:
    return orjson.loads(response[2])["error"]


# --- pipelining ------------------------------------------------------------------------------------------------------


def test_pipelined_requests_past_the_cap_wait_parked_and_answers_keep_their_order() -> None:
    protocol, transport, router, _ = connect(max_pipelined=4)
    protocol.data_received(b"".join(get(f"/later/{i}") for i in range(10)))  # one read, ten requests
    assert len(router.work) == 1 and transport.events == ["pause"]  # alone until its answer shows answers' size
    router.work[0].finish(b"0")
    assert len(router.work) == 5  # small answers: four in flight
    for i in (4, 3, 2):  # later ones finish first: nothing may overtake the first answer
        router.work[i].finish(b"%d" % i)
    assert [r[2] for r in transport.responses()] == [b"0"] and len(router.work) == 5
    router.work[1].finish(b"1")
    # four answers out, so four more dispatched; reading stays paused while one still waits parked
    assert [r[2] for r in transport.responses()] == [b"0", b"1", b"2", b"3", b"4"]
    assert len(router.work) == 9 and transport.events == ["pause"]
    for i in range(5, 9):
        router.work[i].finish(b"%d" % i)
    assert len(router.work) == 10 and transport.events == ["pause", "resume"]  # nothing parked: read again
    router.work[9].finish(b"9")
    assert [r[2] for r in transport.responses()] == [b"%d" % i for i in range(10)]
    assert not transport.closed


def test_ten_thousand_pipelined_requests_in_one_read_are_all_answered_in_order() -> None:
    protocol, transport, router, clock = connect()  # default cap: 128
    protocol.data_received(b"".join(get(f"/later/{i}") for i in range(10_000)))
    assert len(router.work) == 1 and transport.events == ["pause"]
    router.work[0].finish(b"0")  # a small answer: the pipeline opens to the cap
    assert len(router.work) == 129
    done = 1
    while done < len(router.work):  # answer whatever is in flight, as a model would
        router.work[done].finish(b"%d" % done)
        done += 1
        assert len(router.work) - done <= 128
    assert done == 10_000 and transport.events == ["pause", "resume"]
    assert [r[2] for r in transport.responses()] == [b"%d" % i for i in range(10_000)]
    assert clock.count == 1  # the connection's one timer: none was made (or moved) per request


def test_an_error_after_pipelined_requests_is_answered_after_them() -> None:
    protocol, transport, router, _ = connect(max_pipelined=1)
    protocol.data_received(get("/later/a") + get("/later/b") + b"BAD REQUEST\r\n\r\n")
    assert transport.out == b"" and len(router.work) == 1  # b is parked, the garbage ends the connection
    router.work[0].finish(b"a")
    router.work[1].finish(b"b")
    responses = transport.responses()
    assert [r[0] for r in responses] == [200, 200, 400] and responses[1][2] == b"b"
    assert responses[2][1][b"connection"] == b"close" and "malformed HTTP request" in error(responses[2])
    assert lingering(transport)


# --- write flow control ----------------------------------------------------------------------------------------------


def test_reading_pauses_while_the_write_buffer_is_full_and_answers_wait() -> None:
    protocol, transport, router, _ = connect(write_buffer=4096)
    assert transport.high == 4096
    protocol.data_received(get("/later/a") + get("/later/b"))
    protocol.pause_writing()  # the transport's buffer went past the high-water mark
    assert transport.events == ["pause"]
    router.work[0].finish(b"a")
    assert transport.out == b""  # held back, not queued on a client that isn't reading
    protocol.resume_writing()
    assert [r[2] for r in transport.responses()] == [b"a"] and transport.events == ["pause", "resume"]
    router.work[1].finish(b"b")
    assert [r[2] for r in transport.responses()] == [b"a", b"b"]


def test_a_client_that_reads_nothing_is_disconnected_after_the_send_timeout() -> None:
    protocol, transport, router, clock = connect(send_timeout=5)
    protocol.data_received(get("/later/a"))
    clock.advance(100)
    assert not transport.closed  # waiting on the model is not the client's fault
    protocol.pause_writing()
    clock.advance(4.9)
    assert not transport.closed
    clock.advance(0.2)
    assert transport.events[-1] == "abort"


def test_a_streamed_reply_pulls_no_part_while_writing_is_paused() -> None:
    pulled: list[int] = []
    gate = asyncio.Event()

    async def chunks():  # type: ignore[no-untyped-def]
        for i in range(4):
            pulled.append(i)
            yield b"part%d" % i
            if i == 0:
                await gate.wait()

    async def scenario() -> None:
        router = Router()
        router.stream = Streamed(chunks())
        protocol = HttpProtocol(router, 1 << 20, Listener())  # type: ignore[arg-type]
        transport = Transport()
        protocol.connection_made(transport)  # type: ignore[arg-type]
        protocol.data_received(get("/stream"))
        await asyncio.sleep(0.01)
        protocol.pause_writing()
        gate.set()
        for _ in range(5):
            await asyncio.sleep(0)
        assert pulled == [0, 1]  # part 1 was already pulled when writing paused; no more after it
        protocol.resume_writing()
        await asyncio.sleep(0.01)
        assert pulled == [0, 1, 2, 3]
        assert transport.out.endswith(b"0\r\n\r\n") and b"part3" in transport.out
        protocol.connection_lost(None)

    asyncio.run(scenario())


# --- timeouts --------------------------------------------------------------------------------------------------------


def test_an_idle_connection_closes_after_the_keepalive_timeout_counted_from_the_last_answer() -> None:
    protocol, transport, router, clock = connect(keepalive_timeout=75, first_request_timeout=0)
    clock.advance(50)
    protocol.data_received(get("/now/a"))
    clock.advance(74.9)
    assert not transport.closed
    clock.advance(0.2)
    assert transport.events == ["close"] and len(transport.responses()) == 1
    assert clock.armed() == 0


def test_a_connection_waiting_on_the_model_never_idles_out() -> None:
    protocol, transport, router, clock = connect(keepalive_timeout=5)
    protocol.data_received(get("/later/a"))
    clock.advance(1000)
    assert not transport.closed and clock.armed() == 1  # one timer per connection, however long
    router.work[0].finish(b"a")
    clock.advance(4.9)
    assert not transport.closed
    clock.advance(0.2)
    assert transport.closed


def test_keepalive_timeout_zero_keeps_idle_connections_open_as_triton() -> None:
    protocol, transport, _, clock = connect(keepalive_timeout=0)
    protocol.data_received(get("/now/a"))
    clock.advance(10_000)
    assert not transport.closed


def test_a_connection_that_sends_no_request_head_closes_after_the_first_request_timeout() -> None:
    protocol, transport, _, clock = connect(keepalive_timeout=0, header_timeout=60, first_request_timeout=10)
    clock.advance(5)
    protocol.data_received(b"GET /now/a HTTP/1.1\r\n")  # a head begun is not enough
    clock.advance(4.9)
    assert not transport.closed
    clock.advance(0.2)
    assert transport.out == b"" and lingering(transport)  # dropped without an answer, as a slow head
    # one whose first head came in time is then held only to the other timeouts
    protocol, transport, _, clock = connect(keepalive_timeout=0, first_request_timeout=10)
    protocol.data_received(get("/now/a"))
    clock.advance(1000)
    assert not transport.closed


def test_a_head_that_arrives_too_slowly_is_dropped_without_an_answer() -> None:
    protocol, transport, _, clock = connect(header_timeout=10)
    protocol.data_received(b"GET /now/a HTTP/1.1\r\n")
    for _ in range(9):  # slowloris: a byte now and then does not extend the deadline
        clock.advance(1)
        protocol.data_received(b"X")
    clock.advance(0.9)
    assert not transport.closed
    clock.advance(0.2)
    assert transport.out == b"" and lingering(transport)
    clock.advance(LINGER)
    assert transport.events[-1] == "abort"


def test_a_timed_out_head_still_gets_the_answers_before_it() -> None:
    protocol, transport, router, clock = connect(header_timeout=10)
    protocol.data_received(get("/later/a") + b"GET /now/b HTTP/1.1\r\nHo")
    clock.advance(10.1)
    assert transport.out == b"" and not transport.closed
    router.work[0].finish(b"a")
    assert [r[2] for r in transport.responses()] == [b"a"] and lingering(transport)


def test_a_body_that_stalls_is_answered_408() -> None:
    protocol, transport, router, clock = connect(body_timeout=60)
    protocol.data_received(b"POST /now/a HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\nab")
    for _ in range(3):  # nginx's client_body_timeout: the time between two reads
        clock.advance(59)
        protocol.data_received(b"cd")
    clock.advance(59.9)
    assert not transport.closed and transport.out == b""
    clock.advance(0.2)
    [response] = transport.responses()
    assert response[0] == 408 and response[1][b"connection"] == b"close"
    assert error(response) == "request body not received in time: nothing arrived for 60 s (--http-body-timeout)"
    assert router.seen == [] and lingering(transport)


# --- size limits -----------------------------------------------------------------------------------------------------


def test_a_url_past_the_limit_is_answered_414() -> None:
    protocol, transport, router, _ = connect(max_url_size=100)
    protocol.data_received(get("/now/" + "a" * 95))  # exactly 100 bytes
    protocol.data_received(get("/now/" + "a" * 96))
    ok, refused = transport.responses()
    assert ok[0] == 200 and refused[0] == 414
    assert error(refused) == "request URL exceeds the maximum allowed length of 100 bytes (--http-max-url-size)"
    assert len(router.seen) == 1 and lingering(transport)


def test_too_many_header_fields_are_answered_431() -> None:
    protocol, transport, router, _ = connect(max_header_count=10)
    protocol.data_received(get("/now/a", b"".join(b"X-%d: v\r\n" % i for i in range(9))))  # and Host: 10
    protocol.data_received(get("/now/b", b"".join(b"X-%d: v\r\n" % i for i in range(10))))
    ok, refused = transport.responses()
    assert ok[0] == 200 and refused[0] == 431
    assert error(refused) == "request has more than the maximum allowed 10 header fields (--http-max-header-count)"


def test_header_fields_past_the_size_limit_are_answered_431() -> None:
    protocol, transport, router, _ = connect(max_header_size=1000)
    # names and values: "Host" + "x" + "Big" + 992 bytes = 1000
    protocol.data_received(get("/now/a", b"Big: " + b"v" * 992 + b"\r\n"))
    protocol.data_received(get("/now/b", b"Big: " + b"v" * 993 + b"\r\n"))
    ok, refused = transport.responses()
    assert ok[0] == 200 and refused[0] == 431
    assert error(refused) == ("request header fields exceed the maximum allowed size of 1000 bytes "
                              "(--http-max-header-size)")


def test_an_endless_header_line_is_refused_after_one_read_past_the_limit() -> None:
    protocol, transport, _, _ = connect(max_header_size=4096)
    protocol.data_received(b"GET /now/a HTTP/1.1\r\nX-Endless: ")
    fed = 0
    while not transport.out and fed < 1 << 20:
        protocol.data_received(b"v" * 1024)  # httptools holds an unfinished line: never reaches on_header
        fed += 1024
    assert 4096 < fed <= 4096 + 1024
    [response] = transport.responses()
    assert response[0] == 431 and "--http-max-header-size" in error(response)


def test_a_head_spread_over_many_reads_within_the_limit_is_served() -> None:
    protocol, transport, _, _ = connect(max_header_size=4096)
    request = get("/now/a", b"X-Long: " + b"v" * 4000 + b"\r\n")
    for i in range(0, len(request), 7):
        protocol.data_received(request[i:i + 7])
    assert [r[0] for r in transport.responses()] == [200]


# --- connections -----------------------------------------------------------------------------------------------------


def test_connections_past_the_limit_are_answered_503_and_closed() -> None:
    listener = Listener(HttpLimits(max_connections=2))
    clock = Clock()
    first, _, _, _ = connect(clock, listener=listener)
    connect(clock, listener=listener)
    refused, transport, router, _ = connect(clock, listener=listener)
    [response] = transport.responses()
    assert response[0] == 503 and response[1][b"connection"] == b"close"
    assert error(response) == "too many open connections: at most 2 are served at once (--http-max-connections)"
    assert transport.events == ["eof"] and listener.gate.open == 2  # reading never paused: nothing to resume
    refused.data_received(get("/now/a"))  # read and dropped while lingering
    assert router.seen == []
    clock.advance(LINGER)
    assert transport.events == ["eof", "abort"]
    refused.connection_lost(None)
    assert listener.gate.open == 2  # a refused connection was never counted
    first.connection_lost(None)
    _, transport, _, _ = connect(clock, listener=listener)
    assert transport.out == b"" and listener.gate.open == 2


def test_limits_come_from_serve_flags() -> None:
    from naiad.cli import build_parser
    from naiad.frontends.http import options

    args = build_parser().parse_args(["serve", "--model-repository=/m", "--http-max-pipelined-requests=8",
                                      "--http-keepalive-timeout=5", "--http-max-connections=0",
                                      "--http-max-header-size=16384"])
    limits = options.from_args(args).limits
    assert (limits.max_pipelined, limits.keepalive_timeout, limits.max_connections, limits.max_header_size) == (
        8, 5.0, 0, 16384)
    assert limits.header_timeout == HttpLimits().header_timeout
    args = build_parser().parse_args(["serve", "--model-repository=/m", "--http-max-pipelined-requests=0"])
    with pytest.raises(ValueError, match="--http-max-pipelined-requests must be at least 1, got 0"):
        options.from_args(args)


def test_a_lingering_close_waits_for_answers_still_queued_within_the_send_timeout() -> None:
    protocol, transport, router, clock = connect(send_timeout=10)
    protocol.data_received(b"NOT HTTP\r\n\r\n")
    transport.buffered = 1000  # the 400 is still in the transport's buffer: the client reads slowly
    clock.advance(LINGER * 2)
    assert not transport.closed
    transport.buffered = 0
    clock.advance(LINGER)
    assert transport.events[-1] == "abort" and transport.responses()[0][0] == 400


def test_the_keepalive_timeout_counts_from_the_last_answer_after_a_parked_pipeline() -> None:
    # the short header timeout makes the connection's timer look every second
    protocol, transport, router, clock = connect(keepalive_timeout=5, header_timeout=1, max_pipelined=1)
    protocol.data_received(get("/later/a") + get("/now/b"))
    clock.advance(100)
    router.work[0].finish(b"a")  # b, parked until now, is answered at once
    clock.advance(4.9)
    assert not transport.closed
    clock.advance(0.2)
    assert transport.events[-1] == "close" and len(transport.responses()) == 2


def test_a_client_fin_cancels_its_pending_requests() -> None:
    protocol, transport, router, _ = connect()
    protocol.data_received(get("/later/0") + get("/later/1"))
    assert not protocol.eof_received()  # the transport closes: a half-close can't be told from going away
    protocol.connection_lost(None)
    assert all(work.cancelled() for work in router.work)


# --- HEAD and the body-size limit -------------------------------------------------------------------------------------


def test_a_head_answer_carries_no_body_and_the_next_answer_follows_it() -> None:
    protocol, transport, _, _ = connect()
    protocol.data_received(b"HEAD /now/a HTTP/1.1\r\nHost: x\r\n\r\n" + get("/now/b"))
    head, rest = bytes(transport.out).split(b"\r\n\r\n", 1)
    assert head.startswith(b"HTTP/1.1 200 OK") and b"Content-Length: 7" in head  # what GET would send: "/now/a|"
    assert [(r[0], r[2]) for r in parse_responses(rest)] == [(200, b"/now/b|")]  # no stray body before it


def test_a_deferred_head_answer_carries_no_body() -> None:
    protocol, transport, router, _ = connect()
    protocol.data_received(b"HEAD /later/a HTTP/1.1\r\nHost: x\r\n\r\n")
    router.work[0].finish(b"a body")
    assert bytes(transport.out).endswith(b"Content-Length: 6\r\n\r\n")


def test_a_declared_body_past_the_limit_is_refused_413_before_it_is_read() -> None:
    protocol, transport, router, _ = connect(max_body=1000)
    protocol.data_received(b"POST /now/a HTTP/1.1\r\nHost: x\r\nContent-Length: 10737418240\r\n"
                           b"Expect: 100-continue\r\n\r\n")
    (status, _, _), = transport.responses()
    assert status == 413 and b"100 Continue" not in transport.out
    assert error(transport.responses()[0]) == ("request body size of 10737418240 bytes exceeds the maximum allowed "
                                               "value of 1000 bytes. Use --http-max-input-size to increase the limit.")
    assert lingering(transport) and router.seen == []
    protocol.data_received(b"x" * 100_000)  # the body the client sends anyway is dropped
    assert len(transport.responses()) == 1 and router.seen == []


def test_a_chunked_body_is_refused_413_as_soon_as_it_passes_the_limit() -> None:
    protocol, transport, router, _ = connect(max_body=1000)
    protocol.data_received(b"POST /now/a HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
    protocol.data_received(b"200\r\n" + b"x" * 512 + b"\r\n")  # 512 bytes: within the limit
    assert transport.out == b""
    protocol.data_received(b"200\r\n" + b"x" * 512 + b"\r\n")  # 1024: past it, and the body has not ended
    (status, _, _), = transport.responses()
    assert status == 413 and lingering(transport) and router.seen == []


def test_a_body_at_the_limit_is_served() -> None:
    protocol, transport, router, _ = connect(max_body=1000)
    protocol.data_received(b"POST /now/a HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n" + b"y" * 1000)
    (status, _, body), = transport.responses()
    assert status == 200 and body == b"/now/a|" + b"y" * 1000
