"""Instance groups through a live server: count and several groups give that many instances, which take work in
parallel (an ``async def execute`` that awaits, so this holds whether instances run in the server or in worker
processes); KIND_MODEL and KIND_AUTO load on this CPU-only host; KIND_GPU fails the load as Triton does here."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient

from tests.models import write_model
from tests.server import RunningServer

NAMED = """
    import asyncio
    import numpy as np
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def initialize(self, args):
            self.name = args["model_instance_name"].encode()
            self.kind = args["model_instance_kind"]

        async def execute(self, requests):
            await asyncio.sleep(0.5)
            return [pb_utils.InferenceResponse([pb_utils.Tensor("NAME", np.array([self.name], dtype=object))])
                    for r in requests]
"""


def _config(name: str, groups: str) -> str:
    return f"""
        name: "{name}"
        backend: "python"
        input [{{ name: "INPUT0", data_type: TYPE_FP32, dims: [ 1 ] }}]
        output [{{ name: "NAME", data_type: TYPE_STRING, dims: [ 1 ] }}]
        instance_group [ {groups} ]
    """


MODELS = {
    "parallel": '{ count: 2, kind: KIND_CPU }, { name: "extra", count: 1, kind: KIND_MODEL }',
    "auto": "{ kind: KIND_AUTO }",
    "gpu": "{ kind: KIND_GPU }",
    "gpu_ids": "{ kind: KIND_GPU, gpus: [ 0 ] }",
    "cpu_with_gpus": "{ name: \"g\", kind: KIND_CPU, gpus: [ 0 ] }",
}

REASONS = {
    "gpu": "Invalid argument: instance group gpu_0 of model gpu has kind KIND_GPU but no GPUs are available",
    "gpu_ids": "Invalid argument: instance group gpu_ids_0 of model gpu_ids specifies invalid or unsupported gpu id "
               "0. GPUs with at least the minimum required CUDA compute compatibility of 6.000000 are: ",
    "cpu_with_gpus": "Invalid argument: instance group g of model cpu_with_gpus has kind KIND_CPU but specifies one "
                     "or more GPUs",
}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    repo: Path = tmp_path_factory.mktemp("groups")
    for name, groups in MODELS.items():
        write_model(repo, name, _config(name, groups), NAMED)
    running = RunningServer([repo], "--strict-readiness=false")
    yield running
    running.stop()


def test_groups_run_in_parallel_on_distinct_instances(server: RunningServer) -> None:
    names: list[str] = []

    def one() -> None:
        with httpclient.InferenceServerClient(server.url) as client:
            tensor = httpclient.InferInput("INPUT0", [1], "FP32")
            tensor.set_data_from_numpy(np.zeros(1, np.float32))
            names.append(client.infer("parallel", [tensor]).as_numpy("NAME")[0].decode())

    started = time.monotonic()
    threads = [threading.Thread(target=one) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.monotonic() - started
    assert sorted(names) == ["extra_0", "parallel_0_0", "parallel_0_1"]
    assert elapsed < 1.2  # one after another would take 1.5 s
    with httpclient.InferenceServerClient(server.url) as client:
        stats = client.get_inference_statistics("parallel")["model_stats"][0]
    assert stats["execution_count"] == 3 and stats["batch_stats"][0]["batch_size"] == 1


def test_kind_auto_resolves_to_cpu(server: RunningServer) -> None:
    status, _, body = server.request("GET", "/v2/models/auto/config")
    assert status == 200
    assert json.loads(body)["instance_group"][0]["kind"] == "KIND_CPU"


@pytest.mark.parametrize("model", sorted(REASONS))
def test_gpu_groups_fail_the_load_in_tritons_words(server: RunningServer, model: str) -> None:
    status, _, body = server.request("POST", "/v2/repository/index", "{}")
    rows = {row["name"]: row for row in json.loads(body)}
    assert rows[model]["state"] == "UNAVAILABLE"
    assert rows[model]["reason"] == REASONS[model]
    status, _, _ = server.request("GET", f"/v2/models/{model}/ready")
    assert status == 400
