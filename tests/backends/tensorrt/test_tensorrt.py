"""The tensorrt backend: on a host without a GPU, plans fail to load with Triton's messages and the server keeps
serving; where a GPU and the ``tensorrt`` package exist, a plan built here from an ONNX graph serves."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient

from naiad.config.scheduling import gpu_ids
from tests import onnx_graphs
from tests.models import IDENTITY_FP32, IDENTITY_PY, write_model
from tests.server import RunningServer

CONFIG = """
name: "{name}"
platform: "tensorrt_plan"
max_batch_size: 8
input [{{ name: "INPUT0", data_type: TYPE_FP32, dims: [ 4 ] }}, {{ name: "INPUT1", data_type: TYPE_FP32, dims: [ 4 ] }}]
output [{{ name: "OUTPUT0", data_type: TYPE_FP32, dims: [ 4 ] }}, {{ name: "OUTPUT1", data_type: TYPE_FP32, dims: [ 4 ] }}]
{extra}
"""


def _plan(name: str, repo: Path, extra: str = "", data: bytes = b"plan bytes") -> None:
    folder = repo / name / "1"
    folder.mkdir(parents=True)
    (folder / "model.plan").write_bytes(data)
    (repo / name / "config.pbtxt").write_text(CONFIG.format(name=name, extra=extra))


@pytest.fixture(scope="module")
def cpu_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    repo = tmp_path_factory.mktemp("trt")
    _plan("plan_auto", repo)
    _plan("plan_gpu", repo, "instance_group [{ kind: KIND_GPU }]")
    _plan("plan_cpu", repo, "instance_group [{ kind: KIND_CPU }]")
    write_model(repo, "identity", IDENTITY_FP32.format(name="identity"), IDENTITY_PY)
    # Hide any GPU so these failures are the same on every host.
    running = RunningServer([repo], "--strict-readiness=false", env={"NAIAD_GPUS": ""})
    yield running
    running.stop()


def test_plans_fail_clearly_without_gpu(cpu_server: RunningServer) -> None:
    status, _, body = cpu_server.request("POST", "/v2/repository/index", "{}")
    assert status == 200
    rows = {row["name"]: row for row in json.loads(body)}
    only_gpu = "Invalid argument: unable to load model '{}', TensorRT backend supports only GPU device"
    assert rows["plan_auto"]["reason"] == only_gpu.format("plan_auto")  # KIND_AUTO resolves to CPU here
    assert rows["plan_cpu"]["reason"] == only_gpu.format("plan_cpu")
    assert rows["plan_gpu"]["reason"] == ("Invalid argument: instance group plan_gpu_0 of model plan_gpu has kind "
                                          "KIND_GPU but no GPUs are available")
    with httpclient.InferenceServerClient(cpu_server.url) as client:
        assert client.get_model_config("identity")["name"] == "identity"
        assert not client.is_model_ready("plan_gpu")


def _build_plan(onnx_bytes: bytes) -> bytes:
    import tensorrt as trt

    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    network = builder.create_network(0)
    parser = trt.OnnxParser(network, logger)
    assert parser.parse(onnx_bytes)
    profile = builder.create_optimization_profile()
    for name in ("INPUT0", "INPUT1"):
        profile.set_shape(name, (1, 4), (4, 4), (8, 4))
    config = builder.create_builder_config()
    config.add_optimization_profile(profile)
    return bytes(builder.build_serialized_network(network, config))


@pytest.mark.skipif(not gpu_ids(), reason="needs an NVIDIA GPU")
def test_plan_serves_on_gpu(tmp_path: Path) -> None:
    pytest.importorskip("tensorrt")
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch without CUDA")
    plan = _build_plan(onnx_graphs.add_sub("TYPE_FP32", [4]).SerializeToString())
    _plan("plan", tmp_path, "instance_group [{ kind: KIND_GPU }]", plan)
    server = RunningServer([tmp_path])
    try:
        with httpclient.InferenceServerClient(server.url) as client:
            a = np.arange(8, dtype=np.float32).reshape(2, 4)
            b = np.ones((2, 4), dtype=np.float32)
            inputs = [httpclient.InferInput("INPUT0", [2, 4], "FP32"), httpclient.InferInput("INPUT1", [2, 4], "FP32")]
            inputs[0].set_data_from_numpy(a)
            inputs[1].set_data_from_numpy(b)
            result = client.infer("plan", inputs)
            np.testing.assert_allclose(result.as_numpy("OUTPUT0"), a + b)
            np.testing.assert_allclose(result.as_numpy("OUTPUT1"), a - b)
    finally:
        server.stop()
