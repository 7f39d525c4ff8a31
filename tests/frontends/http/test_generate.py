"""Triton's generate extension over raw HTTP (http.client), as Triton's HTTP server maps it: inputs shaped from
the model's metadata, other keys as request parameters, pre-inference errors as plain JSON errors, and the
event stream's status and content type set by its first response."""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator

import pytest

from tests.models import write_model
from tests.server import RunningServer

# Answers what it was given: the input's shape and the request's parameters.
ECHO_CONFIG = """
    name: "echo"
    backend: "python"
    max_batch_size: 8
    input [{ name: "text_input", data_type: TYPE_STRING, dims: [ 1 ] },
           { name: "values", data_type: TYPE_INT32, dims: [ -1, 2 ], optional: true },
           { name: "flag", data_type: TYPE_BOOL, dims: [ 1 ], optional: true }]
    output [{ name: "text_output", data_type: TYPE_STRING, dims: [ 1 ] }]
"""

ECHO_PY = """
    import json
    import numpy as np
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def execute(self, requests):
            out = []
            for r in requests:
                text = pb_utils.get_input_tensor_by_name(r, "text_input").as_numpy()
                values = pb_utils.get_input_tensor_by_name(r, "values")
                seen = {"shape": list(text.shape), "text": text.ravel()[0].decode(),
                        "values": None if values is None else values.as_numpy().tolist(),
                        "parameters": json.loads(r.parameters())}
                out.append(pb_utils.InferenceResponse([pb_utils.Tensor(
                    "text_output", np.array([[json.dumps(seen)]], dtype=np.object_))]))
            return out
"""

# Decoupled: one response per word of the input; "fail" as the first word fails the execution itself.
WORDS_CONFIG = """
    name: "words"
    backend: "python"
    max_batch_size: 0
    input [{ name: "text_input", data_type: TYPE_STRING, dims: [ 1 ] }]
    output [{ name: "text_output", data_type: TYPE_STRING, dims: [ 1 ] }]
    model_transaction_policy { decoupled: true }
"""

