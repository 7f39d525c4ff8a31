"""Custom metrics, backend settings and unload, with real worker processes loaded in the test process
(the /metrics page serves the same prometheus_client registry)."""

from __future__ import annotations

import asyncio
import json
import os
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
from prometheus_client import REGISTRY, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from naiad.backends.base import Execution, VersionContext
from naiad.backends.python.backend import PythonBackend
from naiad.config.loader import load_config
from naiad.config.normalize import fill_defaults
from naiad.config.render import config_to_dict
from naiad.core.errors import InferError
from naiad.core.request import InferRequest
from tests.backends.python.models import io_config
from tests.models import write_model

METRICS_MODEL = """
import os
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        self.counter = pb_utils.MetricFamily("naiad_test_requests", "requests seen", pb_utils.MetricFamily.COUNTER)
        self.gauge = pb_utils.MetricFamily("naiad_test_last", "last input", pb_utils.MetricFamily.GAUGE)
        self.hist = pb_utils.MetricFamily("naiad_test_sizes", "input sizes", pb_utils.MetricFamily.HISTOGRAM)
        labels = {"model": args["model_name"], "version": args["model_version"]}
        self.requests = self.counter.Metric(labels=labels)
        self.last = self.gauge.Metric(labels=labels)
        self.sizes = self.hist.Metric(labels=labels, buckets=[1.0, 10.0])
        self.marker = os.path.join(args["model_repository"], "finalized")

    def execute(self, requests):
        out = []
        for r in requests:
            x = r.inputs()[0].as_numpy()
            self.requests.increment(1)
            self.last.set(float(x[0]))
            self.sizes.observe(float(x.size))
            try:
                self.requests.set(5)
                err = ""
            except pb_utils.TritonModelException as exc:
                err = str(exc)
            out.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("VALUE", np.array([self.requests.value()], np.float64)),
                pb_utils.Tensor("ERR", np.array([err.encode()], np.object_))]))
        return out

    def finalize(self):
        open(self.marker, "w").write(str(os.getpid()))
"""


def _load(repo: Path, name: str, options: dict[str, str] | None = None):
    folder = repo / name
    config, _ = load_config(folder, "")
    fill_defaults(config, name)
    ctx = VersionContext(name, 1, config, json.dumps(config_to_dict(config)), folder, folder / "1", options or {})
    return PythonBackend().load(ctx)


_LOOP = asyncio.new_event_loop()  # workers attach to the loop of their first execution


def _run(instance, request: InferRequest):
    async def go():
        result = instance.execute([request])
        return result if isinstance(result, Execution) else await result
    return _LOOP.run_until_complete(go())


@pytest.fixture()
def metrics_repo(tmp_path: Path) -> Path:
    write_model(tmp_path, "metrics_model", io_config(
        "metrics_model", [("IN", "TYPE_FP32", "[ -1 ]")],
        [("VALUE", "TYPE_FP64", "[ 1 ]"), ("ERR", "TYPE_STRING", "[ 1 ]")]), textwrap.dedent(METRICS_MODEL))
    return tmp_path


