"""The gRPC front end's settings and their ``tritonserver`` flag names. No grpc import here: the CLI reads
these before deciding what to start."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass, field

from naiad.core.forwarding import HeaderForward
from naiad.core.restricted import Restrictions, help_text

# Triton's limit on both directions (grpc_server.cc): any message an int32 length can frame.
MAX_MESSAGE_SIZE = 2**31 - 1
# What a compressed request message may expand to unless --grpc-max-decompressed-size says otherwise: the default of
# --http-max-input-size, which bounds HTTP bodies (and what they expand to) the same way.
MAX_DECOMPRESSED_SIZE = 64 * 1024 * 1024
# Triton looks a restricted protocol's key up as metadata with this prefix (grpc_server.h).
RESTRICTED_KEY_PREFIX = "triton-grpc-protocol-"
COMPRESSION_LEVELS = ("none", "low", "medium", "high")
# Streams one connection may have open at once: the lean engine's SETTINGS_MAX_CONCURRENT_STREAMS
# (naiad/frontends/http2/limits.py), and grpcio's grpc.max_concurrent_streams.
MAX_CONCURRENT_STREAMS = 100


def compression_for(level: str, accepted: str) -> str | None:
    """The algorithm grpc picks for a compression level among those the client accepts (grpc-accept-encoding),
    ranked by strength: low takes the first, medium the middle, high the last (grpc's
    CompressionAlgorithmForLevel, which Triton's set_compression_level leaves the choice to)."""
    offered = {name.strip() for name in accepted.split(",")}
    ranked = [name for name in ("gzip", "deflate") if name in offered]
    if level == "none" or not ranked:
        return None
    return ranked[{"low": 0, "medium": len(ranked) // 2, "high": -1}[level]]


@dataclass
class GrpcOptions:
    enabled: bool = True
    address: str = "0.0.0.0"
    port: int = 8001
    reuse_port: bool = False
    # Triton's keepalive defaults (KeepAliveOptions in grpc_server.h); 0 leaves max connection age unset.
    keepalive_time_ms: int = 7_200_000
    keepalive_timeout_ms: int = 20_000
    keepalive_permit_without_calls: bool = False
    http2_max_pings_without_data: int = 2
    http2_min_recv_ping_interval_without_data_ms: int = 300_000
    http2_max_ping_strikes: int = 2
    max_connection_age_ms: int = 0
    max_connection_age_grace_ms: int = 0
    infer_allocation_pool_size: int = 8
    # TLS as Triton serves it: mutual implies TLS and refuses a client without a certificate the root signed.
    use_ssl: bool = False
    use_ssl_mutual: bool = False
    server_cert: str = ""  # PEM files
    server_key: str = ""
    root_cert: str = ""
    infer_compression_level: str = "none"  # of ModelInfer / ModelStreamInfer answers (grpcio: every RPC's)
    # The most a compressed request message may expand to (a 1 MB gzip bomb gives 1 GB). grpc core has one limit for
    # a message as received and as decompressed, so under grpcio this caps uncompressed messages too; the lean
    # engine keeps Triton's 2 GiB for those.
    max_decompressed_size: int = MAX_DECOMPRESSED_SIZE
    restricted: Restrictions = field(default_factory=lambda: Restrictions("protocol"))
    header_forward: HeaderForward | None = None
    # SETTINGS_MAX_CONCURRENT_STREAMS, per connection, on both engines. Calls above it wait in the client, where
    # no queue policy sees them (grpc-core, which Triton runs on, sets no limit): large enough that clients'
    # concurrency reaches the models' queues, which answer overload with UNAVAILABLE; bounded, for the memory one
    # connection's open streams can hold.
    max_concurrent_streams: int = 1000
    # naiad's own connection budget (Triton has none; see README "Slow and greedy clients"): request bytes one
    # connection may have buffered or in flight (the lean engine opens windows only within it; a larger message is
    # refused RESOURCE_EXHAUSTED, as grpcio's max_receive_message_length, which it also sets), connections per port
    # (lowered to fit the open file limit) and per client address, and how long a connection may stay without
    # sending the HTTP/2 preface, or without calls.
    max_connection_buffer: int = 64 * 1024 * 1024
    max_connections: int = 1024
    max_connections_per_address: int = 256
    preface_timeout: float = 10.0
    idle_timeout: float = 300.0
    # "grpcio" (grpc.aio), "lean" (our own HTTP/2 on asyncio: no poller thread or tasks per unary call), or
    # "auto": lean unless a flag asks for what only grpcio does (server keepalive pings, connection age).
    engine: str = "auto"

    def chosen_engine(self) -> str:
        if self.engine != "auto":
            return self.engine
        defaults = GrpcOptions()
        needs_grpcio = (self.max_connection_age_ms or self.max_connection_age_grace_ms
                        or self.keepalive_time_ms != defaults.keepalive_time_ms
                        or self.keepalive_permit_without_calls)
        return "grpcio" if needs_grpcio else "lean"

    def tls_files(self) -> tuple[bytes, bytes, bytes | None]:
        """The PEM contents of the certificate, its key and (mutual TLS) the client CA, read when the server starts
        as Triton reads them; exits with a clear line for a file it can't read (Triton then starts no gRPC service
        either)."""
        def read(option: str, path: str) -> bytes:
            try:
                with open(path, "rb") as file:
                    return file.read()
            except OSError as exc:
                raise SystemExit(f"error: failed to start GRPC service: Unavailable - cannot read {option} "
                                 f"'{path}': {exc.strerror or exc}") from None

        return (read("--grpc-server-cert", self.server_cert), read("--grpc-server-key", self.server_key),
                read("--grpc-root-cert", self.root_cert) if self.use_ssl_mutual else None)

    def channel_options(self) -> list[tuple[str, int]]:
        options = [
            ("grpc.max_receive_message_length", min(self.max_decompressed_size, self.max_connection_buffer,
                                                    MAX_MESSAGE_SIZE)),
            ("grpc.max_send_message_length", MAX_MESSAGE_SIZE),
            ("grpc.so_reuseport", int(self.reuse_port)),
            ("grpc.keepalive_time_ms", self.keepalive_time_ms),
            ("grpc.keepalive_timeout_ms", self.keepalive_timeout_ms),
            ("grpc.keepalive_permit_without_calls", int(self.keepalive_permit_without_calls)),
            ("grpc.http2.max_pings_without_data", self.http2_max_pings_without_data),
            ("grpc.http2.min_ping_interval_without_data_ms", self.http2_min_recv_ping_interval_without_data_ms),
            ("grpc.http2.max_ping_strikes", self.http2_max_ping_strikes),
            ("grpc.max_concurrent_streams", self.max_concurrent_streams),
            ("grpc.server_handshake_timeout_ms", _ms(self.preface_timeout)),
        ]
        if self.idle_timeout:
            options.append(("grpc.max_connection_idle_ms", _ms(self.idle_timeout)))
        if self.max_connection_age_ms:
            options.append(("grpc.max_connection_age_ms", self.max_connection_age_ms))
        if self.max_connection_age_grace_ms:
            options.append(("grpc.max_connection_age_grace_ms", self.max_connection_age_grace_ms))
        if self.infer_compression_level != "none":
            # grpc.aio can't set a level per call (set_compression takes a fixed algorithm, which the client may
            # not accept): the channel's default level picks per client as Triton's per-call level does, for
            # every RPC's answer.
            level = COMPRESSION_LEVELS.index(self.infer_compression_level)  # grpc_compression_level's values
            options.append(("grpc.default_compression_level", level))
        return options


def _ms(seconds: float) -> int:
    return int(seconds * 1000) if seconds > 0 else 2**31 - 1  # 0: never (grpc's "infinite")


def add_arguments(parser: argparse.ArgumentParser, flag: Callable[..., None]) -> None:
    """Triton's gRPC flags; ``flag`` adds a boolean the way the CLI spells them (``--x`` or ``--x=false``)."""
    defaults = GrpcOptions()
    flag(parser, "--allow-grpc", True, "serve GRPCInferenceService")
    parser.add_argument("--grpc-address", default=defaults.address, help="address the gRPC server binds")
    parser.add_argument("--grpc-port", type=int, default=defaults.port, help="GRPCInferenceService port")
    flag(parser, "--reuse-grpc-port", False, "let several servers listen on the gRPC port (SO_REUSEPORT)")
    ints = {
        "--grpc-keepalive-time": (defaults.keepalive_time_ms, "period of the server's keepalive pings"),
        "--grpc-keepalive-timeout": (defaults.keepalive_timeout_ms, "how long a keepalive ping waits for its ack"),
        "--grpc-http2-max-pings-without-data": (defaults.http2_max_pings_without_data,
                                                "pings sent with no data in between (0: no limit)"),
        "--grpc-http2-min-recv-ping-interval-without-data": (
            defaults.http2_min_recv_ping_interval_without_data_ms,
            "a client ping sooner than this after the last one, with no data between, is a strike"),
        "--grpc-http2-max-ping-strikes": (defaults.http2_max_ping_strikes,
                                          "strikes before the connection is closed (0: no limit)"),
        "--grpc-max-connection-age": (defaults.max_connection_age_ms, "longest a connection lives (0: unlimited)"),
        "--grpc-max-connection-age-grace": (defaults.max_connection_age_grace_ms,
                                            "grace for calls in flight when a connection reaches its age (0: unset)"),
    }
    for name, (default, text) in ints.items():
        counts = name.endswith(("-without-data", "-strikes")) and "interval" not in name
        parser.add_argument(name, type=int, default=default, metavar="N" if counts else "MS", help=text)
    flag(parser, "--grpc-keepalive-permit-without-calls", False, "allow keepalive pings with no call in flight")
    parser.add_argument("--grpc-max-concurrent-streams", type=int, default=defaults.max_concurrent_streams,
                        metavar="N",
                        help="naiad only: calls one connection may have in flight (HTTP/2 SETTINGS_MAX_CONCURRENT_"
                             "STREAMS; both engines). A client's calls above it wait in the client, unseen by the "
                             "models' queue policies, so keep it above your clients' concurrency per connection")
    parser.add_argument("--grpc-infer-allocation-pool-size", type=int, default=defaults.infer_allocation_pool_size,
                        help="accepted for Triton compatibility; Python allocates per request, so it has no effect")
    flag(parser, "--grpc-use-ssl", defaults.use_ssl,
         "serve gRPC over TLS with --grpc-server-cert and --grpc-server-key")
    flag(parser, "--grpc-use-ssl-mutual", defaults.use_ssl_mutual,
         "TLS that also requires a client certificate signed by --grpc-root-cert (implies --grpc-use-ssl)")
    parser.add_argument("--grpc-server-cert", default=defaults.server_cert, metavar="PEM_FILE",
                        help="the server's certificate (chain)")
    parser.add_argument("--grpc-server-key", default=defaults.server_key, metavar="PEM_FILE",
                        help="the server certificate's private key")
    parser.add_argument("--grpc-root-cert", default=defaults.root_cert, metavar="PEM_FILE",
                        help="the certificate authority that signs client certificates (mutual TLS)")
    parser.add_argument("--grpc-infer-response-compression-level", default=defaults.infer_compression_level,
                        metavar="{none,low,medium,high}",
                        help="compress ModelInfer / ModelStreamInfer responses (the grpcio engine: every RPC's): "
                             "low = gzip, medium / high = deflate when the client accepts both (grpc's choice by "
                             "level)")
    parser.add_argument("--grpc-max-decompressed-size", type=int, default=defaults.max_decompressed_size,
                        metavar="BYTES",
                        help="naiad only: the most a compressed (gzip / deflate) request message may expand to; past "
                             "it the call ends RESOURCE_EXHAUSTED. grpcio has one limit for a message as received and "
                             "as decompressed, so with --grpc-engine=grpcio it caps uncompressed messages too (the "
                             "lean engine takes those up to Triton's 2 GiB)")
    parser.add_argument("--grpc-restricted-protocol", action="append", default=[],
                        metavar="<protocols>:<key>=<value>",
                        help=help_text("protocol", f"the metadata {RESTRICTED_KEY_PREFIX}<key>")
                        + "; refused with UNAVAILABLE")
    parser.add_argument("--grpc-header-forward-pattern", default="", metavar="REGEX",
                        help="ModelInfer / ModelStreamInfer metadata whose key this regular expression matches "
                             "(anywhere in the key, ignoring case) reach the model as string parameters; empty: none")
    parser.add_argument("--grpc-max-connection-buffer", type=int, default=defaults.max_connection_buffer,
                        metavar="BYTES", help="request bytes one connection may have received and not yet "
                        "answered (lean engine: flow-control windows open only within it) and the largest request "
                        "message; a larger message is refused RESOURCE_EXHAUSTED")
    parser.add_argument("--grpc-max-connections", type=int, default=defaults.max_connections, metavar="N",
                        help="connections served at once (lowered to fit the open file limit); past it a call is "
                             "answered UNAVAILABLE and the connection closed (grpcio: refused); 0: only the open "
                             "file limit's")
    parser.add_argument("--grpc-max-connections-per-address", type=int,
                        default=defaults.max_connections_per_address, metavar="N",
                        help="connections one client address may hold at once (lean engine); 0: no limit")
    parser.add_argument("--grpc-preface-timeout", type=float, default=defaults.preface_timeout, metavar="SECONDS",
                        help="a connection that has not sent the HTTP/2 preface (and TLS handshake) by then is "
                             "closed; 0: never")
    parser.add_argument("--grpc-idle-timeout", type=float, default=defaults.idle_timeout, metavar="SECONDS",
                        help="a connection with no call for this long gets GOAWAY and is closed (clients reconnect "
                             "on their next call); 0: never")
    parser.add_argument("--grpc-engine", choices=("auto", "grpcio", "lean"), default=defaults.engine,
                        help="naiad only: grpcio's asyncio server, or naiad's lean HTTP/2 server (about 2-3x the unary "
                             "throughput; no server keepalive pings, connection age or deadlines); auto = lean "
                             "unless a keepalive / connection-age flag needs grpcio")


def from_args(args: argparse.Namespace) -> GrpcOptions:
    """Raises ``ValueError`` with Triton's message for a malformed flag."""
    if args.grpc_max_connection_buffer < 1 << 16:
        raise ValueError(f"--grpc-max-connection-buffer must be at least 65536, got {args.grpc_max_connection_buffer}")
    for name in ("max_connections", "max_connections_per_address", "preface_timeout", "idle_timeout"):
        value = getattr(args, "grpc_" + name)
        if value < 0:
            raise ValueError(f"--grpc-{name.replace('_', '-')} must not be negative, got {value}")
    level = args.grpc_infer_response_compression_level.lower()
    if level not in COMPRESSION_LEVELS:
        raise ValueError("invalid argument for --grpc_infer_response_compression_level")
    pattern = args.grpc_header_forward_pattern
    if args.grpc_max_concurrent_streams < 1:
        raise ValueError("--grpc-max-concurrent-streams must be at least 1")
    return GrpcOptions(
        enabled=args.allow_grpc,
        address=args.grpc_address,
        port=args.grpc_port,
        reuse_port=args.reuse_grpc_port,
        keepalive_time_ms=args.grpc_keepalive_time,
        keepalive_timeout_ms=args.grpc_keepalive_timeout,
        keepalive_permit_without_calls=args.grpc_keepalive_permit_without_calls,
        http2_max_pings_without_data=args.grpc_http2_max_pings_without_data,
        http2_min_recv_ping_interval_without_data_ms=args.grpc_http2_min_recv_ping_interval_without_data,
        http2_max_ping_strikes=args.grpc_http2_max_ping_strikes,
        max_connection_age_ms=args.grpc_max_connection_age,
        max_connection_age_grace_ms=args.grpc_max_connection_age_grace,
        max_concurrent_streams=args.grpc_max_concurrent_streams,
        infer_allocation_pool_size=args.grpc_infer_allocation_pool_size,
        engine=args.grpc_engine,
        use_ssl=args.grpc_use_ssl or args.grpc_use_ssl_mutual,
        use_ssl_mutual=args.grpc_use_ssl_mutual,
        server_cert=args.grpc_server_cert,
        server_key=args.grpc_server_key,
        root_cert=args.grpc_root_cert,
        infer_compression_level=level,
        max_decompressed_size=_positive(args.grpc_max_decompressed_size, "--grpc-max-decompressed-size"),
        restricted=Restrictions.parse(args.grpc_restricted_protocol, "grpc-restricted-protocol", "protocol",
                                      RESTRICTED_KEY_PREFIX),
        header_forward=HeaderForward(pattern) if pattern else None,
        max_connection_buffer=args.grpc_max_connection_buffer,
        max_connections=args.grpc_max_connections,
        max_connections_per_address=args.grpc_max_connections_per_address,
        preface_timeout=args.grpc_preface_timeout,
        idle_timeout=args.grpc_idle_timeout,
    )


def _positive(value: int, flag: str) -> int:
    if value < 1:
        raise ValueError(f"{flag} must be at least 1, got {value}")
    return value
