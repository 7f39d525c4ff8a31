"""The gRPC front end's settings and their ``tritonserver`` flag names. No grpc import here: the CLI reads
these before deciding what to start."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass

# Triton's limit on both directions (grpc_server.cc): any message an int32 length can frame.
MAX_MESSAGE_SIZE = 2**31 - 1


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

    def channel_options(self) -> list[tuple[str, int]]:
        options = [
            ("grpc.max_receive_message_length", MAX_MESSAGE_SIZE),
            ("grpc.max_send_message_length", MAX_MESSAGE_SIZE),
            ("grpc.so_reuseport", int(self.reuse_port)),
            ("grpc.keepalive_time_ms", self.keepalive_time_ms),
            ("grpc.keepalive_timeout_ms", self.keepalive_timeout_ms),
            ("grpc.keepalive_permit_without_calls", int(self.keepalive_permit_without_calls)),
            ("grpc.http2.max_pings_without_data", self.http2_max_pings_without_data),
            ("grpc.http2.min_ping_interval_without_data_ms", self.http2_min_recv_ping_interval_without_data_ms),
            ("grpc.http2.max_ping_strikes", self.http2_max_ping_strikes),
        ]
        if self.max_connection_age_ms:
            options.append(("grpc.max_connection_age_ms", self.max_connection_age_ms))
        if self.max_connection_age_grace_ms:
            options.append(("grpc.max_connection_age_grace_ms", self.max_connection_age_grace_ms))
        return options


def add_arguments(parser: argparse.ArgumentParser, flag: Callable[..., None]) -> None:
    """Triton's gRPC flags; ``flag`` adds a boolean the way the CLI spells them (``--x`` or ``--x=false``)."""
    defaults = GrpcOptions()
    flag(parser, "--allow-grpc", True, "serve GRPCInferenceService")
    parser.add_argument("--grpc-address", default=defaults.address)
    parser.add_argument("--grpc-port", type=int, default=defaults.port)
    flag(parser, "--reuse-grpc-port", False, "let several servers listen on the gRPC port (SO_REUSEPORT)")
    ints = {
        "--grpc-keepalive-time": defaults.keepalive_time_ms,
        "--grpc-keepalive-timeout": defaults.keepalive_timeout_ms,
        "--grpc-http2-max-pings-without-data": defaults.http2_max_pings_without_data,
        "--grpc-http2-min-recv-ping-interval-without-data": defaults.http2_min_recv_ping_interval_without_data_ms,
        "--grpc-http2-max-ping-strikes": defaults.http2_max_ping_strikes,
        "--grpc-max-connection-age": defaults.max_connection_age_ms,
        "--grpc-max-connection-age-grace": defaults.max_connection_age_grace_ms,
    }
    for name, default in ints.items():
        counts = name.endswith(("-without-data", "-strikes")) and "interval" not in name
        parser.add_argument(name, type=int, default=default, metavar="N" if counts else "MS")
    flag(parser, "--grpc-keepalive-permit-without-calls", False, "allow keepalive pings with no call in flight")
    parser.add_argument("--grpc-infer-allocation-pool-size", type=int, default=defaults.infer_allocation_pool_size,
                        help="accepted for Triton compatibility; Python allocates per request, so it has no effect")
    parser.add_argument("--grpc-engine", choices=("auto", "grpcio", "lean"), default=defaults.engine,
                        help="naiad only: grpcio's asyncio server, or naiad's lean HTTP/2 server (about 2-3x the unary "
                             "throughput; no server keepalive pings, connection age, response compression or "
                             "deadlines); auto (default) = lean unless a keepalive/connection-age flag needs grpcio")


def from_args(args: argparse.Namespace) -> GrpcOptions:
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
        infer_allocation_pool_size=args.grpc_infer_allocation_pool_size,
        engine=args.grpc_engine,
    )
