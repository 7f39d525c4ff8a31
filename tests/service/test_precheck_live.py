"""Requests checked in front-end processes (``--frontend-processes 2``) answer exactly as with one process: the same
outputs, the same refusals in the same words and status codes, the same statistics. Reshapes, raw binary input,
batch limits, BYTES, requested outputs; HTTP (http.client) and gRPC (tritonclient) against running servers."""

from __future__ import annotations

import http.client
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests import onnx_graphs as g
from tests.server import RunningServer

RESHAPED = """
    name: "reshaped"
    platform: "onnxruntime_onnx"
    max_batch_size: 4
    input [{ name: "INPUT0", data_type: TYPE_FP32, dims: [ 4 ], reshape { shape: [ 2, 2 ] } }]
    output [{ name: "OUTPUT0", data_type: TYPE_FP32, dims: [ 4 ], reshape { shape: [ 2, 2 ] } }]
"""

VARIABLE = """
    name: "variable"
    platform: "onnxruntime_onnx"
    max_batch_size: 0
    input [{ name: "INPUT0", data_type: TYPE_FP32, dims: [ -1 ] }]
    output [{ name: "OUTPUT0", data_type: TYPE_FP32, dims: [ -1 ] }]
"""

STRINGS = """
    name: "strings"
    platform: "onnxruntime_onnx"
    max_batch_size: 0
    input [{ name: "INPUT0", data_type: TYPE_STRING, dims: [ 1 ] }]
    output [{ name: "OUTPUT0", data_type: TYPE_STRING, dims: [ 1 ] }]
"""

RAW = {"Inference-Header-Content-Length": "0", "Content-Type": "application/octet-stream"}


def _json(name: str, datatype: str, shape: list[int], data: list, outputs: list[str] | None = None) -> bytes:
    body: dict[str, Any] = {"inputs": [{"name": name, "datatype": datatype, "shape": shape, "data": data}]}
    if outputs is not None:
        body["outputs"] = [{"name": o} for o in outputs]
    return json.dumps(body).encode()


# (model, body, headers, refused): each sent once per server over HTTP.
HTTP_CASES = [
    ("reshaped", _json("INPUT0", "FP32", [3, 4], list(range(12))), {}, False),
    ("reshaped", _json("INPUT0", "FP32", [5, 4], list(range(20))), {}, True),  # batch over the maximum
    ("reshaped", _json("INPUT0", "FP64", [1, 4], [1, 2, 3, 4]), {}, True),
    ("reshaped", _json("INPUT0", "FP32", [2, 5], list(range(10))), {}, True),
    ("reshaped", _json("INPUT0", "FP32", [2, 2, 2], list(range(8))), {}, True),  # the reshaped shape: not the client's
    ("reshaped", _json("WRONG", "FP32", [1, 4], [1, 2, 3, 4]), {}, True),
    ("reshaped", _json("INPUT0", "FP32", [1, 4], [1, 2, 3, 4], ["NOPE"]), {}, True),
    ("reshaped", json.dumps({"inputs": []}).encode(), {}, True),
    ("reshaped", np.arange(4, dtype=np.float32).tobytes(), RAW, False),  # raw input, then its reshape
    ("reshaped", np.arange(5, dtype=np.float32).tobytes(), RAW, True),
    ("variable", np.arange(5, dtype=np.float32).tobytes(), RAW, False),
    ("variable", b"\0" * 6, RAW, True),
    ("variable", _json("INPUT0", "INT32", [3], [1, 2, 3]), {}, True),
    ("strings", _json("INPUT0", "BYTES", [1], ["naiad"]), {}, False),
    ("strings", b"raw bytes", RAW, False),
    ("strings", _json("INPUT0", "BYTES", [2], ["a", "b"]), {}, True),
]


