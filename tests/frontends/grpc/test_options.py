from __future__ import annotations

import pytest

from naiad.frontends.grpc.options import GrpcOptions


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