WORDS_PY = """
    import numpy as np
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def execute(self, requests):
            for r in requests:
                words = pb_utils.get_input_tensor_by_name(r, "text_input").as_numpy()[0].decode().split()
                sender = r.get_response_sender()
                if words and words[0] == "fail":
                    sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError("no words today")),
                                flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                    continue
                for w in words:
                    sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("text_output",
                                                                            np.array([w], dtype=np.object_))]))
                sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            return None
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    repo = tmp_path_factory.mktemp("generate")
    write_model(repo, "echo", ECHO_CONFIG, ECHO_PY)
    write_model(repo, "words", WORDS_CONFIG, WORDS_PY)
    running = RunningServer([repo])
    yield running
    running.stop()


def _post(server: RunningServer, path: str, doc: object) -> tuple[int, str, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=30)
    try:
        body = doc if isinstance(doc, str) else json.dumps(doc)
        conn.request("POST", path, body=body, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, resp.getheader("Content-Type") or "", resp.read()
    finally:
        conn.close()


def _events(body: bytes) -> list[dict]:
    chunks = body.decode().split("\n\n")
    assert chunks[-1] == ""
    assert all(c.startswith("data: ") for c in chunks[:-1])
    return [json.loads(c[len("data: "):]) for c in chunks[:-1]]


def test_inputs_take_the_metadata_shape_and_other_keys_become_parameters(server: RunningServer) -> None:
    status, ctype, body = _post(server, "/v2/models/echo/generate", {
        "id": "42", "text_input": "hello", "values": [1, 2, 3, 4], "temperature": 0.5, "max_tokens": 7,
        "stream": False, "parameters": {"top_k": 3, "mode": "greedy"}})
    assert (status, ctype) == (200, "application/json"), body
    doc = json.loads(body)
    assert (doc["id"], doc["model_name"], doc["model_version"]) == ("42", "echo", "1")
    seen = json.loads(doc["text_output"])
    assert seen["shape"] == [1, 1]  # [-1,1] from the metadata: Triton's [1,1], not a flat [1]
    assert seen["text"] == "hello"
    assert seen["values"] == [[[1, 2], [3, 4]]]  # [-1,-1,2]: the innermost wildcard takes the rest
    assert seen["parameters"] == {"id": "42", "temperature": 0.5, "max_tokens": 7, "stream": False, "top_k": 3,
                                  "mode": "greedy"}


def test_refusals_before_inference(server: RunningServer) -> None:
    status, ctype, body = _post(server, "/v2/models/echo/generate", {"text_input": "x", "bad": [1]})
    assert (status, ctype) == (400, "application/json")
    assert json.loads(body) == {"error": "parameter 'bad' has invalid type. It should be either 'int', 'bool', "
                                         "or 'string'."}
    status, _, body = _post(server, "/v2/models/echo/generate", {"text_input": "x", "values": [1, 2, 3]})
    assert status == 400
    assert json.loads(body) == {"error": "The schema can not convert input 'values' to tensor with proper shape"}


def test_json_read_as_triton_reads_it(server: RunningServer) -> None:
    """L0_http generate_endpoint_test's duplicate keys, JSON types and nested-keyword wording: a repeated input
    key is a second input of that name (the first repeat in order is named), a BOOL input takes only JSON
    booleans, and an error inside ``parameters`` names that keyword; the stream refuses the same way."""
    for path in ("/v2/models/echo/generate", "/v2/models/echo/generate_stream"):
        for raw, repeated in (('{"text_input": "a", "flag": false, "text_input": "b"}', "text_input"),
                              ('{"text_input": "a", "flag": false, "flag": true, "text_input": "b"}', "flag")):
            status, ctype, body = _post(server, path, raw)
            assert (status, ctype) == (400, "application/json"), body
            assert json.loads(body)["error"] == f"input '{repeated}' already exists in request"
        for flag in ("false", 1):
            status, ctype, body = _post(server, path, {"text_input": "a", "flag": flag})
            assert (status, ctype) == (500, "application/json"), body
            assert "attempt to access JSON non-boolean as boolean" in json.loads(body)["error"]
        status, _, body = _post(server, path, {"text_input": "a", "parameters": {"nested": {"x": 1}}})
        assert status == 400
        assert json.loads(body)["error"] == ("Converting keyword: 'parameters': parameter 'nested' has invalid "
                                             "type. It should be either 'int', 'bool', or 'string'.")
    # A repeated parameter is not an input: the last one is kept, and booleans pass.
    status, _, body = _post(server, "/v2/models/echo/generate",
                            '{"text_input": "a", "flag": [true], "mode": "x", "mode": "y"}')
    assert status == 200, body
    assert json.loads(json.loads(body)["text_output"])["parameters"] == {"mode": "y"}


def test_stream_content_type_and_events(server: RunningServer) -> None:
    status, ctype, body = _post(server, "/v2/models/words/generate_stream", {"text_input": "one two three"})
    assert (status, ctype) == (200, "text/event-stream; charset=utf-8")
    assert [e["text_output"] for e in _events(body)] == ["one", "two", "three"]


def test_stream_refused_before_inference_is_a_plain_json_error(server: RunningServer) -> None:
    # A missing required input: Triton's core refuses it before the model runs.
    status, ctype, body = _post(server, "/v2/models/words/generate_stream", {"other": "x"})
    assert (status, ctype) == (400, "application/json"), body
    assert "expected 1 inputs but got 0 inputs for model 'words'" in json.loads(body)["error"]
    status, ctype, body = _post(server, "/v2/models/nope/generate_stream", {"text_input": "x"})
    assert (status, ctype) == (404, "application/json")
    assert "nope" in json.loads(body)["error"]


def test_stream_whose_first_response_fails_has_its_error_status(server: RunningServer) -> None:
    status, ctype, body = _post(server, "/v2/models/words/generate_stream", {"text_input": "fail now"})
    assert (status, ctype) == (500, "text/event-stream; charset=utf-8")
    assert _events(body) == [{"error": "no words today"}]
    assert server.request("GET", "/v2/health/ready")[0] == 200  # still serving
