"""What ``H2Connection.receive`` reports. Plain ``__slots__`` classes: one or two are made per request, so they stay
as cheap as the tuples they could have been while keeping names."""

from __future__ import annotations


class RequestReceived:
    """A new stream's request header block. ``headers`` may be shared with other events of the connection (a
    repeated block is decoded once): read it, never change it. ``oversize`` is the header list's size
    (RFC 9113 section 6.5.2's measure) when it exceeds the advertised SETTINGS_MAX_HEADER_LIST_SIZE, else 0:
    the stream is open, and the application answers it with its own error."""

    __slots__ = ("stream_id", "headers", "end_stream", "oversize")

    def __init__(self, stream_id: int, headers: list[tuple[str, str]], end_stream: bool, oversize: int) -> None:
        self.stream_id = stream_id
        self.headers = headers
        self.end_stream = end_stream
        self.oversize = oversize

    def __repr__(self) -> str:
        return f"RequestReceived({self.stream_id}, {self.headers!r}, end_stream={self.end_stream})"


class DataReceived:
    """A DATA frame's content (padding removed), or of a big frame part of it as it arrives (a read-only view:
    keep a copy). Flow control is the core's business: it tops the windows up."""

    __slots__ = ("stream_id", "data", "end_stream")

    def __init__(self, stream_id: int, data: bytes | bytearray | memoryview, end_stream: bool) -> None:
        self.stream_id = stream_id
        self.data = data
        self.end_stream = end_stream

    def __repr__(self) -> str:
        return f"DataReceived({self.stream_id}, {len(self.data)} bytes, end_stream={self.end_stream})"


class TrailersReceived:
    """The request's trailing header block, which ends the client's side of the stream."""

    __slots__ = ("stream_id", "headers")

    def __init__(self, stream_id: int, headers: list[tuple[str, str]]) -> None:
        self.stream_id = stream_id
        self.headers = headers

    def __repr__(self) -> str:
        return f"TrailersReceived({self.stream_id})"


class StreamReset:
    """A stream ended before the server finished it: reset by the client (``remote``), or by the core for a stream
    error (it sent RST_STREAM with ``error_code``). Either way, the work behind it is no longer wanted."""

    __slots__ = ("stream_id", "error_code", "remote")

    def __init__(self, stream_id: int, error_code: int, remote: bool) -> None:
        self.stream_id = stream_id
        self.error_code = error_code
        self.remote = remote

    def __repr__(self) -> str:
        return f"StreamReset({self.stream_id}, error_code={self.error_code}, remote={self.remote})"


class GoAwayReceived:
    """The client is leaving: no new streams will come; those in flight may still be answered."""

    __slots__ = ("error_code", "last_stream_id")

    def __init__(self, error_code: int, last_stream_id: int) -> None:
        self.error_code = error_code
        self.last_stream_id = last_stream_id

    def __repr__(self) -> str:
        return f"GoAwayReceived(error_code={self.error_code}, last_stream_id={self.last_stream_id})"


class ConnectionTerminated:
    """A connection error: the core queued GOAWAY with ``error_code`` and will read nothing more. Write what
    ``data_to_send()`` holds, then close the transport; every stream still open is abandoned."""

    __slots__ = ("error_code", "debug")

    def __init__(self, error_code: int, debug: bytes) -> None:
        self.error_code = error_code
        self.debug = debug

    def __repr__(self) -> str:
        return f"ConnectionTerminated(error_code={self.error_code}, debug={self.debug!r})"


Event = RequestReceived | DataReceived | TrailersReceived | StreamReset | GoAwayReceived | ConnectionTerminated
