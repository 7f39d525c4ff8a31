"""Framework instances in a worker process of their own (``--backend-config=<backend>,instance-process=true``; on
by default for KIND_GPU): an onnxruntime model serves through the worker channel (results, dynamic batching,
statistics), survives kill -9 of its process, and its process ends with an unload and with the server; a
TorchScript model does the same and is restarted after a sticky CUDA error."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import numpy as np
import psutil
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from naiad.backends.base import VersionContext
from naiad.backends.isolated.version import runs_apart
from naiad.config import pb
from naiad.core.errors import InferError
from tests import onnx_graphs as g
from tests.server import RunningServer

_ONNX_CONFIG = """
    name: "add_sub"
    platform: "onnxruntime_onnx"
    max_batch_size: 8
    dynamic_batching { max_queue_delay_microseconds: 20000 }
    input [{ name: "INPUT0", data_type: TYPE_FP32, dims: [ 4 ] },
           { name: "INPUT1", data_type: TYPE_FP32, dims: [ 4 ] }]
    output [{ name: "OUTPUT0", data_type: TYPE_FP32, dims: [ 4 ] },
            { name: "OUTPUT1", data_type: TYPE_FP32, dims: [ 4 ] }]
    instance_group [{ kind: KIND_CPU, count: 1 }]
"""


def _ctx(kind: int, **options: str) -> VersionContext:
    config = pb.ModelConfig(name="m")
    config.instance_group.add(name="m", kind=kind, count=1)
    return VersionContext("m", 1, config, "{}", Path("."), Path("1"), dict(options))


def test_gpu_instances_run_apart_by_default_and_the_switch_decides() -> None:
    gpu, cpu = pb.ModelInstanceGroup.KIND_GPU, pb.ModelInstanceGroup.KIND_CPU
    assert runs_apart(_ctx(gpu)) and not runs_apart(_ctx(cpu))
    assert runs_apart(_ctx(cpu, **{"instance-process": "true"}))
    assert not runs_apart(_ctx(gpu, **{"instance-process": "off"}))
    with pytest.raises(InferError, match="failed to convert 'maybe' to boolean"):
        runs_apart(_ctx(cpu, **{"instance-process": "maybe"}))


def _workers(server: RunningServer) -> list[int]:
    """The server's live worker processes."""
    found = []
    for child in psutil.Process(server.proc.pid).children():
        try:
            if "naiad.backends.python.worker" in " ".join(child.cmdline()):
                found.append(child.pid)
        except psutil.Error:  # gone, or a zombie not yet reaped
            pass
    return found


