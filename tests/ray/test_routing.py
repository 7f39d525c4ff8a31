"""Model-aware routing: 2 replicas holding at most 2 models each, a trace over 4 models. After warm-up each
model is answered by the replica that holds it (Ray's multiplexing), and a replica beyond its limit unloads
its least recently used model through naiad's unload path."""

from __future__ import annotations

import importlib
import json
import random
import shutil
from collections import Counter, defaultdict
from pathlib import Path

import pytest

pytest.importorskip("ray.serve")  # every test here runs on Ray Serve

from naiad.ray.application import MODELS, build
from naiad.ray.options import RayServeOptions
from tests.ray.conftest import APP, Cluster, running_replicas, wait_for
from tests.ray.test_serve import ADD_SUB, request
from tests.server import EXAMPLES

NAMES = ["m0", "m1", "m2", "m3"]


def copies(root: Path, names: list[str]) -> Path:
    """The example add_sub model under several names."""
    for name in names:
        shutil.copytree(EXAMPLES / "add_sub", root / name, ignore=shutil.ignore_patterns("__pycache__"))
        config = root / name / "config.pbtxt"
        config.write_text(config.read_text().replace('name: "add_sub"', f'name: "{name}"'))
    return root


def infer(cluster: Cluster, name: str) -> tuple[str, str]:
    status, body, headers = request(cluster.url, "POST", f"/v2/models/{name}/infer", json.dumps(ADD_SUB).encode())
    assert status == 200, body
    assert json.loads(body)["model_name"] == name
    return headers["x-naiad-replica"], headers["x-naiad-residency"]


def test_each_model_served_by_the_replica_holding_it(cluster: Cluster, tmp_path: Path) -> None:
    from ray import serve

    repository = copies(tmp_path / "repo", NAMES)
    options = RayServeOptions(model_repositories=[str(repository)], min_replicas=2, max_replicas=2,
                              max_models_per_replica=2, replica_num_cpus=0.5)
    serve.run(build(options), name=APP, route_prefix="/")
    try:
        assert running_replicas(MODELS) == 2
        # Warm-up: every model once, a little apart, so each replica reports what it loaded before the next
        # model is placed.
        for name in NAMES:
            infer(cluster, name)
        rng = random.Random(13)
        trace = [rng.choice(NAMES) for _ in range(80)]
        served: dict[str, Counter] = defaultdict(Counter)
        outcomes: Counter = Counter()
        for name in trace:
            replica, residency = infer(cluster, name)
            served[name][replica] += 1
            outcomes[residency] += 1
        hit_ratio = outcomes["hit"] / len(trace)
        placement = {name: dict(counts) for name, counts in sorted(served.items())}
        print(f"\nrouting hit ratio after warm-up: {hit_ratio:.3f} ({outcomes['hit']}/{len(trace)}); "
              f"replicas per model: {placement}")
        assert hit_ratio >= 0.9
        # Each model stayed on one replica, and the two replicas split the four models.
        assert sum(max(counts.values()) for counts in served.values()) >= 0.9 * len(trace)
        assert len({counts.most_common(1)[0][0] for counts in served.values()}) == 2
        # Every replica's counts, through Ray's metrics export.
        replicas = {replica for counts in served.values() for replica in counts}
        wait_for(lambda: replicas <= _exported_replicas(cluster), 30, "both replicas' metrics")
    finally:
        serve.delete(APP)
    wait_for(lambda: running_replicas(MODELS) == 0, 30, "the replicas to stop")


