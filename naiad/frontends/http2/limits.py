"""What one HTTP/2 peer may make the server hold or do, and where each default comes from.

Defaults follow grpc-core (what ``tritonserver`` and the grpcio engine run on) where it has a limit, measured
against grpcio 1.85's server: it announces SETTINGS_MAX_HEADER_LIST_SIZE 16384 and answers a larger request header
list with RESOURCE_EXHAUSTED, and accepts any number of concurrent streams. Where grpc-core sets no bound, the
value is the common one of other servers (nghttp2, Python's h2) and RFC 9113's recommendation.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Limits:
    # SETTINGS_MAX_CONCURRENT_STREAMS: RFC 9113 6.5.2 recommends no less than 100; nghttp2's and h2's default.
    # grpc-core announces none; its clients queue calls above the limit, so nothing fails. Streams above it are
    # refused with RST_STREAM REFUSED_STREAM, which clients retry. The gRPC front end sets it from
    # --grpc-max-concurrent-streams.
    max_concurrent_streams: int = 100
    # SETTINGS_MAX_HEADER_LIST_SIZE: grpc-core's hard metadata limit (GRPC_ARG_ABSOLUTE_MAX_METADATA_SIZE,
    # 16 KiB), which it announces; a request above it is answered with the application's error.
    max_header_list_size: int = 16384
    # A header block (HEADERS + CONTINUATION, still compressed) larger than this, or split into more frames,
    # closes the connection with ENHANCE_YOUR_CALM before it is buffered (the 2024 CONTINUATION flood). A
    # block that honest encoders make for a header list under the limit is about as large as the list.
    max_header_block: int = 4 * 16384
    max_header_frames: int = 64
    # HPACK decoding stops (connection error) past this decoded size: indexed references let a small block
    # expand a thousandfold, and a block that fails halfway leaves the decoding table unusable.
    max_decoded_header_list: int = 4 * 16384
    # Our SETTINGS_MAX_FRAME_SIZE: fewer, larger frames for big tensors (grpc-core announces 4 MiB).
    max_frame_size: int = 1 << 20
    # Our receive windows (SETTINGS_INITIAL_WINDOW_SIZE and the connection's): as wide as HTTP/2 allows,
    # topped up as data arrives; a gRPC message may be up to 2 GiB (Triton's limit).
    receive_window: int = 2**31 - 1
    # SETTINGS_INITIAL_WINDOW_SIZE when the application opens stream windows itself (``grant``), as it consumes
    # what it received: a stream may then hold only this much the application hasn't asked for. None: stream
    # windows are ``receive_window``, topped up as data arrives.
    stream_window: int | None = None
    # Streams the client resets before the server answered them (CVE-2023-44487, "rapid reset"), and streams
    # the server refused: a token bucket of this burst, refilled at this rate per second (nghttp2 1.57's
    # defaults); running dry closes the connection with ENHANCE_YOUR_CALM. Only resets of streams whose request
    # had not fully arrived, or that were younger than ``reset_min_age`` seconds, count: a client whose
    # deadlines expire while the server works (grpc sends RST_STREAM CANCEL) is not an attacker, and an
    # attacker that waits that long per stream is held to max_concurrent_streams / reset_min_age calls a second.
    reset_burst: int = 1000
    reset_rate: float = 33.0
    reset_min_age: float = 0.01
    # Control frames the peer makes us answer (PING and SETTINGS acks, RST_STREAM) while it does not read
    # what we write: past this many, ENHANCE_YOUR_CALM (nghttp2's NGHTTP2_MAX_OBQ_FLOOD_ITEM).
    max_induced_frames: int = 10000
    # Settings in one SETTINGS frame (nghttp2's NGHTTP2_DEFAULT_MAX_SETTINGS); more is ENHANCE_YOUR_CALM.
    max_settings: int = 32
    # grpc-core's ping abuse policy, with Triton's flags and defaults (--grpc-http2-min-recv-ping-interval-
    # without-data 300000 ms, --grpc-http2-max-ping-strikes 2, --grpc-keepalive-permit-without-calls false):
    # a PING sooner than the interval after the previous one, with no HEADERS or DATA sent in between, is a
    # strike (with no call in flight and pings without calls not permitted, the interval is two hours); more
    # strikes than the maximum end the connection with GOAWAY ENHANCE_YOUR_CALM "too_many_pings". 0 strikes:
    # no limit.
    min_ping_interval: float = 300.0
    max_ping_strikes: int = 2
    ping_without_calls: bool = False
    idle_ping_interval: float = 7200.0
