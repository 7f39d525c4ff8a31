"""Inputs as perf_analyzer makes them: from the model's metadata, --shape for variable dims, BYTES strings of
--string-length, perf_analyzer's JSON data format, and the request bytes each protocol sends."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest
from tritonclient.grpc import service_pb2

from naiad.bench.control import ModelInfo, TensorSpec
from naiad.bench.inputs import InputError, build_inputs, grpc_request, http_request

MODEL = ModelInfo(name="m", version="", max_batch_size=8,
                  inputs=[TensorSpec("IMAGE", "FP32", [3, -1]), TensorSpec("TEXT", "BYTES", [2])],
                  outputs=[TensorSpec("OUT", "FP32", [3, -1])])


def test_variable_dims_need_shape() -> None:
    with pytest.raises(InputError, match="input IMAGE contains dynamic shape, provide shapes to send along"):
        build_inputs(MODEL)
    with pytest.raises(InputError, match="does not match"):
        build_inputs(MODEL, shapes={"IMAGE": [4, 5]})
    (image, text), = build_inputs(MODEL, batch_size=2, shapes={"IMAGE": [3, 5]}, string_length=7)
    assert image.shape == [2, 3, 5] and len(image.data) == 2 * 15 * 4
    assert text.shape == [2, 2]
    first = struct.unpack_from("<I", text.data)[0]
    assert first == 7 and len(text.data) == 4 * (4 + 7)


def test_batch_size_limits() -> None:
    with pytest.raises(InputError, match="expecting batch size <= 8"):
        build_inputs(MODEL, batch_size=9, shapes={"IMAGE": [3, 1]})
    flat = ModelInfo("n", "", 0, [TensorSpec("X", "INT32", [2])], [])
    with pytest.raises(InputError, match="does not support batching"):
        build_inputs(flat, batch_size=2)
    (x,), = build_inputs(flat, input_data="zero")
    assert x.shape == [2] and x.data == b"\0" * 8


def test_json_data_file(tmp_path) -> None:
    path = tmp_path / "d.json"
    path.write_text(json.dumps({"data": [
        {"IMAGE": {"content": list(range(6)), "shape": [3, 2]}, "TEXT": ["a", "bc"]},
        {"IMAGE": {"content": {"b64": "AAAAAA=="}, "shape": [3, 1]}, "TEXT": ["x", "y"]}]}))
    requests = build_inputs(MODEL, input_data=str(path))
    assert len(requests) == 2
    image, text = requests[0]
    assert image.shape == [1, 3, 2] and np.frombuffer(image.data, np.float32).tolist() == list(range(6))
    assert text.data == b"\x01\0\0\0a\x02\0\0\0bc"
    with pytest.raises(InputError, match="Unsupported type provided: 'nope'"):
        build_inputs(MODEL, input_data="nope")


def test_encodings() -> None:
    (image, text), = build_inputs(MODEL, shapes={"IMAGE": [3, 1]})
    raw = http_request("h:1", MODEL, [image, text], headers={"X-A": "b"})
    head, _, body = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"POST /v2/models/m/infer HTTP/1.1\r\nHost: h:1\r\n") and b"\r\nX-A: b" in head
    length = int(head.split(b"Inference-Header-Content-Length: ")[1].split(b"\r\n")[0])
    header = json.loads(body[:length])
    assert header["inputs"][0] == {"name": "IMAGE", "shape": [1, 3, 1], "datatype": "FP32",
                                   "parameters": {"binary_data_size": 12}}
    assert header["outputs"] == [{"name": "OUT", "parameters": {"binary_data": True}}]
    assert body[length:] == image.data + text.data
    request = service_pb2.ModelInferRequest.FromString(grpc_request(MODEL, [image, text]))
    assert request.model_name == "m" and [i.name for i in request.inputs] == ["IMAGE", "TEXT"]
    assert list(request.raw_input_contents) == [image.data, text.data]
    shm = http_request("h:1", MODEL, [image, text], shm={"IMAGE": ("r", 0, 12), "TEXT": ("r", 12, 8),
                                                           "OUT": ("r", 20, 12)})
    assert b"binary_data_size" not in shm and b'"shared_memory_region":"r"' in shm