def _http(server: RunningServer) -> list[tuple[int, Any]]:
    answers: list[tuple[int, Any]] = []
    conn = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=30)
    try:
        for model, body, headers, _ in HTTP_CASES:
            conn.request("POST", f"/v2/models/{model}/infer", body, headers)
            response = conn.getresponse()
            data = response.read()
            length = response.getheader("Inference-Header-Content-Length")
            answers.append((response.status, (json.loads(data[:int(length)]), data[int(length):]) if length
                            else json.loads(data)))
    finally:
        conn.close()
    return answers


def _grpc(server: RunningServer) -> list[Any]:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    answers: list[Any] = []
    for shape, datatype in (((2, 4), "FP32"), ((5, 4), "FP32"), ((1, 4), "FP64"), ((2, 2, 2), "FP32")):
        tensor = grpcclient.InferInput("INPUT0", list(shape), datatype)
        tensor.set_data_from_numpy(np.ones(shape, np.float32 if datatype == "FP32" else np.float64))
        try:
            answers.append(client.infer("reshaped", [tensor]).as_numpy("OUTPUT0").tolist())
        except InferenceServerException as exc:
            answers.append((exc.status(), exc.message()))
    client.close()
    return answers


def _statistics(server: RunningServer) -> dict[str, tuple]:
    figures = {}
    for model in ("reshaped", "variable", "strings"):
        status, _, body = server.request("GET", f"/v2/models/{model}/stats")
        assert status == 200, body
        (stats,) = json.loads(body)["model_stats"]
        inference = stats["inference_stats"]
        figures[model] = (inference["success"]["count"], inference["fail"]["count"], stats["inference_count"],
                          stats["execution_count"])
    return figures


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = tmp_path_factory.mktemp("precheck")
    g.write(repo, "reshaped", g.identity("TYPE_FP32", ["batch", 2, 2]), RESHAPED)
    g.write(repo, "variable", g.identity("TYPE_FP32", ["n"]), VARIABLE)
    g.write(repo, "strings", g.identity("TYPE_STRING", [1]), STRINGS)
    return repo


def _answers(repo: Path, processes: int) -> tuple:
    server = RunningServer([repo], "--frontend-processes", str(processes))
    try:
        return _http(server), _grpc(server), _statistics(server)
    finally:
        server.stop()


def test_front_end_processes_answer_and_count_as_one_process(repo: Path) -> None:
    one = _answers(repo, 1)
    two = _answers(repo, 2)
    http_answers, grpc_answers, statistics = two
    assert http_answers == one[0]
    assert grpc_answers == one[1]
    assert statistics == one[2]

    # Not vacuous: what was answered and refused, in Triton's words.
    for (model, _, _, refused), (status, _) in zip(HTTP_CASES, http_answers):
        assert status == (400 if refused else 200), (model, status)
    (output,) = http_answers[0][1]["outputs"]
    assert output["shape"] == [3, 4] and output["data"] == list(range(12))  # the output's reshape undone
    assert http_answers[1][1]["error"] == ("[request id: <id_unknown>] inference request batch-size must be <= 4 "
                                           "for 'reshaped'")
    assert http_answers[9][1]["error"] == ("[request id: <id_unknown>] input byte size mismatch for input 'INPUT0' "
                                           "for model 'reshaped'. Expected 16, got 20")
    assert http_answers[4][1]["error"].startswith("[request id: <id_unknown>] unexpected shape for input 'INPUT0' "
                                                  "for model 'reshaped'. Expected [-1,4], got [2,2,2].")
    assert grpc_answers[0] == [[1.0] * 4] * 2
    assert grpc_answers[1][0] == "StatusCode.INVALID_ARGUMENT" and "batch-size must be <= 4" in grpc_answers[1][1]
    # Each refusal counted where it was refused, as with one process.
    refusals = {m: sum(1 for model, _, _, refused in HTTP_CASES if model == m and refused) for m in statistics}
    refusals["reshaped"] += 3  # gRPC's
    assert {m: figures[1] for m, figures in statistics.items()} == refusals
    assert statistics["reshaped"][::2] == (3, 3 + 1 + 2)  # successes; inferences: batch sizes 3, 1 (raw), 2
