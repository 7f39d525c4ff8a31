"""The GPU path's pieces that run on a CPU: the staging buffers' reuse (pinned on a GPU host, plain here), and the
pytorch instance's choice of path (its own stream and staging only on a GPU), its staged copies giving the same
answers as the plain path. The GPU itself is exercised where one exists (benchmarks/gpu.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from naiad.backends.base import VersionContext
from naiad.backends.staging import Staging
from naiad.config.loader import parse_config_text
from naiad.config.normalize import fill_defaults
from tests import torch_models as tm


def test_buffers_are_reused_and_grow_by_doubling() -> None:
    staging = Staging(pin=False)
    first = staging.buffer("x", torch.float32, (4, 3))
    assert first.shape == (4, 3) and staging.allocations == 1
    again = staging.buffer("x", torch.float32, (2, 3))  # smaller: the same memory
    assert again.data_ptr() == first.data_ptr() and staging.allocations == 1
    grown = staging.buffer("x", torch.float32, (5, 3))  # larger: a new buffer, twice the old one
    assert staging.allocations == 2 and grown.shape == (5, 3)
    assert staging.buffer("x", torch.float32, (8, 3)).data_ptr() == grown.data_ptr()  # 24 fits in 2 * 12
    staging.buffer("x", torch.int64, (4, 3))  # another dtype: its own buffer
    staging.buffer("y", torch.float32, (1,))  # another name too
    assert staging.allocations == 4


def test_copies_through_the_buffers() -> None:
    staging = Staging(pin=False)
    array = np.arange(6, dtype=np.float32).reshape(2, 3)
    device = torch.device("cpu")
    on_device = staging.to_device("in", array, device)
    np.testing.assert_array_equal(on_device.numpy(), array)
    host = staging.to_host("out", on_device * 2)
    np.testing.assert_array_equal(host, array * 2)
    kept = host.copy()
    staging.to_host("out", on_device * 3)  # the next execution writes the same buffer: answers keep copies
    np.testing.assert_array_equal(host, array * 3)
    np.testing.assert_array_equal(kept, array * 2)


def _instance(tmp_path: Path):  # type: ignore[no-untyped-def]
    from naiad.backends.pytorch.backend import TorchVersion

    tm.save(tm.AddSub(), tmp_path / "1" / "model.pt")
    config = parse_config_text("""
        name: "add_sub"
        platform: "pytorch_libtorch"
        max_batch_size: 8
        input [{ name: "INPUT0", data_type: TYPE_FP32, dims: [ 4 ] }, { name: "INPUT1", data_type: TYPE_FP32, dims: [ 4 ] }]
        output [{ name: "OUTPUT__0", data_type: TYPE_FP32, dims: [ 4 ] }, { name: "OUTPUT__1", data_type: TYPE_FP32, dims: [ 4 ] }]
    """)
    fill_defaults(config, "add_sub")
    ctx = VersionContext("add_sub", 1, config, "{}", tmp_path, tmp_path / "1")
    return TorchVersion(ctx)


def test_a_cpu_instance_takes_the_plain_path_and_staging_answers_the_same(tmp_path: Path) -> None:
    version = _instance(tmp_path)
    instance = version.instances[0]
    try:
        assert instance.stream is None and instance.staging is None  # no stream, no pinned buffers on a CPU
        a = np.arange(8, dtype=np.float32).reshape(2, 4)
        b = np.ones((2, 4), dtype=np.float32)
        plain = instance.run({"INPUT0": a, "INPUT1": b})
        # The GPU path's copies (through staging buffers, here unpinned), minus the stream.
        instance.staging = Staging(pin=False)
        staged = instance._run({"INPUT0": a, "INPUT1": b})
        assert instance.staging.allocations == 4  # two inputs, two outputs
        for name in ("OUTPUT__0", "OUTPUT__1"):
            np.testing.assert_array_equal(staged[name], plain[name])
        instance._run({"INPUT0": a, "INPUT1": b})
        assert instance.staging.allocations == 4  # the second execution reused them all
    finally:
        version.unload()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_gpu_instances_run_on_their_own_streams_from_pinned_buffers(tmp_path: Path) -> None:
    from naiad.backends.pytorch.backend import TorchVersion

    tm.save(tm.AddSub(), tmp_path / "1" / "model.pt")
    config = parse_config_text("""
        name: "add_sub"
        platform: "pytorch_libtorch"
        max_batch_size: 8
        instance_group [{ count: 2, kind: KIND_GPU, gpus: [ 0 ] }]
        input [{ name: "INPUT0", data_type: TYPE_FP32, dims: [ 4 ] }, { name: "INPUT1", data_type: TYPE_FP32, dims: [ 4 ] }]
        output [{ name: "OUTPUT__0", data_type: TYPE_FP32, dims: [ 4 ] }, { name: "OUTPUT__1", data_type: TYPE_FP32, dims: [ 4 ] }]
    """)
    fill_defaults(config, "add_sub")
    version = TorchVersion(VersionContext("add_sub", 1, config, "{}", tmp_path, tmp_path / "1"))
    try:
        first, second = version.instances
        default = torch.cuda.default_stream(first.device)
        assert first.stream is not None and second.stream is not None
        assert len({first.stream.cuda_stream, second.stream.cuda_stream, default.cuda_stream}) == 3
        assert first.staging is not None and first.staging.pin
        a = np.arange(8, dtype=np.float32).reshape(2, 4)
        b = np.ones((2, 4), dtype=np.float32)
        out = first.run({"INPUT0": a, "INPUT1": b})
        np.testing.assert_array_equal(out["OUTPUT__0"], a + b)
        again = first.run({"INPUT0": a * 2, "INPUT1": b})  # the same pinned buffers, a new answer
        np.testing.assert_array_equal(out["OUTPUT__0"], a + b)  # the first answer kept its own copy
        np.testing.assert_array_equal(again["OUTPUT__1"], a * 2 - b)
        assert first.staging.allocations == 4
    finally:
        version.unload()
