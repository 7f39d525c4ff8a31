"""Autoscaling (a load step takes the model deployment from 1 replica to 2 and back) and failure (a replica
killed mid-request loses only the requests it held: they get a clear 503; Ray replaces it)."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

pytest.importorskip("ray.serve")  # every test here runs on Ray Serve

from naiad.ray.application import MODELS, build
from naiad.ray.options import RayServeOptions
from tests.models import write_model
from tests.ray.conftest import APP, Cluster, running_replicas, wait_for
from tests.ray.test_serve import request

SLOW_CONFIG = """
    name: "{name}"
    backend: "python"
    input [{{ name: "INPUT0", data_type: TYPE_FP32, dims: [ 1 ] }}]
    output [{{ name: "OUTPUT0", data_type: TYPE_FP32, dims: [ 1 ] }}]
    instance_group [{{ kind: KIND_CPU, count: 4 }}]
"""
SLOW_PY = """
    import time
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def execute(self, requests):
            responses = []
            for request in requests:
                seconds = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
                time.sleep(float(seconds[0]))
                responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", seconds)]))
            return responses
"""


def slow_repository(root: Path, names: list[str]) -> Path:
    for name in names:
        write_model(root, name, SLOW_CONFIG.format(name=name), SLOW_PY)
    return root


def sleep_for(cluster: Cluster, name: str, seconds: float) -> tuple[int, bytes, dict[str, str]]:
    body = {"inputs": [{"name": "INPUT0", "shape": [1], "datatype": "FP32", "data": [seconds]}]}
    return request(cluster.url, "POST", f"/v2/models/{name}/infer", json.dumps(body).encode())


# Ray checks look_back_period_s against autoscaling_config's deprecated metrics_interval_s (10 s by default), not
# against the push interval the replicas' environment sets (naiad.ray.options.metrics_push_env).
@pytest.mark.filterwarnings("ignore:`look_back_period_s`")
def test_load_step_scales_out_and_back(cluster: Cluster, tmp_path: Path) -> None:
    from ray import serve

    options = RayServeOptions(model_repositories=[str(slow_repository(tmp_path / "repo", ["slow"]))],
                              min_replicas=1, max_replicas=2, target_ongoing_requests=1, upscale_delay_s=1,
                              downscale_delay_s=2, metrics_interval_s=0.5, look_back_period_s=1,
                              max_models_per_replica=1, replica_num_cpus=0.5)
    serve.run(build(options), name=APP, route_prefix="/")
    stop = threading.Event()
    failures: list[int] = []

    def client() -> None:
        while not stop.is_set():
            status = sleep_for(cluster, "slow", 0.2)[0]
            if status != 200:
                failures.append(status)

    try:
        assert running_replicas(MODELS) == 1
        with ThreadPoolExecutor(4) as pool:  # 4 requests in flight against a target of 1 per replica
            for _ in range(4):
                pool.submit(client)
            started = time.monotonic()
            try:
                wait_for(lambda: running_replicas(MODELS) == 2, 45, "a second replica under load")
            finally:
                stop.set()
            out = time.monotonic() - started
        assert failures == []
        started = time.monotonic()
        wait_for(lambda: running_replicas(MODELS) == 1, 45, "the deployment to scale back to 1 replica")
        print(f"\nautoscaling: 1 -> 2 replicas {out:.1f} s after the load step, 2 -> 1 {time.monotonic() - started:.1f} s "
              "after it ended")
    finally:
        stop.set()
        serve.delete(APP)


def test_killed_replica_loses_only_its_in_flight_requests(cluster: Cluster, tmp_path: Path) -> None:
    import ray
    from ray import serve

    options = RayServeOptions(model_repositories=[str(slow_repository(tmp_path / "repo", ["a", "b"]))],
                              min_replicas=2, max_replicas=2, max_models_per_replica=1, replica_num_cpus=0.5)
    serve.run(build(options), name=APP, route_prefix="/")
    try:
        # Each model on its own replica (a replica holds one model here).
        holder = {name: sleep_for(cluster, name, 0)[2]["x-naiad-replica"] for name in ("a", "b")}
        assert holder["a"] != holder["b"]
        with ThreadPoolExecutor(6) as pool:
            doomed = [pool.submit(sleep_for, cluster, "a", 3) for _ in range(3)]
            spared = [pool.submit(sleep_for, cluster, "b", 3) for _ in range(3)]
            wait_for(lambda: _replica_actor(holder["a"]) is not None, 5, "the replica actor")
            time.sleep(1.0)  # the requests are in the model now
            # The replica's process dies as in a crash (the OOM killer's SIGKILL), its models' worker processes
            # after it (PR_SET_PDEATHSIG). (ray.kill would first stop the worker processes, from inside the
            # replica, which then answers for them: the model's instance was killed, a 500.)
            os.kill(ray.get(_replica_actor(holder["a"]).__ray_call__.remote(lambda _: os.getpid())), signal.SIGKILL)
            lost = [future.result() for future in doomed]
            kept = [future.result() for future in spared]
        print(f"\nreplica killed: {sum(s == 503 for s, _, _ in lost)} of its 3 in-flight requests answered 503, "
              f"{sum(s == 200 for s, _, _ in kept)} of 3 on the other replica answered 200")
        assert [status for status, _, _ in kept] == [200, 200, 200]
        for status, body, _ in lost:
            assert status == 503
            assert "stopped while handling this request" in json.loads(body)["error"]
        # Ray starts a replacement; model a is served again (loaded on whichever replica Ray picks).
        wait_for(lambda: running_replicas(MODELS) == 2, 60, "a replacement replica")
        status, _, headers = sleep_for(cluster, "a", 0)
        assert status == 200 and headers["x-naiad-replica"] != holder["a"]
    finally:
        serve.delete(APP)


def _replica_actor(replica_id: str):  # noqa: ANN202 - a Ray actor handle
    import ray

    for actor in ray.util.list_named_actors(all_namespaces=True):
        if actor["name"].endswith(f"#{replica_id}") and MODELS in actor["name"]:
            return ray.get_actor(actor["name"], namespace=actor["namespace"])
    return None
