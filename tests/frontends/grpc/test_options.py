from __future__ import annotations

import argparse

import pytest

from naiad.frontends.grpc.options import GrpcOptions, add_arguments, from_args


@pytest.mark.parametrize(("options", "engine"), [
    (GrpcOptions(), "lean"),
    (GrpcOptions(engine="grpcio"), "grpcio"),
    (GrpcOptions(engine="lean", max_connection_age_ms=1000), "lean"),  # asked for by name: kept
    (GrpcOptions(max_connection_age_ms=1000), "grpcio"),
    (GrpcOptions(keepalive_time_ms=10_000), "grpcio"),
    (GrpcOptions(keepalive_permit_without_calls=True), "grpcio"),
])
def test_auto_engine_falls_back_to_grpcio_for_what_only_grpcio_does(options: GrpcOptions, engine: str) -> None:
    assert options.chosen_engine() == engine


@pytest.mark.parametrize(("argv", "limit"), [([], 64 * 2**20), (["--grpc-max-decompressed-size", "1000"], 1000),
                                             (["--grpc-max-decompressed-size", str(2**40)], 64 * 2**20),
                                             (["--grpc-max-decompressed-size", str(2**40),
                                               "--grpc-max-connection-buffer", str(2**40)], 2**31 - 1)])
def test_the_decompressed_size_is_grpcios_receive_limit(argv: list[str], limit: int) -> None:
    """grpc core bounds what a message decompresses to by its one receive limit (its words: "Decompressed message
    larger than max"), so that limit is the flag, within the connection's buffer (and at most the 2 GiB a message
    can frame)."""
    parser = argparse.ArgumentParser()
    add_arguments(parser, lambda p, name, default, text: p.add_argument(name, nargs="?", const=True, default=default))
    options = from_args(parser.parse_args(argv))
    assert dict(options.channel_options())["grpc.max_receive_message_length"] == limit


def test_a_decompressed_size_below_one_is_refused() -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser, lambda p, name, default, text: p.add_argument(name, nargs="?", const=True, default=default))
    with pytest.raises(ValueError, match="--grpc-max-decompressed-size must be at least 1"):
        from_args(parser.parse_args(["--grpc-max-decompressed-size", "0"]))
