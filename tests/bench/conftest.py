"""One naiad for the bench tests: the bundled examples (add_sub) plus two models written here: ``slow`` (one
instance, 5 ms per request, so its capacity is fixed and latency grows with users) and ``triple`` (decoupled:
three responses per request)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.models import write_model
from tests.server import EXAMPLES, RunningServer

SLOW_CONFIG = """
    name: "slow"
    backend: "python"
    input [{ name: "INPUT0", data_type: TYPE_FP32, dims: [ 4 ] }]
    output [{ name: "OUTPUT0", data_type: TYPE_FP32, dims: [ 4 ] }]
    instance_group [{ count: 1, kind: KIND_CPU }]
"""

SLOW_PY = """
    import time

    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def execute(self, requests):
            out = []
            for r in requests:
                time.sleep(0.005)
                out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", r.inputs()[0].as_numpy())]))
            return out
"""

TRIPLE_CONFIG = """
    name: "triple"
    backend: "python"
    model_transaction_policy { decoupled: true }
    input [{ name: "IN", data_type: TYPE_INT32, dims: [ 2 ] }]
    output [{ name: "OUT", data_type: TYPE_INT32, dims: [ 2 ] }]
"""

TRIPLE_PY = """
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def execute(self, requests):
            for r in requests:
                sender = r.get_response_sender()
                x = pb_utils.get_input_tensor_by_name(r, "IN").as_numpy()
                for _ in range(3):
                    sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", x)]))
                sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            return None
"""


# A sequence model: naiad bench refuses it with a clear message (it does not send sequences).
SEQ_CONFIG = """
    name: "seq"
    backend: "python"
    max_batch_size: 4
    sequence_batching { }
    input [{ name: "IN", data_type: TYPE_INT32, dims: [ 1 ] }]
    output [{ name: "OUT", data_type: TYPE_INT32, dims: [ 1 ] }]
"""

SEQ_PY = """
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def execute(self, requests):
            return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", r.inputs()[0].as_numpy())]) for r in requests]
"""


@pytest.fixture(scope="package")
def bench_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    repo = tmp_path_factory.mktemp("bench_models")
    write_model(repo, "slow", SLOW_CONFIG, SLOW_PY)
    write_model(repo, "triple", TRIPLE_CONFIG, TRIPLE_PY)
    write_model(repo, "seq", SEQ_CONFIG, SEQ_PY)
    server = RunningServer([EXAMPLES, repo])
    yield server
    server.stop()
