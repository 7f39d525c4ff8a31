"""The KServe v2 JSON decoder on its own: inputs that reached it through the fuzzer (tests/reliability)."""

from __future__ import annotations

import numpy as np
import orjson
import pytest

from naiad.core.errors import Code, InferError
from naiad.frontends.http.codec import decode_request


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
