"""The CUDA provider's path, I/O binding, run here on the CPU provider: a CPU session takes the plain path, and
the bound path (inputs bound where they are, or from staging buffers where torch is installed; outputs bound to
host memory) gives the same answers. The GPU itself is exercised where one exists."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from naiad.backends.base import VersionContext
from naiad.backends.onnxruntime.backend import OnnxVersion
from naiad.config.loader import parse_config_text
from naiad.config.normalize import fill_defaults
from tests import onnx_graphs


def _version(tmp_path: Path) -> OnnxVersion:
    onnx_graphs.write(tmp_path, "add_sub", onnx_graphs.add_sub("TYPE_FP32", [4]))
    config = parse_config_text("""
        name: "add_sub"
        backend: "onnxruntime"
        max_batch_size: 8
        input [{ name: "INPUT0", data_type: TYPE_FP32, dims: [ 4 ] }, { name: "INPUT1", data_type: TYPE_FP32, dims: [ 4 ] }]
        output [{ name: "OUTPUT0", data_type: TYPE_FP32, dims: [ 4 ] }, { name: "OUTPUT1", data_type: TYPE_FP32, dims: [ 4 ] }]
    """)
    fill_defaults(config, "add_sub")
    folder = tmp_path / "add_sub"
    return OnnxVersion(VersionContext("add_sub", 1, config, "{}", folder, folder / "1"))


INPUTS = {"INPUT0": np.arange(12, dtype=np.float32).reshape(3, 4), "INPUT1": np.ones((3, 4), np.float32)}


def test_bound_runs_answer_as_plain_runs(tmp_path: Path) -> None:
    version = _version(tmp_path)
    instance = version.instances[0]
    try:
        assert not instance.bound and instance.staging is None  # the CPU provider: plain session.run
        plain = instance.run(INPUTS)
        instance.bound = True  # what a CUDA provider's session selects
        bound = instance.run(INPUTS)
        for name in ("OUTPUT0", "OUTPUT1"):
            np.testing.assert_array_equal(bound[name], plain[name])
    finally:
        version.unload()


def test_inputs_bound_from_staging_buffers(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    from naiad.backends.staging import Staging

    version = _version(tmp_path)
    instance = version.instances[0]
    try:
        plain = instance.run(INPUTS)
        instance.bound = True
        instance.staging = Staging(pin=False)  # pinned on a GPU host; the binding is the same
        staged = instance.run(INPUTS)
        again = instance.run({n: a * 2 for n, a in INPUTS.items()})
        assert instance.staging.allocations == 2  # both inputs, reused the second time
        for name in ("OUTPUT0", "OUTPUT1"):
            np.testing.assert_array_equal(staged[name], plain[name])
        np.testing.assert_array_equal(again["OUTPUT0"], plain["OUTPUT0"] * 2)
        np.testing.assert_array_equal(staged["OUTPUT0"], plain["OUTPUT0"])  # answers don't share the buffers
    finally:
        version.unload()
