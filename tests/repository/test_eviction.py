"""The eviction policies: offline on seeded traces against Belady's optimum (a short version of
``benchmarks/sagemaker_mme.py --simulate``), their mechanics, and a live multi-model endpoint that unloads what
``--sagemaker-eviction-policy`` says."""

from __future__ import annotations

import hashlib
import json
import math
import statistics
import tarfile
from pathlib import Path

import boto3
import pytest

from benchmarks.eviction_replay import (belady_hits, lru_hits, noisy_costs, oracle_hits, phases, replay, shift_trace,
                                        zipf_trace)
from naiad.repository.eviction import GdsfPolicy, LruPolicy, make_policy
from tests.models import IDENTITY_FP32, write_model
from tests.server import RunningServer

MODELS, REQUESTS, RESIDENT = 40, 2000, 11  # the endpoint: 40 archives, 11 fit in the budget
SEEDS = range(10)


def ratios(s: float, shift: bool, requests: int = REQUESTS) -> list[tuple[float, float, float]]:
    """Per seed: (GDSF, LRU, A0) hits over Belady's, with equal sizes and noisy measured load times."""
    out = []
    sizes = [1] * MODELS
    for seed in SEEDS:
        trace = (shift_trace if shift else zipf_trace)(MODELS, requests, s, seed)
        best = belady_hits(trace, RESIDENT)
        gdsf = replay(GdsfPolicy(), trace, sizes, RESIDENT, noisy_costs(0.5, 0.3, seed))
        lru = replay(LruPolicy(), trace, sizes, RESIDENT, noisy_costs(0.5, 0.3, seed))
        assert lru == lru_hits(trace, RESIDENT)  # the server's LRU object is LRU
        bound = oracle_hits(trace, RESIDENT, phases(MODELS, requests, s, seed, shift))
        out.append((gdsf / best, lru / best, bound / best))
    return out


# (s, shifted, the least mean hits / Belady's over the seeds): 2,000 requests give 0.913, 0.959 and 0.902
# (docs/benchmarks/sagemaker-mme.md); the bounds leave ~0.005 for other seeds.
@pytest.mark.parametrize(("s", "shift", "least"), [(1.1, False, 0.905), (1.4, False, 0.95), (1.1, True, 0.895)])
def test_gdsf_reaches_nine_tenths_of_belady(s: float, shift: bool, least: float) -> None:
    results = ratios(s, shift)
    assert statistics.fmean(g for g, _, _ in results) >= least, results
    for gdsf, lru, bound in results:
        assert gdsf >= lru + 0.05, results
        assert gdsf >= 0.95 * bound, results


# (s, shifted, requests, the least share of A0's hits, the least lead over LRU): each seed's measure is at
# least ~0.01 above these.
@pytest.mark.parametrize(("s", "shift", "requests", "of_bound", "over_lru"),
                         [(0.8, False, REQUESTS, 0.95, 0.1), (0.8, True, REQUESTS, 0.94, 0.1),
                          (1.1, True, 1000, 0.93, 0.03), (1.1, False, 4000, 0.97, 0.08), (1.1, True, 4000, 0.96, 0.08)])
def test_gdsf_near_the_online_bound(s: float, shift: bool, requests: int, of_bound: float, over_lru: float) -> None:
    # Zipf 0.8: even A0, which knows the true probabilities, stays under 0.9 of Belady (0.859), and no online
    # policy beats A0 in expectation, so GDSF is held to a share of A0 there, on both trace kinds, and at other
    # lengths (the learning after a shift weighs more in 1,000 requests, less in 4,000).
    results = ratios(s, shift, requests)
    for gdsf, lru, bound in results:
        assert gdsf >= of_bound * bound, results
        assert gdsf >= lru + over_lru, results


def test_gdsf_weighs_size_and_load_time() -> None:
    policy = GdsfPolicy()
    for name, cost in (("big", 1.0), ("small", 1.0), ("cheap", 0.1)):
        policy.admit(name, cost)
        policy.access(name)
    # Same requests and load time: the one holding more memory goes first.
    assert policy.victim([("big", 200), ("small", 100)]) == "big"
    # Same size and requests: the one that reloads faster goes first.
    assert policy.victim([("small", 100), ("cheap", 100)]) == "cheap"
    # Five times the requests outweigh twice the size.
    for _ in range(4):
        policy.access("big")
    assert policy.victim([("big", 200), ("small", 100)]) == "small"


def test_gdsf_forgets_past_popularity() -> None:
    policy = GdsfPolicy(half_life=10, shift_evidence=math.inf)  # the decay alone
    policy.admit("old", 1.0)
    policy.admit("new", 1.0)
    for _ in range(20):
        policy.access("old")
    assert policy.frequency("old") == pytest.approx(sum(0.5 ** (i / 10) for i in range(20)))
    for _ in range(6):
        policy.access("new")
    assert policy.victim([("old", 1), ("new", 1)]) == "new"
    for _ in range(10):
        policy.access("new")
    assert policy.victim([("old", 1), ("new", 1)]) == "old"
    assert policy.shifts == 0