def test_least_recently_used_model_is_unloaded(cluster: Cluster, tmp_path: Path) -> None:
    """One replica, room for 2 models, 3 used in turn: the third load unloads the first (its worker process
    stops), and using the first again loads it again."""
    from ray import serve

    repository = copies(tmp_path / "repo", NAMES[:3])
    # Deployed as `serve run naiad.ray:app key=value ...` does: the builder found by its import path, text args.
    builder = getattr(importlib.import_module("naiad.ray"), "app")
    serve.run(builder({"model_repository": str(repository), "max_models_per_replica": "2",
                       "replica_num_cpus": "0.5"}), name=APP, route_prefix="/")
    try:
        assert [infer(cluster, name)[1] for name in ("m0", "m1", "m0")] == ["load", "load", "hit"]
        before = _model_workers()
        assert before  # the two models' Python worker processes, children of the replica
        assert [infer(cluster, name)[1] for name in ("m2", "m0", "m1")] == ["load", "hit", "load"]
        # m2 evicted m1 (least recently used), then m1 evicted m2: each eviction stopped the model's workers,
        # so the replica never holds more than two models' worth, and m1's first workers are gone.
        def settled() -> bool:
            now = _model_workers()
            return len(now) == len(before) and bool(before - now)

        wait_for(settled, 10, "the evicted models' workers to stop")
        assert request(cluster.url, "POST", "/v2/repository/models/m0/unload")[0] == 400  # automatic here
        status, _, headers = request(cluster.url, "POST", "/v2/repository/models/m2/load")  # made resident
        assert (status, headers["x-naiad-residency"]) == (200, "load")
        assert infer(cluster, "m2")[1] == "hit"
        status, body, _ = request(cluster.url, "POST", "/v2/repository/index")
        assert status == 200 and [row["name"] for row in json.loads(body)] == NAMES[:3]
    finally:
        serve.delete(APP)


def _exported_replicas(cluster: Cluster) -> set[str]:
    """Replicas with a naiad_ray_requests_total{residency="hit"} line on Ray's metrics export."""
    import re
    import urllib.request

    text = urllib.request.urlopen(f"http://127.0.0.1:{cluster.metrics_port}/metrics", timeout=10).read().decode()
    return {match.group(1) for line in text.splitlines()
            if line.startswith("ray_naiad_ray_requests_total{") and 'residency="hit"' in line
            for match in [re.search(r'replica="([^"]+)"', line)] if match}


def _exported_loads(cluster: Cluster, replica: str) -> int:
    """The replica's ray_naiad_ray_model_loads_total, every model's, from Ray's metrics export."""
    import urllib.request

    text = urllib.request.urlopen(f"http://127.0.0.1:{cluster.metrics_port}/metrics", timeout=10).read().decode()
    return sum(int(float(line.rsplit(" ", 1)[1])) for line in text.splitlines()
               if line.startswith("ray_naiad_ray_model_loads_total{") and f'replica="{replica}"' in line)


def _model_workers() -> set[int]:
    """PIDs of naiad's Python model workers started by the model replicas on this machine."""
    import psutil

    workers = set()
    for process in psutil.process_iter(["cmdline"]):
        if any("NaiadModels" in part for part in process.info["cmdline"] or ()):
            workers |= {child.pid for child in process.children()
                        if "naiad.backends.python.worker" in " ".join(child.cmdline())}
    return workers


def test_replica_asked_for_twice_its_models_does_not_thrash(cluster: Cluster, tmp_path: Path) -> None:
    """A replica holding one model while clients use two, as a survivor is while Ray replaces its dead peer:
    each model loaded stays --min-model-residency-s, so the replica reloads about once per period (requests for
    the other model wait) instead of on nearly every request (pure LRU: a,b,a,b... each a load). Every load the
    replica made is one its answers reported: none happened outside the residency check (Ray's cache loading a
    model that a request still saw resident while Ray evicted it)."""
    import threading
    import time
    from concurrent.futures import ThreadPoolExecutor

    from ray import serve

    residency_s, seconds = 1.0, 6.0
    repository = copies(tmp_path / "repo", NAMES[:2])
    options = RayServeOptions(model_repositories=[str(repository)], max_models_per_replica=1,
                              min_model_residency_s=residency_s, replica_num_cpus=0.5)
    serve.run(build(options), name=APP, route_prefix="/")
    outcomes: Counter = Counter()
    lock = threading.Lock()
    try:
        replica = infer(cluster, "m0")[0]
        deadline = time.monotonic() + seconds

        def client(name: str) -> None:
            while time.monotonic() < deadline:
                residency = infer(cluster, name)[1]
                with lock:
                    outcomes[residency] += 1

        with ThreadPoolExecutor(4) as pool:
            for future in [pool.submit(client, name) for name in ("m0", "m1", "m0", "m1")]:
                future.result()
        total = sum(outcomes.values())
        print(f"\ntwo models on a replica holding one, {seconds:g} s: {outcomes['load']} loads in {total} requests")
        # At most one load per residency period (plus the first); most requests find their model (pure LRU: 17
        # loads in 36 requests).
        assert outcomes["load"] <= seconds / residency_s + 2
        assert outcomes["hit"] >= 0.7 * total and total >= 20
        reported = outcomes["load"] + 1  # and the first request's
        wait_for(lambda: _exported_loads(cluster, replica) >= reported, 15, "the replica's load count")
        time.sleep(1.5)  # one more report of Ray's metrics (every second here): any load beyond shows by then
        assert _exported_loads(cluster, replica) == reported
    finally:
        serve.delete(APP)


