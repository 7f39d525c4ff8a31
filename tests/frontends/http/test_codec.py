"""The KServe v2 JSON decoder on its own: inputs that reached it through the fuzzer (tests/reliability)."""

from __future__ import annotations

import numpy as np
import orjson
import pytest

from naiad.core.errors import Code, InferError
from naiad.core.request import InferResponse
from naiad.frontends.http.codec import OutputOptions, decode_request, encode_response


@pytest.mark.parametrize("parameters", [1e308, 7, "binary_data_size", ["binary_data_size"], None, True])
def test_tensor_parameters_that_are_no_object_are_absent(parameters: object) -> None:
    # Triton looks members up only in a JSON object; anything else has none (it was a TypeError: a 500).
    body = orjson.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [2], "data": [1, 2],
                                     "parameters": parameters}],
                         "outputs": [{"name": "OUTPUT0", "parameters": parameters}]})
    request, options = decode_request(body, None, "m", "")
    np.testing.assert_array_equal(request.inputs["INPUT0"], np.array([1, 2], dtype=np.float32))
    assert request.requested_outputs == ["OUTPUT0"] and options.binary == {"OUTPUT0": False}


def test_tensor_parameters_that_are_no_object_leave_no_data_source() -> None:
    body = orjson.dumps({"inputs": [{"name": "INPUT0", "datatype": "BYTES", "shape": [0], "parameters": 1e308}]})
    with pytest.raises(InferError) as info:
        decode_request(body, None, "m", "")
    assert info.value.code is Code.INVALID_ARG
    assert info.value.message.endswith("But no field is set")


# --- small JSON outputs, written from a list (encode_response's fast path) ---------------------------------------

def _encoded(array: np.ndarray) -> dict:
    response = InferResponse("m", "1", "", {"OUT": array})
    header, chunks, length = encode_response(response, OutputOptions())
    assert chunks == [] and length is None
    return orjson.loads(header)["outputs"][0]


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int8, np.int32, np.int64, np.uint8, np.uint64, np.bool_])
@pytest.mark.parametrize("size", [0, 1, 7, 256, 257])
def test_small_and_large_outputs_are_written_alike(dtype: type, size: int) -> None:
    # Up to 256 elements the output goes out as a list, above as the array: the same text either way (FP32
    # through double, as Triton prints it).
    rng = np.random.default_rng(size)
    array = (rng.standard_normal((size,)) * 1e6).astype(dtype).reshape(-1, 1)
    expected = array.astype(np.float64) if dtype is np.float32 else array
    out = _encoded(array)
    assert out["shape"] == [size, 1]
    assert orjson.dumps(out["data"]) == orjson.dumps(expected.ravel(), option=orjson.OPT_SERIALIZE_NUMPY)


def test_a_small_output_with_nonfinite_values_is_written_as_triton_writes_them() -> None:
    header, _, _ = encode_response(InferResponse("m", "1", "", {"OUT": np.array([np.nan, np.inf, -np.inf, 1.5],
                                                                                   dtype=np.float32)}), OutputOptions())
    assert b'"data":[NaN,Infinity,-Infinity,1.5]' in header


def test_a_small_output_whose_sum_overflows_is_still_finite() -> None:
    # The sum is only a quick look: finite values whose sum overflows are written as any finite ones (orjson's
    # "1e308", where the non-finite path would write Python's "1e+308").
    header, _, _ = encode_response(InferResponse("m", "1", "", {"OUT": np.array([1e308, 1e308])}), OutputOptions())
    assert b'"data":[1e308,1e308]' in header


@pytest.mark.parametrize("item, message", [
    ({"name": "I", "datatype": "FP32", "shape": [-1], "data": [1]},
     "Unable to parse 'shape': attempt to access JSON non-unsigned-integer as unsigned-integer"),
    ({"name": "I", "datatype": "FP16", "shape": [1], "data": [1]},
     "receiving FP16 data via JSON is not supported. Please use the binary data format for input I"),
    ({"name": "I", "datatype": "FP33", "shape": [1], "data": [1]}, "invalid datatype for input I"),
    ({"name": 1, "datatype": "FP32", "shape": [1], "data": [1]},
     "Unable to parse 'name': attempt to access JSON non-string as string"),
    ({"name": "I", "datatype": "FP32", "shape": 1, "data": [1]},
     "Unable to parse 'shape': attempt to access JSON non-array as array"),
    ({"name": "I", "datatype": "FP32", "shape": [2], "data": [1]},
     "Unable to parse 'data': Shape does not match true shape of 'data' field"),
])
def test_json_inputs_are_refused_in_the_general_path_s_words(item: dict, message: str) -> None:
    # A plain JSON input takes a shorter path; what it refuses, it refuses as the general path does.
    with pytest.raises(InferError) as info:
        decode_request(orjson.dumps({"inputs": [item]}), None, "m", "")
    assert info.value.message == message


def test_a_one_dimension_json_input_keeps_its_shape_from_nested_data() -> None:
    request, _ = decode_request(orjson.dumps({"inputs": [{"name": "I", "datatype": "INT32", "shape": [4],
                                                          "data": [[1, 2], [3, 4]]}]}), None, "m", "")
    array = request.inputs["I"]
    assert array.shape == (4,) and array.dtype == np.int32 and array.tolist() == [1, 2, 3, 4]