def test_gdsf_sees_the_popular_set_move_on() -> None:
    """500 requests spread over models a0..a3, then over b0..b3: the long count (half-life 1,000) alone would
    keep the a's ahead for ~500 more requests; the shift test restarts it within a few dozen."""
    policy = GdsfPolicy()
    names = [f"{group}{i}" for group in "ab" for i in range(4)]
    for name in names:
        policy.admit(name, 1.0)
    for i in range(500):
        policy.access(f"a{i % 4}")
    assert policy.shifts == 0  # a steady mix raises no alarm
    for i in range(40):
        policy.access(f"b{i % 4}")
    assert policy.shifts == 1
    assert all(policy.frequency(f"a{i}") == 0 for i in range(4))  # the change began with the first b
    assert policy.victim([(name, 1) for name in names]).startswith("a")
    assert policy.frequency("b0") == pytest.approx(sum(0.5 ** ((39 - i) / 1000) for i in range(0, 40, 4)))


def test_gdsf_history_stays_bounded() -> None:
    policy = GdsfPolicy(half_life=20, window=64)
    policy.admit("kept", 1.0)
    for i in range(5000):  # one-off models come and go
        name = f"m{i}"
        policy.admit(name, 1.0)
        policy.access(name)
        policy.removed(name)
    assert len(policy._counts) < 400 and len(policy._cost) < 400 and len(policy._recent) == 64
    assert "kept" in policy._cost  # loaded models are never forgotten


def test_lru_and_unknown_policy() -> None:
    policy = make_policy("lru")
    for name in ("a", "b", "c"):
        policy.admit(name, 1.0)
    policy.access("a")
    assert policy.victim([("a", 1), ("b", 1), ("c", 1)]) == "b"
    with pytest.raises(ValueError, match="unknown eviction policy 'fifo'"):
        make_policy("fifo")


# --- live: the policy the server runs --------------------------------------------------------------------------

# Holds ~40 MB of its own, so its worker's memory is mostly this model's.
HEAVY_PY = """
    import numpy as np
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def initialize(self, args):
            self.weights = np.ones(40 * 1024 * 1024 // 8)

        def execute(self, requests):
            return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", r.inputs()[0].as_numpy())])
                    for r in requests]
"""
BODY = json.dumps({"inputs": [{"name": "INPUT0", "shape": [2], "datatype": "FP32", "data": [1.5, 2.5]}]})


@pytest.fixture(scope="module")
def archives(tmp_path_factory: pytest.TempPathFactory) -> Path:
    data = tmp_path_factory.mktemp("model-data")
    source = tmp_path_factory.mktemp("sources")
    for name in ("hot", "one", "two", "three"):
        write_model(source, name, IDENTITY_FP32.format(name=name), HEAVY_PY)
        with tarfile.open(data / f"{name}.tar.gz", "w:gz") as tar:
            tar.add(source / name, arcname=name)
    return data


@pytest.mark.parametrize("policy", ["gdsf", "lru"])
def test_frequent_model_survives_a_burst_of_one_offs(archives: Path, tmp_path: Path, policy: str) -> None:
    """Two models fit. 'hot' serves most requests; three one-off models pass through. GDSF keeps 'hot' loaded
    (the one-offs evict each other); LRU unloads it when the second one-off arrives."""
    empty = tmp_path / "empty"
    empty.mkdir()
    # Each model measures ~62 MiB (40 MB of weights, the interpreter and numpy): two fit, three do not.
    server = RunningServer([empty], "--allow-sagemaker=true", "--allow-grpc=false", "--model-control-mode=explicit",
                           f"--sagemaker-models-root={tmp_path / 'models'}", f"--sagemaker-model-data-url={archives}",
                           "--model-memory-limit=150M", f"--sagemaker-eviction-policy={policy}",
                           env={"SAGEMAKER_MULTI_MODEL": "true"})
    try:
        client = boto3.client("sagemaker-runtime", endpoint_url=server.sagemaker_url, region_name="us-east-1",
                              aws_access_key_id="local", aws_secret_access_key="local")

        def invoke(name: str) -> None:
            answer = client.invoke_endpoint(EndpointName="local", TargetModel=f"{name}.tar.gz",
                                            ContentType="application/json", Body=BODY)
            assert json.loads(answer["Body"].read())["outputs"][0]["data"] == [1.5, 2.5]

        for name in ("hot", "hot", "hot", "hot", "one", "hot", "two", "three"):
            invoke(name)
        loaded = {m["modelName"] for m in json.loads(server.sagemaker("GET", "/models")[2])["models"]}
        log = server.log()
        assert log.count("evicting '") == 2, log  # the budget held two models, as meant
        hot = hashlib.md5(b"hot.tar.gz").hexdigest()
        if policy == "gdsf":
            assert hot in loaded, log
            assert "evicting 'one.tar.gz'" in log and "evicting 'two.tar.gz'" in log
            assert "lowest requests x load time / memory" in log
        else:
            assert hot not in loaded, log
            assert "evicting 'hot.tar.gz'" in log and "least recently used" in log
        invoke("hot")
        assert log.count("fetched 'hot.tar.gz'") == 1
        assert server.log().count("fetched 'hot.tar.gz'") == (1 if policy == "gdsf" else 2)
    finally:
        server.stop()