def _until(condition, seconds: float, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def _inputs(a: np.ndarray, b: np.ndarray) -> list[httpclient.InferInput]:
    inputs = [httpclient.InferInput(name, list(a.shape), "FP32") for name in ("INPUT0", "INPUT1")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    return inputs


def _add_sub(client: httpclient.InferenceServerClient, a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    result = client.infer("add_sub", _inputs(a, b))
    return result.as_numpy("OUTPUT0"), result.as_numpy("OUTPUT1")


def test_onnxruntime_instance_in_its_own_process(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    g.write(repo, "add_sub", g.add_sub("TYPE_FP32", [4]), _ONNX_CONFIG)
    server = RunningServer([repo], "--backend-config=onnxruntime,instance-process=true",
                           "--model-control-mode=explicit", "--load-model=add_sub")
    client = httpclient.InferenceServerClient(server.url, concurrency=16)
    try:
        [worker] = _workers(server)
        a = np.arange(8, dtype=np.float32).reshape(2, 4)
        b = np.full((2, 4), 0.5, dtype=np.float32)
        total, difference = _add_sub(client, a, b)
        np.testing.assert_array_equal(total, a + b)
        np.testing.assert_array_equal(difference, a - b)

        # Sixteen requests at once: the dynamic batcher joins them, the worker runs each batch as one.
        pending = []
        for i in range(16):
            row = np.full((1, 4), i, dtype=np.float32)
            pending.append(client.async_infer("add_sub", _inputs(row, row)))
        for i, request in enumerate(pending):
            result = request.get_result()
            assert result.as_numpy("OUTPUT0").tolist() == [[2.0 * i] * 4]
            assert result.as_numpy("OUTPUT1").tolist() == [[0.0] * 4]
        [stats] = client.get_inference_statistics("add_sub")["model_stats"]
        assert int(stats["inference_count"]) == 18
        assert int(stats["inference_stats"]["success"]["count"]) == 17
        assert int(stats["execution_count"]) < 17
        assert max(int(s["batch_size"]) for s in stats["batch_stats"]) > 1
        assert int(stats["inference_stats"]["compute_infer"]["ns"]) > 0

        # kill -9: the instance comes back in a new process and serves again.
        os.kill(worker, signal.SIGKILL)
        _until(lambda: _workers(server) not in ([], [worker]), 10, "the worker was not restarted")
        total, _ = _add_sub(client, a, b)
        np.testing.assert_array_equal(total, a + b)
        [restarted] = _workers(server)
        assert restarted != worker and "restarting it" in server.log()

        # Unload ends the process (finalize), and a load starts a new one.
        client.unload_model("add_sub")
        _until(lambda: not psutil.pid_exists(restarted) or psutil.Process(restarted).status() ==
               psutil.STATUS_ZOMBIE, 10, "unload left the worker running")
        assert _workers(server) == [] and not client.is_model_ready("add_sub")
        client.load_model("add_sub")
        [reloaded] = _workers(server)
        np.testing.assert_array_equal(_add_sub(client, a, b)[0], a + b)
    finally:
        client.close()
        server.stop()
    assert not psutil.pid_exists(reloaded) or psutil.Process(reloaded).status() == psutil.STATUS_ZOMBIE


def test_pytorch_instance_restarts_after_a_sticky_error(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    from tests import torch_models as tm

    repo = tmp_path / "repo"
    tm.save(tm.Fragile(), repo / "fragile" / "1" / "model.pt")
    (repo / "fragile" / "config.pbtxt").write_text("""
        name: "fragile"
        platform: "pytorch_libtorch"
        max_batch_size: 8
        input [{ name: "INPUT0", data_type: TYPE_FP32, dims: [ 4 ] },
               { name: "FLAG", data_type: TYPE_INT32, dims: [ 1 ] }]
        output [{ name: "OUTPUT__0", data_type: TYPE_FP32, dims: [ 4 ] }]
        instance_group [{ kind: KIND_CPU, count: 1 }]
    """)
    # A restart imports torch anew: give queued requests longer than the default 5 s on a busy CI host.
    server = RunningServer([repo], "--backend-config=pytorch,instance-process=true",
                           "--backend-config=pytorch,restart-wait-seconds=30")
    client = httpclient.InferenceServerClient(server.url)
    x = np.arange(4, dtype=np.float32).reshape(1, 4)

    def infer(flag: int) -> np.ndarray:
        inputs = [httpclient.InferInput("INPUT0", [1, 4], "FP32"), httpclient.InferInput("FLAG", [1, 1], "INT32")]
        inputs[0].set_data_from_numpy(x)
        inputs[1].set_data_from_numpy(np.array([[flag]], dtype=np.int32))
        return client.infer("fragile", inputs).as_numpy("OUTPUT__0")

    try:
        [worker] = _workers(server)
        np.testing.assert_array_equal(infer(0), x * 2)
        started = time.monotonic()
        with pytest.raises(InferenceServerException) as failure:
            infer(1)
        assert "instance 'fragile_0_0' of model 'fragile' hit a sticky CUDA error (device-side assert triggered) and " \
               "is being restarted: PyTorch execute failure" in str(failure.value)
        np.testing.assert_array_equal(infer(0), x * 2)  # waits for the new process
        print(f"\npytorch: from the bad request to serving again: {time.monotonic() - started:.2f} s")
        [restarted] = _workers(server)
        assert restarted != worker
        for _ in range(5):
            np.testing.assert_array_equal(infer(0), x * 2)

        os.kill(restarted, signal.SIGKILL)
        np.testing.assert_array_equal(infer(0), x * 2)
        [again] = _workers(server)
        assert again != restarted
        [stats] = client.get_inference_statistics("fragile")["model_stats"]
        assert int(stats["inference_stats"]["fail"]["count"]) == 1
    finally:
        client.close()
        server.stop()
    assert not psutil.pid_exists(again) or psutil.Process(again).status() == psutil.STATUS_ZOMBIE