def test_statistics_sum_every_replica(cluster: Cluster, tmp_path: Path) -> None:
    """Two models on two replicas (one model each): the ingress's /v2/models/stats lists both with every
    request counted, where it answered from a service holding no model (empty), and a model's own statistics
    come from every replica, not the one a request happened to reach."""
    from ray import serve

    repository = copies(tmp_path / "repo", NAMES[:2])
    options = RayServeOptions(model_repositories=[str(repository)], min_replicas=2, max_replicas=2,
                              max_models_per_replica=1, replica_num_cpus=0.5)
    serve.run(build(options), name=APP, route_prefix="/")
    try:
        sent = {"m0": 5, "m1": 3}
        replicas = {name: {infer(cluster, name)[0] for _ in range(count)} for name, count in sent.items()}
        assert all(len(held) == 1 for held in replicas.values()) and replicas["m0"] != replicas["m1"]

        def counts() -> dict[str, int]:
            status, body, _ = request(cluster.url, "GET", "/v2/models/stats")
            assert status == 200, body
            return {row["name"]: row["inference_stats"]["success"]["count"]
                    for row in json.loads(body)["model_stats"]}

        wait_for(lambda: counts() == sent, 15, "both replicas' statistics at the ingress")
        status, body, _ = request(cluster.url, "GET", "/v2/models/m1/versions/1/stats")
        assert status == 200
        [row] = json.loads(body)["model_stats"]
        assert (row["name"], row["version"], row["inference_count"]) == ("m1", "1", 3)
        assert row["inference_stats"]["success"]["ns"] > 0
        # Triton's answers for what no replica holds.
        status, body, _ = request(cluster.url, "GET", "/v2/models/nothing/stats")
        assert (status, json.loads(body)) == (400, {"error": "requested model 'nothing' is not available"})
        status, body, _ = request(cluster.url, "GET", "/v2/models/m0/versions/7/stats")
        assert (status, json.loads(body)["error"]) == (400, "requested model version is not available for "
                                                            "model 'm0'")
    finally:
        serve.delete(APP)


def test_cold_start_loads_each_model_once(cluster: Cluster, tmp_path: Path) -> None:
    """Cold, with clients already waiting on every model: each model is loaded on one replica (the first
    request's), not on every replica the early requests happen to reach before Ray knows who holds it."""
    from concurrent.futures import ThreadPoolExecutor

    from ray import serve

    repository = copies(tmp_path / "repo", NAMES[:2])
    options = RayServeOptions(model_repositories=[str(repository)], min_replicas=2, max_replicas=2,
                              max_models_per_replica=2, replica_num_cpus=0.5)
    serve.run(build(options), name=APP, route_prefix="/")
    try:
        with ThreadPoolExecutor(12) as pool:
            answers = list(pool.map(lambda name: (name, *infer(cluster, name)), NAMES[:2] * 6))
        loads = sorted((name, replica) for name, replica, residency in answers if residency == "load")
        print(f"\ncold start, 12 concurrent requests over 2 models on 2 replicas: loads {loads}")
        assert sorted(name for name, _ in loads) == NAMES[:2]
    finally:
        serve.delete(APP)
