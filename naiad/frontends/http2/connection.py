"""The server side of one HTTP/2 connection as a state machine: ``receive`` bytes, get events; ``send_*`` and
``respond`` queue frames; ``data_to_send`` returns what to write.

Hot path first: a frame is parsed in place from the bytes received (no copy of the read unless a frame straddles
two reads), a repeated request header block (clients send the same block for each call) is
decoded once, and a unary answer (HEADERS, DATA, trailers) is queued with one call. Receive windows are opened as
wide as HTTP/2 allows and topped up as data arrives, unless ``Limits.stream_window`` hands the streams' windows to
the application, which then opens them (``grant``) only for what it has room for; send windows follow the peer's
SETTINGS and WINDOW_UPDATEs.

Streams: a stream lives here while it is open or half-closed, which is what SETTINGS_MAX_CONCURRENT_STREAMS
counts. Sending END_STREAM before the client ended its side also sends RST_STREAM NO_ERROR (RFC 9113 8.1, as
grpc-core does), so a stream the server answered never lingers. Frames for streams that are gone are ignored,
except that every header block is decoded: HPACK's table is connection state (RFC 9113 4.3).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

from hpack import Decoder
from hpack.exceptions import HPACKError, OversizedHeaderListError

from naiad.frontends.http2 import frames as f
from naiad.frontends.http2.events import (
    ConnectionTerminated,
    DataReceived,
    Event,
    GoAwayReceived,
    RequestReceived,
    StreamReset,
    TrailersReceived,
)
from naiad.frontends.http2.limits import Limits

_HEAD = f.HEAD
_DATA, _HEADERS, _CONTINUATION, _SETTINGS = f.DATA, f.HEADERS, f.CONTINUATION, f.SETTINGS
_SIMPLE_HEADERS = f.END_HEADERS  # HEADERS flags that take the short path: a whole block, no padding or priority
_HEADERS_SHAPE = f.END_HEADERS | f.PADDED | f.PRIORITY_FLAG
_END_STREAM = f.END_STREAM
_MASK = f.MAX_WINDOW
_U32 = f._U32
_SETTING = f._SETTING
_CACHED_BLOCKS = 64
_BIG = 65536  # a DATA payload this large is queued apart from its frame header, not joined to it


class _Stream:
    __slots__ = ("sid", "window", "recv_window", "pending", "ending", "trailers", "remote_closed", "opened")

    def __init__(self, sid: int, window: int, recv_window: int, opened: float) -> None:
        self.sid = sid
        self.opened = opened  # the clock when its HEADERS arrived: a reset soon after is the rapid-reset pattern
        self.window = window  # what the peer lets us send on this stream
        self.recv_window = recv_window  # what we let the peer send
        self.pending: list[bytes | memoryview] = []  # DATA waiting for window
        self.ending = False  # END_STREAM follows the pending data
        self.trailers: bytes | None = None  # ... on this header block (else on an empty DATA frame)
        self.remote_closed = False  # the client sent END_STREAM


class H2Connection:
    """One server-side HTTP/2 connection. Call ``initiate()`` once the transport is up (queues our SETTINGS),
    then ``receive`` whatever arrives; after each call, write ``data_to_send()``."""

    def __init__(self, limits: Limits | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.limits = limits = limits or Limits()
        self.clock = clock
        self._buf = bytearray()
        self._out: list[bytes | memoryview] = []
        self._apart = False  # _out holds a big DATA payload apart from its frame header
        # A big DATA frame whose payload is still arriving: bytes due, its stream (0: dropped) and flags.
        self._data_left = 0
        self._data_sid = 0
        self._data_flags = 0
        self._preface = False
        self._settings_seen = False
        # Our SETTINGS_INITIAL_WINDOW_SIZE as the client may count it. It applies our SETTINGS as it reads them and
        # acknowledges them in order (RFC 9113 6.9.2), so until an ACK it may use the value in force before or any
        # value sent since: ``_windows`` holds the acknowledged one, then those not acknowledged yet. A stream's
        # ``recv_window`` counts from the largest of them (what it may send), ``receive_window`` from the smallest
        # (what it is sure of), and a change applies to every open stream (``_account``).
        self._windows: deque[int] = deque((f.DEFAULT_WINDOW,))
        self.max_streams = limits.max_concurrent_streams  # the lowest we announced: more open streams are refused
        # A higher limit the client may still be using, until it acknowledges the SETTINGS that lowered it: streams
        # it opens below that are refused without counting as resets (it didn't know).
        self._streams_before = 0
        self.streams: dict[int, _Stream] = {}
        self._blocked: dict[int, _Stream] = {}
        self.last_stream_id = 0  # the highest stream the client opened
        self.send_window = f.DEFAULT_WINDOW
        self.initial_window = f.DEFAULT_WINDOW  # the peer's SETTINGS_INITIAL_WINDOW_SIZE
        self.max_frame = f.DEFAULT_MAX_FRAME  # the peer's SETTINGS_MAX_FRAME_SIZE
        self._recv_window = f.DEFAULT_WINDOW  # the connection window we granted (raised in initiate)
        self._refill_below = limits.receive_window // 2
        # Streams' receive windows: topped up here as data arrives, or (stream_window set) by the application.
        self._auto_windows = limits.stream_window is None
        self.stream_window = limits.receive_window if limits.stream_window is None else limits.stream_window
        self._counted = f.DEFAULT_WINDOW  # max(_windows): the initial receive window of a stream opened now
        # The open header block: its stream, END_STREAM flag, bytes so far and frame count.
        self._continuing = 0
        self._block_end = False
        self._block = bytearray()
        self._block_frames = 0
        self.decoder = Decoder(max_header_list_size=limits.max_decoded_header_list)
        self._blocks: dict[bytes, tuple[list[tuple[str, str]], int]] = {}
        self.closing = False  # we sent GOAWAY: new streams are refused
        self.terminated = False  # a connection error: nothing more is read
        self._reset_tokens = float(limits.reset_burst)
        self._reset_time = clock()
        self._paused = False  # the transport is not draining (set by the I/O side)
        self._induced = 0
        self._last_ping: float | None = None
        self._ping_strikes = 0

    # -- I/O side ---------------------------------------------------------------------------------------------

    def initiate(self) -> None:
        limits = self.limits
        self._out.append(f.settings(
            (f.MAX_CONCURRENT_STREAMS, limits.max_concurrent_streams),
            (f.INITIAL_WINDOW_SIZE, self.stream_window),
            (f.MAX_FRAME_SIZE, limits.max_frame_size),
            (f.MAX_HEADER_LIST_SIZE, limits.max_header_list_size)))
        self._announce(self.stream_window)
        if limits.receive_window > f.DEFAULT_WINDOW:
            self._out.append(f.window_update(0, limits.receive_window - f.DEFAULT_WINDOW))
            self._recv_window = limits.receive_window

    def settle(self, window: int, max_streams: int) -> None:
        """Announce a new SETTINGS_INITIAL_WINDOW_SIZE and SETTINGS_MAX_CONCURRENT_STREAMS (the application trading
        one against the other: ``grpc/budget.py``). A lower stream limit holds at once: streams the client opens
        past it before it reads the SETTINGS are refused (REFUSED_STREAM, which clients retry)."""
        if window == self.stream_window and max_streams == self.max_streams:
            return
        self.stream_window = window
        if max_streams < self.max_streams:
            self._streams_before = max(self._streams_before, self.max_streams)
        self.max_streams = max_streams
        self._out.append(f.settings((f.MAX_CONCURRENT_STREAMS, max_streams), (f.INITIAL_WINDOW_SIZE, window)))
        self._announce(window)

    @property
    def unacknowledged(self) -> int:
        """Our SETTINGS the client has not acknowledged yet."""
        return len(self._windows) - 1

    def _announce(self, window: int) -> None:
        self._windows.append(window)
        if window > self._counted:  # the client may use it as soon as it reads it: counted now
            self._account(window)

    def _account(self, counted: int) -> None:
        delta, self._counted = counted - self._counted, counted
        if delta:
            for stream in self.streams.values():
                stream.recv_window += delta

    def data_to_send(self) -> bytes:
        out = self._out
        if not out:
            return b""
        self._out = []
        self._apart = False
        return out[0] if len(out) == 1 and type(out[0]) is bytes else b"".join(out)  # type: ignore[return-value]

    def buffers_to_send(self) -> list[bytes | memoryview]:
        """What ``data_to_send`` returns, but with big DATA payloads as buffers of their own (for a writev), so they
        are not copied into one; without those, one bytes object."""
        out, self._out = self._out, []
        if self._apart:
            self._apart = False
        elif len(out) > 1:
            return [b"".join(out)]
        return out

    def pause_writing(self) -> None:
        """The transport's buffer is full: control frames the peer asks for now count against its limit."""
        self._paused = True

    def resume_writing(self) -> None:
        self._paused = False
        self._induced = 0

    # -- receiving --------------------------------------------------------------------------------------------

    def receive(self, data: bytes | memoryview) -> list[Event]:
        """The events ``data`` completes. Bytes as they came off the transport; or a memoryview of the memory the
        payload ``payload_due`` announced was read into, which the events' data then are views of (so it must
        not change while they are held)."""
        events: list[Event] = []
        if self.terminated:
            return events
        pos = 0
        if self._data_left:  # the rest of a big DATA frame's payload, handed on as it comes (_data_arriving)
            pos = self._data_arriving(data, 0, events)
            if pos == len(data):
                return events
        if type(data) is memoryview:  # more than the payload due: the rest is read as bytes, as any
            data, pos = bytes(data[pos:]), 0
        buf = self._buf
        if buf or not self._preface:
            buf += data[pos:] if pos else data
            pos = 0
            if not self._preface:
                if len(buf) < 24:
                    if f.PREFACE[:len(buf)] != buf:
                        self._fail(f.PROTOCOL_ERROR, events, b"invalid connection preface")
                    return events
                if buf[:24] != f.PREFACE:
                    self._fail(f.PROTOCOL_ERROR, events, b"invalid connection preface")
                    return events
                del buf[:24]
                self._preface = True
            data = buf  # type: ignore[assignment]
        end = len(data)
        max_frame = self.limits.max_frame_size
        while end - pos >= 9:
            hi, lo, kind, flags, sid = _HEAD.unpack_from(data, pos)
            length = (hi << 16) | lo
            if length > max_frame:
                self._fail(f.FRAME_SIZE_ERROR, events, b"frame larger than SETTINGS_MAX_FRAME_SIZE")
                break
            if end - pos - 9 < length:
                if kind == _DATA and length >= _BIG and not flags & f.PADDED and not self._continuing:
                    # A big DATA frame only partly here: its payload goes on as it arrives, not gathered first.
                    self._data_flags, self._data_left = flags, length
                    self._data_sid = self._on_data(flags, sid & _MASK, data, pos + 9, pos + 9, events, length)
                    pos = self._data_arriving(data, pos + 9, events)
                break
            start = pos + 9
            pos = start + length
            sid &= _MASK
            if self._continuing and kind != _CONTINUATION:
                self._fail(f.PROTOCOL_ERROR, events, b"header block interrupted")
                break
            if kind == _DATA:
                self._on_data(flags, sid, data, start, pos, events)
            elif kind == _HEADERS:
                if flags & _HEADERS_SHAPE == _SIMPLE_HEADERS and sid & 1 and self._settings_seen \
                        and length <= self.limits.max_header_block:
                    self._block_end = flags & _END_STREAM
                    block = data[start:pos]
                    self._headers_done(sid, block if type(block) is bytes else bytes(block), events)
                else:
                    self._on_headers(flags, sid, data[start:pos], events)
            elif not self._settings_seen and kind != _SETTINGS:
                self._fail(f.PROTOCOL_ERROR, events, b"the connection preface must end with SETTINGS")
            else:
                self._on_control(kind, flags, sid, data[start:pos], events)
            if self.terminated:
                break
        if self.terminated:
            self._buf = bytearray()
        elif data is buf:
            del buf[:pos]
        elif pos < end:
            buf += data[pos:]
        return events

    def _on_data(self, flags: int, sid: int, data: bytes, start: int, end: int, events: list[Event],
                 length: int = -1) -> int:
        """A DATA frame: its payload is ``data[start:end]``; or, with ``length``, only its header has come and the
        payload of ``length`` bytes follows (``_data_arriving``), the windows counting all of it now. Returns the
        stream the payload goes to (0: it is dropped)."""
        if not self._settings_seen:
            self._fail(f.PROTOCOL_ERROR, events, b"the connection preface must end with SETTINGS")
            return 0
        if sid == 0:
            self._fail(f.PROTOCOL_ERROR, events, b"DATA on stream 0")
            return 0
        whole = length < 0
        if whole:
            length = end - start
        if flags & f.PADDED and (length == 0 or data[start] >= length):
            self._fail(f.PROTOCOL_ERROR, events, b"padding exceeds the frame")
            return 0
        # The connection window counts every DATA byte, padding included, on any stream.
        window = self._recv_window - length
        if window < 0:
            self._fail(f.FLOW_CONTROL_ERROR, events, b"connection receive window exceeded")
            return 0
        if window < self._refill_below:
            self._out.append(f.window_update(0, self.limits.receive_window - window))
            window = self.limits.receive_window
        self._recv_window = window
        stream = self.streams.get(sid)
        if stream is None:
            if sid > self.last_stream_id:
                self._fail(f.PROTOCOL_ERROR, events, b"DATA on an idle stream")
            return 0  # a stream that is gone: its data is late, not wrong
        if stream.remote_closed:
            self._stream_error(stream.sid, f.STREAM_CLOSED, events)
            return 0
        if flags & f.PADDED:
            end -= data[start]
            start += 1
        window = stream.recv_window - length
        if window < 0:
            self._stream_error(sid, f.FLOW_CONTROL_ERROR, events)
            return 0
        if flags & f.END_STREAM:
            stream.recv_window = window
            if whole:
                stream.remote_closed = True
                events.append(DataReceived(sid, data[start:end], True))
            return sid
        if window < self._refill_below and self._auto_windows:
            self._out.append(f.window_update(sid, self.limits.receive_window - window))
            window = self.limits.receive_window
        stream.recv_window = window
        if whole:
            events.append(DataReceived(sid, data[start:end], False))
        return sid

    def payload_due(self) -> tuple[int, int]:
        """The big DATA frame whose payload is arriving: (its stream, bytes still due), or (0, 0). What the
        application reads next may go straight where it keeps that stream's data, and be handed to ``receive`` as
        a memoryview of it (``_data_arriving``)."""
        return (self._data_sid, self._data_left) if self._data_left else (0, 0)

    def header_due(self) -> int:
        """Bytes that complete the next frame's header (0: a payload is due, or a frame is being gathered). A read
        of exactly that many lets the payload that follows go where ``payload_due`` then says."""
        if self._data_left or not self._preface:
            return 0
        return max(0, 9 - len(self._buf))

    def _data_arriving(self, data: bytes | bytearray | memoryview, pos: int, events: list[Event]) -> int:
        """Hand on what ``data`` (from ``pos``) holds of the DATA payload still due; returns where it ends. The
        payload is a view of ``data`` when that is bytes (immutable: copied once, by whoever keeps it) or a
        memoryview (the application's own memory, where it read the payload to: ``payload_due``), else a copy."""
        n = min(self._data_left, len(data) - pos)
        left = self._data_left = self._data_left - n
        sid = self._data_sid
        if sid:
            stream = self.streams.get(sid)
            if stream is None:  # answered or reset meanwhile: the rest is dropped
                self._data_sid = 0
            elif n or not left:
                end_stream = not left and bool(self._data_flags & f.END_STREAM)
                if end_stream:
                    stream.remote_closed = True
                kind = type(data)
                chunk = memoryview(data)[pos:pos + n] if kind is bytes else data[pos:pos + n] \
                    if kind is memoryview else bytes(memoryview(data)[pos:pos + n])
                events.append(DataReceived(sid, chunk, end_stream))
        return pos + n

    def _on_headers(self, flags: int, sid: int, payload: bytes, events: list[Event]) -> None:
        if not self._settings_seen:
            self._fail(f.PROTOCOL_ERROR, events, b"the connection preface must end with SETTINGS")
            return
        if sid == 0 or not sid & 1:
            self._fail(f.PROTOCOL_ERROR, events, b"HEADERS on a stream the client can't open")
            return
        start, end = 0, len(payload)
        if flags & (f.PADDED | f.PRIORITY_FLAG):
            pad = 0
            if flags & f.PADDED:
                if end < 1:
                    self._fail(f.FRAME_SIZE_ERROR, events, b"HEADERS too short for its padding")
                    return
                pad = payload[0]
                start = 1
            if flags & f.PRIORITY_FLAG:
                if end - start < 5:
                    self._fail(f.FRAME_SIZE_ERROR, events, b"HEADERS too short for its priority")
                    return
                start += 5
            if pad > end - start:
                self._fail(f.PROTOCOL_ERROR, events, b"padding exceeds the frame")
                return
            end -= pad
            payload = payload[start:end]
        if len(payload) > self.limits.max_header_block:
            self._fail(f.ENHANCE_YOUR_CALM, events, b"header block too large")
            return
        self._block_end = bool(flags & f.END_STREAM)
        if flags & f.END_HEADERS:
            # A block is a cache key: bytes, also when it was cut from a frame that straddled two reads.
            self._headers_done(sid, payload if type(payload) is bytes else bytes(payload), events)
            return
        self._continuing = sid
        self._block = bytearray(payload)
        self._block_frames = 1

    def _on_continuation(self, flags: int, sid: int, payload: bytes, events: list[Event]) -> None:
        if not self._continuing or sid != self._continuing:
            self._fail(f.PROTOCOL_ERROR, events, b"CONTINUATION without a header block")
            return
        block = self._block
        self._block_frames += 1
        if len(block) + len(payload) > self.limits.max_header_block \
                or self._block_frames > self.limits.max_header_frames:
            self._fail(f.ENHANCE_YOUR_CALM, events, b"header block too large")
            return
        block += payload
        if flags & f.END_HEADERS:
            self._continuing = 0
            self._block = bytearray()
            self._headers_done(sid, bytes(block), events)

    def _headers_done(self, sid: int, block: bytes, events: list[Event]) -> None:
        cached = self._blocks.get(block)
        if cached is None:
            try:
                decoded: list[tuple[str, str]] = self.decoder.decode(block)  # type: ignore[assignment]
            except OversizedHeaderListError:
                self._fail(f.ENHANCE_YOUR_CALM, events, b"header list too large to decode")
                return
            except HPACKError:
                self._fail(f.COMPRESSION_ERROR, events, b"invalid HPACK block")
                return
            size = 32 * len(decoded)  # RFC 9113 6.5.2's measure of a header list
            for name, value in decoded:
                size += len(name) + len(value)
            cached = decoded, size
            if f.leaves_table(block):
                if len(self._blocks) < _CACHED_BLOCKS:
                    self._blocks[block] = cached
            elif self._blocks:
                self._blocks.clear()  # the block may have changed the dynamic table the cached ones refer to
        fields, size = cached
        end_stream = self._block_end
        stream = self.streams.get(sid)
        if stream is not None:  # the request's trailers
            if stream.remote_closed:
                self._stream_error(sid, f.STREAM_CLOSED, events)
            elif not end_stream:
                self._stream_error(sid, f.PROTOCOL_ERROR, events)  # trailers must end the stream (RFC 9113 8.1)
            else:
                stream.remote_closed = True
                events.append(TrailersReceived(sid, fields))
            return
        if sid <= self.last_stream_id:
            self._induce(f.rst_stream(sid, f.STREAM_CLOSED), events)  # a stream that is gone
            return
        self.last_stream_id = sid
        if self.closing or len(self.streams) >= self.max_streams:
            self._induce(f.rst_stream(sid, f.REFUSED_STREAM), events)
            if not self.closing and len(self.streams) >= self._streams_before:
                self._count_reset(events)
            return
        stream = self.streams[sid] = _Stream(sid, self.initial_window, self._counted, self.clock())
        stream.remote_closed = end_stream = bool(end_stream)
        limit = self.limits.max_header_list_size
        events.append(RequestReceived(sid, fields, end_stream, size if size > limit else 0))

    def _on_control(self, kind: int, flags: int, sid: int, payload: bytes, events: list[Event]) -> None:
        n = len(payload)
        if kind == f.CONTINUATION:
            self._on_continuation(flags, sid, payload, events)
        elif kind == f.SETTINGS:
            if sid:
                self._fail(f.PROTOCOL_ERROR, events, b"SETTINGS on a stream")
            elif flags & f.ACK:
                if n:
                    self._fail(f.FRAME_SIZE_ERROR, events, b"SETTINGS ack with a payload")
                elif not self._settings_seen:
                    self._fail(f.PROTOCOL_ERROR, events, b"the connection preface must end with SETTINGS")
                elif len(self._windows) > 1:  # (an ACK of nothing we sent is ignored)
                    windows = self._windows
                    windows.popleft()
                    self._account(max(windows))
                    if len(windows) == 1:
                        self._streams_before = 0
            elif n % 6:
                self._fail(f.FRAME_SIZE_ERROR, events, b"SETTINGS length not a multiple of 6")
            else:
                self._settings_seen = True
                self._on_settings(payload, events)
        elif kind == f.WINDOW_UPDATE:
            if n != 4:
                self._fail(f.FRAME_SIZE_ERROR, events, b"WINDOW_UPDATE length not 4")
            else:
                self._on_window_update(sid, _U32.unpack(payload)[0] & _MASK, events)
        elif kind == f.PING:
            if n != 8:
                self._fail(f.FRAME_SIZE_ERROR, events, b"PING length not 8")
            elif sid:
                self._fail(f.PROTOCOL_ERROR, events, b"PING on a stream")
            elif not flags & f.ACK and self._ping_allowed(events):
                self._induce(f.frame(f.PING, f.ACK, 0, payload), events)
        elif kind == f.RST_STREAM:
            if n != 4:
                self._fail(f.FRAME_SIZE_ERROR, events, b"RST_STREAM length not 4")
            elif sid == 0 or sid > self.last_stream_id:
                self._fail(f.PROTOCOL_ERROR, events, b"RST_STREAM on stream 0 or an idle stream")
            else:
                stream = self.streams.pop(sid, None)
                if stream is not None:
                    self._blocked.pop(sid, None)
                    events.append(StreamReset(sid, _U32.unpack(payload)[0], True))
                    # The CVE-2023-44487 pattern: a stream reset before its request was whole (it never reached
                    # a handler) or right after it opened. A call reset later is a client's deadline or
                    # cancellation of work it waited for, which costs it no tokens.
                    if not stream.remote_closed or self.clock() - stream.opened < self.limits.reset_min_age:
                        self._count_reset(events)
        elif kind == f.PRIORITY:
            if sid == 0:
                self._fail(f.PROTOCOL_ERROR, events, b"PRIORITY on stream 0")
            elif n != 5:
                self._stream_error(sid, f.FRAME_SIZE_ERROR, events)
            elif _U32.unpack_from(payload)[0] & _MASK == sid:
                self._stream_error(sid, f.PROTOCOL_ERROR, events)  # a stream can't depend on itself
            # Otherwise advisory: answers go out as the windows allow.
        elif kind == f.GOAWAY:
            if sid:
                self._fail(f.PROTOCOL_ERROR, events, b"GOAWAY on a stream")
            elif n < 8:
                self._fail(f.FRAME_SIZE_ERROR, events, b"GOAWAY shorter than 8")
            else:
                last, code = f._U32X2.unpack_from(payload)
                events.append(GoAwayReceived(code, last & _MASK))
        elif kind == f.PUSH_PROMISE:
            self._fail(f.PROTOCOL_ERROR, events, b"PUSH_PROMISE from a client")
        # Unknown frame types are ignored (RFC 9113 4.1).

    def _on_settings(self, payload: bytes, events: list[Event]) -> None:
        count = len(payload) // 6
        if count > self.limits.max_settings:
            self._fail(f.ENHANCE_YOUR_CALM, events, b"too many settings")
            return
        for offset in range(0, len(payload), 6):
            key, value = _SETTING.unpack_from(payload, offset)
            if key == f.INITIAL_WINDOW_SIZE:
                if value > f.MAX_WINDOW:
                    self._fail(f.FLOW_CONTROL_ERROR, events, b"SETTINGS_INITIAL_WINDOW_SIZE above 2^31-1")
                    return
                delta = value - self.initial_window
                self.initial_window = value
                for stream in self.streams.values():
                    stream.window += delta
                    if stream.window > f.MAX_WINDOW:
                        self._fail(f.FLOW_CONTROL_ERROR, events, b"stream window above 2^31-1")
                        return
            elif key == f.MAX_FRAME_SIZE:
                if not f.DEFAULT_MAX_FRAME <= value <= f.LARGEST_MAX_FRAME:
                    self._fail(f.PROTOCOL_ERROR, events, b"SETTINGS_MAX_FRAME_SIZE out of range")
                    return
                self.max_frame = value
            elif key == f.ENABLE_PUSH and value > 1:
                self._fail(f.PROTOCOL_ERROR, events, b"SETTINGS_ENABLE_PUSH not 0 or 1")
                return
            # HEADER_TABLE_SIZE: our blocks never index, so the peer's table size does not concern us;
            # MAX_CONCURRENT_STREAMS: we open none; MAX_HEADER_LIST_SIZE is advisory; unknown ones are ignored.
        self._induce(f.frame(f.SETTINGS, f.ACK, 0, b""), events)
        self._flush()

    def _on_window_update(self, sid: int, increment: int, events: list[Event]) -> None:
        if sid == 0:
            if increment == 0:
                self._fail(f.PROTOCOL_ERROR, events, b"WINDOW_UPDATE of 0")
                return
            self.send_window += increment
            if self.send_window > f.MAX_WINDOW:
                self._fail(f.FLOW_CONTROL_ERROR, events, b"connection window above 2^31-1")
                return
        else:
            stream = self.streams.get(sid)
            if stream is None:
                if sid > self.last_stream_id:
                    self._fail(f.PROTOCOL_ERROR, events, b"WINDOW_UPDATE on an idle stream")
                return
            if increment == 0:
                self._stream_error(sid, f.PROTOCOL_ERROR, events)
                return
            stream.window += increment
            if stream.window > f.MAX_WINDOW:
                self._stream_error(sid, f.FLOW_CONTROL_ERROR, events)
                return
        self._flush()

    # -- limits -----------------------------------------------------------------------------------------------

    def _induce(self, data: bytes, events: list[Event]) -> None:
        """Queue a control frame the peer asked for; while the peer is not reading, count them."""
        self._out.append(data)
        if self._paused:
            self._induced += 1
            if self._induced > self.limits.max_induced_frames:
                self._fail(f.ENHANCE_YOUR_CALM, events, b"too many control frames queued")

    def _count_reset(self, events: list[Event]) -> None:
        limits = self.limits
        now = self.clock()
        tokens = min(float(limits.reset_burst), self._reset_tokens + (now - self._reset_time) * limits.reset_rate)
        self._reset_time = now
        if tokens < 1.0:
            self._fail(f.ENHANCE_YOUR_CALM, events, b"too many streams reset")
            return
        self._reset_tokens = tokens - 1.0

    def _ping_allowed(self, events: list[Event]) -> bool:
        limits = self.limits
        if not limits.max_ping_strikes:
            return True
        now = self.clock()
        interval = limits.min_ping_interval if self.streams or limits.ping_without_calls \
            else limits.idle_ping_interval
        last, self._last_ping = self._last_ping, now
        if last is not None and now - last < interval:
            self._ping_strikes += 1
            if self._ping_strikes > limits.max_ping_strikes:
                self._fail(f.ENHANCE_YOUR_CALM, events, b"too_many_pings")
                return False
        return True

    def _fail(self, code: int, events: list[Event], debug: bytes) -> None:
        """A connection error (RFC 9113 5.4.1): GOAWAY, and nothing more is read."""
        if self.terminated:
            return
        self.terminated = True
        self._block = bytearray()
        self._continuing = 0
        self._out.append(f.goaway(self.last_stream_id, code, debug))
        events.append(ConnectionTerminated(code, debug))

    def _stream_error(self, sid: int, code: int, events: list[Event]) -> None:
        """A stream error (RFC 9113 5.4.2): RST_STREAM, and the stream's work is abandoned."""
        self._induce(f.rst_stream(sid, code), events)
        if self.streams.pop(sid, None) is not None:
            self._blocked.pop(sid, None)
            events.append(StreamReset(sid, code, False))

    # -- sending ----------------------------------------------------------------------------------------------

    def is_open(self, sid: int) -> bool:
        return sid in self.streams

    @property
    def started(self) -> bool:
        """The client's connection preface (the magic and its SETTINGS) has arrived."""
        return self._settings_seen

    def receive_window(self, sid: int) -> int:
        """What the client may still send on the stream for sure (0 once it is gone or the client ended it).

        Until it acknowledges our SETTINGS, a client may count a stream's window from the default or already from
        our smaller SETTINGS_INITIAL_WINDOW_SIZE (it applies SETTINGS as it reads them, before it acknowledges
        them): the smaller of the two is all it is sure of, and a grant sized on the larger would fall short by
        the difference once the ACK shrinks the window, stalling a message for good."""
        stream = self.streams.get(sid)
        if stream is None or stream.remote_closed:
            return 0
        windows = self._windows
        if len(windows) == 1:
            return stream.recv_window
        return stream.recv_window + min(windows) - self._counted

    def grant(self, sid: int, n: int) -> None:
        """Let the client send ``n`` more bytes on the stream (WINDOW_UPDATE): with ``Limits.stream_window``, the
        application's way of asking for more once it has room for it."""
        stream = self.streams.get(sid)
        if stream is None or stream.remote_closed:
            return
        n = min(n, f.MAX_WINDOW - stream.recv_window)
        if n > 0:
            stream.recv_window += n
            self._out.append(f.window_update(sid, n))

    def send_headers(self, sid: int, block: bytes, end_stream: bool = False) -> None:
        """A response header block, or with ``end_stream`` the trailers (sent after any DATA still waiting)."""
        stream = self.streams.get(sid)
        if stream is None or stream.ending:
            return
        self._last_ping = None  # sending HEADERS or DATA forgives earlier pings (grpc-core)
        self._ping_strikes = 0
        if end_stream:
            stream.ending = True
            stream.trailers = block
            if stream.pending:
                return
            self._end(stream, self._out)
        else:
            self._header_frames(sid, block, 0, self._out)

    def send_data(self, sid: int, data: bytes | memoryview, end_stream: bool = False) -> None:
        stream = self.streams.get(sid)
        if stream is None or stream.ending:
            return
        self._last_ping = None
        self._ping_strikes = 0
        if data:
            stream.pending.append(data)
        stream.ending = end_stream
        self._send(stream, self._out)

    def respond(self, sid: int, headers: bytes | None, data: bytes | None, trailers: bytes) -> None:
        """A whole answer at once: the response header block (None if already sent), a body, the trailers."""
        stream = self.streams.get(sid)
        if stream is None or stream.ending:
            return
        self._last_ping = None
        self._ping_strikes = 0
        out = self._out
        size = self.max_frame
        n = len(data) if data else 0
        if (stream.remote_closed and not stream.pending and n <= size and n <= self.send_window
                and n <= stream.window and len(trailers) <= size and (headers is None or len(headers) <= size)):
            # The unary answer: three frames, one bytes object, and the stream is done.
            pack = _HEAD.pack
            answer = b""
            if headers is not None:
                k = len(headers)
                answer = pack(k >> 16, k & 0xFFFF, _HEADERS, f.END_HEADERS, sid) + headers
            if n:
                answer += pack(n >> 16, n & 0xFFFF, _DATA, 0, sid) + data  # type: ignore[operator]
                self.send_window -= n
            k = len(trailers)
            out.append(answer + pack(k >> 16, k & 0xFFFF, _HEADERS, f.END_HEADERS | f.END_STREAM, sid) + trailers)
            del self.streams[sid]
            return
        if headers is not None:
            self._header_frames(sid, headers, 0, out)
        if data:
            stream.pending.append(data)
        stream.ending = True
        stream.trailers = trailers
        self._send(stream, out)

    def reset_stream(self, sid: int, code: int = f.CANCEL) -> None:
        if self.streams.pop(sid, None) is not None:
            self._blocked.pop(sid, None)
            self._out.append(f.rst_stream(sid, code))

    def close(self, code: int = f.NO_ERROR, debug: bytes = b"") -> None:
        """GOAWAY: no new streams; those open may finish (NO_ERROR) or are abandoned (an error code)."""
        if self.terminated:
            return
        self.closing = True
        if code != f.NO_ERROR:
            self.terminated = True
        self._out.append(f.goaway(self.last_stream_id, code, debug))

    def _header_frames(self, sid: int, block: bytes, flags: int, out: list[bytes | memoryview]) -> None:
        size = self.max_frame
        if len(block) <= size:
            out.append(f.frame(f.HEADERS, flags | f.END_HEADERS, sid, block))
            return
        out.append(f.frame(f.HEADERS, flags, sid, block[:size]))
        for offset in range(size, len(block), size):
            last = offset + size >= len(block)
            out.append(f.frame(f.CONTINUATION, f.END_HEADERS if last else 0, sid, block[offset:offset + size]))

    def _end(self, stream: _Stream, out: list[bytes | memoryview]) -> None:
        sid = stream.sid
        if stream.trailers is not None:
            self._header_frames(sid, stream.trailers, f.END_STREAM, out)
        else:
            out.append(f.frame(f.DATA, f.END_STREAM, sid, b""))
        del self.streams[sid]
        self._blocked.pop(sid, None)
        if not stream.remote_closed:
            out.append(f.rst_stream(sid, f.NO_ERROR))  # the answer is complete: the rest of the request is not needed

    def _send(self, stream: _Stream, out: list[bytes | memoryview]) -> None:
        """Queue what the windows allow of the stream's pending data, then its end if it is due."""
        pending = stream.pending
        sid = stream.sid
        while pending:
            data = pending[0]
            n = min(len(data), self.max_frame, self.send_window, stream.window)
            if n <= 0:
                self._blocked[sid] = stream
                return
            if n < _BIG:
                out.append(f.frame(f.DATA, 0, sid, data[:n]))  # type: ignore[arg-type]
            else:  # the header and the payload apart: a big payload is not copied here
                out.append(_HEAD.pack(n >> 16, n & 0xFFFF, _DATA, 0, sid))
                out.append(data if n == len(data) else memoryview(data)[:n])
                self._apart = True
            if n == len(data):
                del pending[0]
            else:
                pending[0] = memoryview(data)[n:]  # a view: the rest is not copied once per frame
            self.send_window -= n
            stream.window -= n
        if stream.ending:
            self._end(stream, out)

    def _flush(self) -> None:
        """Windows opened: send what waited, oldest stream first."""
        blocked = self._blocked
        out = self._out
        for sid in list(blocked):
            if self.send_window <= 0:
                break
            stream = blocked.pop(sid)
            if sid in self.streams:
                self._send(stream, out)
