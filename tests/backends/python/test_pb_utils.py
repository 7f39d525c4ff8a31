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


def test_histogram_buckets_must_be_strictly_increasing() -> None:
    # Triton's (prometheus-cpp's) rule: unsorted or repeated bounds are refused, an empty list is fine
    family = pb_utils.MetricFamily("naiad_pb_hist", "h", pb_utils.MetricFamily.HISTOGRAM)
    for buckets in ([2.5, 0.1, 1.0, 10.0, 5.0], [1, 1, 2, 5, 5]):
        with pytest.raises(pb_utils.TritonModelException, match="strictly sorted"):
            family.Metric(labels={}, buckets=buckets)
    family.Metric(labels={}, buckets=[])
    family.Metric(labels={"a": "b"}, buckets=[0.1, 1, 2.5])


def test_a_metric_refuses_every_operation_once_its_family_is_deleted() -> None:
    for kind in (pb_utils.MetricFamily.COUNTER, pb_utils.MetricFamily.GAUGE):
        family = pb_utils.MetricFamily(f"naiad_pb_life_{kind}", "l", kind)
        metric = family.Metric(labels={"x": "1"})
        metric.increment(1)
        assert metric.value() == 1
        del family
        calls = [lambda: metric.increment(10), metric.value]
        if kind == pb_utils.MetricFamily.GAUGE:
            calls.append(lambda: metric.set(10))
        for call in calls:
            with pytest.raises(pb_utils.TritonModelException,
                               match="Invalid metric operation as the corresponding 'MetricFamily' has been deleted."):
                call()


def test_bf16_as_numpy_refused_and_dlpack_round_trip() -> None:
    from naiad.core.datatypes import BF16
    values = np.array([[1.5, -2.0], [3.25, 1000.0]]).astype(BF16)
    tensor = pb_utils.Tensor("X", values)
    with pytest.raises(pb_utils.TritonModelException, match="Tensor dtype is BF16 and cannot be converted to NumPy"):
        tensor.as_numpy()
    back = pb_utils.Tensor.from_dlpack("Y", tensor.to_dlpack())  # kDLBfloat out and in
    assert back.triton_dtype() == 14 and back._array.dtype == BF16
    np.testing.assert_array_equal(back._array.astype(np.float32), values.astype(np.float32))
    readonly = values.copy()
    readonly.flags.writeable = False
    np.testing.assert_array_equal(
        pb_utils.Tensor.from_dlpack("Z", pb_utils.Tensor("R", readonly).to_dlpack())._array.view(np.uint16),
        values.view(np.uint16))


def test_bf16_through_torch() -> None:
    torch = pytest.importorskip("torch")
    from naiad.core.datatypes import BF16
    values = np.array([0.5, -3.0, 96.0]).astype(BF16)
    t = torch.from_dlpack(pb_utils.Tensor("X", values).to_dlpack())
    assert t.dtype == torch.bfloat16 and t.tolist() == [0.5, -3.0, 96.0]
    for source in (t * 2, torch.utils.dlpack.to_dlpack(t * 2)):  # an object with __dlpack__, a bare capsule
        out = pb_utils.Tensor.from_dlpack("Y", source)
        assert out.triton_dtype() == 14
        assert out._array.astype(np.float32).tolist() == [1.0, -6.0, 192.0]


def test_a_response_keeps_output_tensors_given_as_a_generator() -> None:
    # (the check of each tensor once consumed a generator and left the response empty)
    arrays = {"A": np.arange(3, dtype=np.float32), "B": np.ones(2, dtype=np.int64)}
    response = pb_utils.InferenceResponse(output_tensors=(pb_utils.Tensor(n, a) for n, a in arrays.items()))
    assert [t.name() for t in response.output_tensors()] == ["A", "B"]
    np.testing.assert_array_equal(pb_utils.get_output_tensor_by_name(response, "A").as_numpy(), arrays["A"])
