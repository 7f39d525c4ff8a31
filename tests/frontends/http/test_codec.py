"""The KServe v2 JSON decoder on its own: inputs that reached it through the fuzzer (tests/reliability)."""

from __future__ import annotations

import numpy as np
import orjson
import pytest

from naiad.core.errors import Code, InferError
from naiad.core.request import InferResponse
from naiad.frontends.http import dtoa
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


# --- JSON outputs: small ones written from a list, floats in Triton's text -----------------------------------------

def _encoded(array: np.ndarray) -> dict:
    response = InferResponse("m", "1", "", {"OUT": array})
    header, chunks, length = encode_response(response, OutputOptions())
    assert chunks == [] and length is None
    return orjson.loads(header)["outputs"][0]


def _data(header: bytes) -> bytes:
    start = header.index(b'"data":') + len(b'"data":')
    return header[start : header.index(b"]", start) + 1]


@pytest.mark.parametrize("dtype", [np.int8, np.int32, np.int64, np.uint8, np.uint64, np.bool_])
@pytest.mark.parametrize("size", [0, 1, 7, 256, 257])
def test_small_and_large_outputs_are_written_alike(dtype: type, size: int) -> None:
    # Up to 256 elements the output goes out as a list, above as the array: the same text either way.
    rng = np.random.default_rng(size)
    array = (rng.standard_normal((size,)) * 1e6).astype(dtype).reshape(-1, 1)
    out = _encoded(array)
    assert out["shape"] == [size, 1]
    assert orjson.dumps(out["data"]) == orjson.dumps(array.ravel(), option=orjson.OPT_SERIALIZE_NUMPY)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("size", [0, 1, 7, 256, 257, 5000])
def test_float_outputs_of_any_size_are_written_as_triton_writes_them(dtype: type, size: int) -> None:
    # RapidJSON's text for each element (FP32 through double), whichever writer the size picks.
    rng = np.random.default_rng(size)
    array = (rng.standard_normal((size,)) * 10.0 ** rng.integers(-30, 30, size)).astype(dtype).reshape(-1, 1)
    header, _, _ = encode_response(InferResponse("m", "1", "", {"OUT": array}), OutputOptions())
    expected = "[" + ",".join(dtoa.triton_text(v) for v in array.ravel().tolist()) + "]"
    assert _data(header) == expected.encode()
    assert orjson.loads(header)["outputs"][0]["shape"] == [size, 1]


def test_a_small_output_with_nonfinite_values_is_written_as_triton_writes_them() -> None:
    header, _, _ = encode_response(InferResponse("m", "1", "", {"OUT": np.array([np.nan, np.inf, -np.inf, 1.5],
                                                                                   dtype=np.float32)}), OutputOptions())
    assert b'"data":[NaN,Infinity,-Infinity,1.5]' in header


def test_float_text_is_triton_s_not_the_json_library_s() -> None:
    # orjson 3.8 writes 1e308 "1e308", 3.13 "1e+308", Python's json "1e+308"; Triton "1e308" (and its Grisu2 gives
    # 0.30000000000000004 as ...07, 1e16 as 10000000000000000.0, 1e-6 as 0.000001).
    values = np.array([1e308, 1e308, 0.30000000000000004, 1e16, 1e-6, -0.0, np.nan])
    header, _, _ = encode_response(InferResponse("m", "1", "", {"OUT": values}), OutputOptions())
    assert _data(header) == b"[1e308,1e308,0.30000000000000007,10000000000000000.0,0.000001,-0.0,NaN]"


# The whole document in bytes, Triton's key order and float text.
DOCUMENT = (b'{"id":"7","model_name":"m","model_version":"1","parameters":{"p":0.1,"n":3,"s":"x","q":NaN,"b":true},'
            b'"outputs":[{"name":"A","datatype":"FP32","shape":[2],"data":[0.10000000149011612,2.0]},'
            b'{"name":"B","datatype":"INT32","shape":[2,1],"data":[1,2]},'
            b'{"name":"C","datatype":"BYTES","shape":[1],"data":["\\u00001e308"]},'
            b'{"name":"D","datatype":"FP64","shape":[1],"parameters":{"binary_data_size":8}},'
            b'{"name":"E","datatype":"FP64","shape":[0],"data":[]}]}')


def _document() -> bytes:
    response = InferResponse("m", "1", "7", {"A": np.array([0.1, 2], dtype=np.float32),
                                             "B": np.array([[1], [2]], dtype=np.int32),
                                             "C": np.array([b"\x001e308"], dtype=np.object_),
                                             "D": np.array([1e308]), "E": np.zeros(0)})
    response.parameters = {"p": 0.1, "n": 3, "s": "x", "q": float("nan"), "b": True}
    options = OutputOptions()
    options.binary["D"] = True
    header, chunks, length = encode_response(response, options)
    assert length == len(header) and bytes(chunks[0]) == np.array([1e308]).tobytes()
    return header


def test_the_document_is_triton_s_bytes() -> None:
    assert _document() == DOCUMENT


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
