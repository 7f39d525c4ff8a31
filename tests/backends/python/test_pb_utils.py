from __future__ import annotations

import numpy as np
import pytest

import triton_python_backend_utils as pb_utils


def test_tensor_accessors() -> None:
    t = pb_utils.Tensor("X", np.arange(6, dtype=np.int32).reshape(2, 3))
    assert t.name() == "X" and t.shape() == [2, 3] and t.is_cpu()
    assert t.triton_dtype() == 8  # TYPE_INT32
    back = pb_utils.Tensor.from_dlpack("Y", t.to_dlpack())
    np.testing.assert_array_equal(back.as_numpy(), t.as_numpy())


def test_tensor_rejects_non_arrays() -> None:
    with pytest.raises(pb_utils.TritonModelException):
        pb_utils.Tensor("X", [1, 2, 3])


def test_bytes_roundtrip() -> None:
    data = np.array([b"a", b"", b"xyz"], dtype=np.object_)
    encoded = pb_utils.serialize_byte_tensor(data)
    assert bytes(encoded) == b"\x01\x00\x00\x00a\x00\x00\x00\x00\x03\x00\x00\x00xyz"
    assert list(pb_utils.deserialize_bytes_tensor(bytes(encoded))) == [b"a", b"", b"xyz"]


def test_type_helpers() -> None:
    assert pb_utils.triton_string_to_numpy("TYPE_FP16") is np.float16
    assert pb_utils.triton_string_to_numpy("TYPE_STRING") is np.object_
    assert pb_utils.numpy_to_triton_type(np.float32) == 11
    assert pb_utils.triton_to_numpy_type(13) is np.object_


def test_model_config_helper_rules() -> None:
    config = pb_utils.ModelConfig({"name": "m", "max_batch_size": 8, "input": [], "output": []})
    with pytest.raises(ValueError, match="configuration specified max_batch_size 8"):
        config.set_max_batch_size(4)
    config.add_input({"name": "I", "data_type": "TYPE_FP32", "dims": [4]})
    config.add_input({"name": "I", "data_type": "TYPE_FP32", "dims": [4]})
    assert len(config.as_dict()["input"]) == 1
    with pytest.raises(ValueError, match="configuration expects datatype TYPE_FP32"):
        config.add_input({"name": "I", "data_type": "TYPE_INT32", "dims": [4]})
    with pytest.raises(ValueError, match="contains property other than"):
        config.add_output({"name": "O", "data_type": "TYPE_FP32", "dims": [4], "bogus": 1})
    config.set_dynamic_batching()
    assert config.as_dict()["dynamic_batching"] == {}
    assert not pb_utils.using_decoupled_model_transaction_policy(config.as_dict())


def test_response_and_error() -> None:
    err = pb_utils.TritonError("bad", pb_utils.TritonError.INVALID_ARG)
    response = pb_utils.InferenceResponse(output_tensors=[], error=err)
    assert response.has_error() and response.error().message() == "bad" and response.error().code() == 3