def _samples() -> dict[tuple[str, tuple], float]:
    out = {}
    for family in text_string_to_metric_families(generate_latest(REGISTRY).decode()):
        for sample in family.samples:
            if sample.name.startswith("naiad_test_"):
                out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def test_custom_metrics_reach_the_server_registry_and_finalize_runs_on_unload(metrics_repo: Path) -> None:
    loaded = _load(metrics_repo, "metrics_model")
    pid = loaded.processes[0].proc.pid
    try:
        for value in (3.0, 7.0):
            execution = _run(loaded.instances[0], InferRequest("metrics_model", inputs={
                "IN": np.array([value] * 4, np.float32)}))
            response = execution.responses[0]
            assert response.error is None
        assert float(response.outputs["VALUE"][0]) == 2.0  # value() reads the server's series
        assert b"set is supported for gauges only" in response.outputs["ERR"][0]
        labels = (("model", "metrics_model"), ("version", "1"))
        samples = _samples()
        assert samples[("naiad_test_requests", labels)] == 2.0  # Triton's name: no _total suffix
        assert samples[("naiad_test_last", labels)] == 7.0
        assert samples[("naiad_test_sizes_count", labels)] == 2.0
        assert samples[("naiad_test_sizes_sum", labels)] == 8.0
        buckets = {dict(k[1])["le"]: v for k, v in samples.items() if k[0] == "naiad_test_sizes_bucket"}
        assert buckets == {"1.0": 0.0, "10.0": 2.0, "+Inf": 2.0}, buckets
    finally:
        loaded.unload()
    # Unload called finalize() in the worker, the process is gone, and so are the model's metric families.
    assert (metrics_repo / "metrics_model" / "finalized").read_text() == str(pid)
    assert not Path(f"/proc/{pid}").exists() or "zombie" in Path(f"/proc/{pid}/status").read_text()
    assert _samples() == {}


def test_shm_size_settings_and_a_full_dev_shm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_model(tmp_path, "m", io_config("m", [("IN", "TYPE_FP32", "[ -1 ]")], [("OUT", "TYPE_FP32", "[ -1 ]")]),
                "import triton_python_backend_utils as pb_utils\n\nclass TritonPythonModel:\n"
                "    def execute(self, requests):\n        return [pb_utils.InferenceResponse("
                "[pb_utils.Tensor('OUT', r.inputs()[0].as_numpy())]) for r in requests]\n")
    # A region larger than the address space can map (segments are sparse: only their size is checked at load)
    # fails the load with the reason.
    with pytest.raises(InferError, match=r"failed to allocate 1099511627776000 bytes of shared memory"):
        _load(tmp_path, "m", {"shm-default-byte-size": str(1000 * 2**40)})
    # SageMaker's variables set the same sizes when no --backend-config does.
    monkeypatch.setenv("SAGEMAKER_TRITON_SHM_DEFAULT_BYTE_SIZE", str(1000 * 2**40))
    with pytest.raises(InferError, match="shared memory"):
        _load(tmp_path, "m")
    monkeypatch.setenv("SAGEMAKER_TRITON_SHM_DEFAULT_BYTE_SIZE", "4096")
    monkeypatch.setenv("SAGEMAKER_TRITON_SHM_GROWTH_BYTE_SIZE", "8192")
    loaded = _load(tmp_path, "m")
    try:
        arena = loaded.processes[0].ch.arena
        assert arena.current.size == 4096 and arena.growth == 8192
        data = np.arange(100_000, dtype=np.float32)  # bigger than the region: it grows
        execution = _run(loaded.instances[0], InferRequest("m", inputs={"IN": data}))
        np.testing.assert_array_equal(execution.responses[0].outputs["OUT"], data)
        assert arena.current.size > 4096 and (arena.current.size - 4096) % 8192 == 0
    finally:
        loaded.unload()
    with pytest.raises(InferError, match="must be a number of bytes"):
        _load(tmp_path, "m", {"shm-growth-byte-size": "lots"})
    assert not [p for p in os.listdir("/dev/shm") if p.startswith("naiad-py-")]  # nothing left behind


def test_initialize_that_raises_fails_the_load_with_its_text(tmp_path: Path) -> None:
    write_model(tmp_path, "bad", io_config("bad", [("IN", "TYPE_FP32", "[ 1 ]")], [("OUT", "TYPE_FP32", "[ 1 ]")]),
                "class TritonPythonModel:\n    def initialize(self, args):\n"
                "        raise RuntimeError('no weights here')\n    def execute(self, requests):\n        pass\n")
    started = time.monotonic()
    with pytest.raises(InferError, match=r"RuntimeError: no weights here\n\nAt:\n  .*model.py\(3\): initialize"):
        _load(tmp_path, "bad")
    assert time.monotonic() - started < 10
