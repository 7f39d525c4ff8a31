"""One naiad server for the gRPC tests: the bundled examples plus models written here."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.models import write_model
from tests.server import EXAMPLES, RunningServer

DTYPES = ("BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64", "FP16", "FP32", "FP64",
          "BYTES")


def _config_type(datatype: str) -> str:
    return "TYPE_STRING" if datatype == "BYTES" else f"TYPE_{datatype}"


def write_grpc_models(repo: Path) -> None:
    ios = ",\n".join(f'{{ name: "IN_{t}", data_type: {_config_type(t)}, dims: [ -1 ], optional: true }}'
                     for t in DTYPES)
    outs = ",\n".join(f'{{ name: "OUT_{t}", data_type: {_config_type(t)}, dims: [ -1 ] }}' for t in DTYPES)
    # Every input optional: each IN_<T> present is echoed to OUT_<T>.
    write_model(repo, "dtypes", f"""
        name: "dtypes"
        backend: "python"
        input [ {ios} ]
        output [ {outs} ]
    """, """
        import triton_python_backend_utils as pb_utils

        class TritonPythonModel:
            def execute(self, requests):
                return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT_" + t.name()[3:], t.as_numpy())
                                                    for t in r.inputs()]) for r in requests]
    """)
    # MODE 0 echoes, 1 answers with an error, 2 raises from execute().
    write_model(repo, "fail", """
        name: "fail"
        backend: "python"
        input [ { name: "MODE", data_type: TYPE_INT32, dims: [ 1 ] } ]
        output [ { name: "OUT", data_type: TYPE_INT32, dims: [ 1 ] } ]
    """, """
        import triton_python_backend_utils as pb_utils

        class TritonPythonModel:
            def execute(self, requests):
                responses = []
                for r in requests:
                    mode = int(r.inputs()[0].as_numpy()[0])
                    if mode == 2:
                        raise ValueError("raised on purpose")
                    if mode == 1:
                        responses.append(pb_utils.InferenceResponse([], error=pb_utils.TritonError("error on purpose")))
                    else:
                        responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", r.inputs()[0].as_numpy())]))
                return responses
    """)
    # What the model saw of the request besides its tensors.
    write_model(repo, "params", """
        name: "params"
        backend: "python"
        input [ { name: "INPUT0", data_type: TYPE_FP32, dims: [ -1 ] } ]
        output [ { name: "SEEN", data_type: TYPE_STRING, dims: [ 1 ] } ]
    """, """
        import json
        import numpy as np
        import triton_python_backend_utils as pb_utils

        class TritonPythonModel:
            def execute(self, requests):
                out = []
                for r in requests:
                    seen = {"parameters": json.loads(r.parameters()), "correlation_id": r.correlation_id(),
                            "flags": r.flags(), "id": r.request_id()}
                    out.append(pb_utils.InferenceResponse([pb_utils.Tensor(
                        "SEEN", np.array([json.dumps(seen).encode()], dtype=np.object_))]))
                return out
    """)
    write_model(repo, "decoupled", """
        name: "decoupled"
        backend: "python"
        model_transaction_policy { decoupled: true }
        input [ { name: "INPUT0", data_type: TYPE_FP32, dims: [ -1 ] } ]
        output [ { name: "OUTPUT0", data_type: TYPE_FP32, dims: [ -1 ] } ]
    """, """
        import triton_python_backend_utils as pb_utils

        class TritonPythonModel:
            # Three responses per request (the input, plus 0, 1, 2), then only the "complete" flag.
            def execute(self, requests):
                for r in requests:
                    x = r.inputs()[0].as_numpy()
                    sender = r.get_response_sender()
                    for i in range(3):
                        sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x + i)]))
                    sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                return None
    """)


# Every test of this package runs against both server engines: grpc.aio and naiad's lean HTTP/2 server.
@pytest.fixture(scope="package", params=("grpcio", "lean"))
def grpc_server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    repo = tmp_path_factory.mktemp("grpc_models")
    write_grpc_models(repo)
    # Non-default keepalive settings: the server must take Triton's flags and still serve.
    server = RunningServer([EXAMPLES, repo], "--grpc-keepalive-time", "10000", "--grpc-keepalive-timeout", "5000",
                           "--grpc-keepalive-permit-without-calls", "true", "--grpc-http2-max-pings-without-data", "0",
                           "--grpc-http2-min-recv-ping-interval-without-data", "1000",
                           "--grpc-http2-max-ping-strikes", "0", "--grpc-max-connection-age", "600000",
                           "--grpc-max-connection-age-grace", "5000", "--grpc-infer-allocation-pool-size", "16",
                           "--grpc-engine", request.param)
    yield server
    server.stop()
