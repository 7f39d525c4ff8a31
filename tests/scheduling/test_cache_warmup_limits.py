"""One server with ``--cache-config local,size=4096 --rate-limit execution_count --rate-limit-resource R:1``:
the response cache (a hit skips execution; hits, misses and their times in /stats; bounded by bytes), model
warmup (counted before READY; zero, random and file data; failing samples fail the load), and the rate limiter
(instances needing the one R never overlap; instances needing more R than exists fail the load)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient

from tests.models import write_model
from tests.server import RunningServer

DOUBLE = """
    import asyncio, json, time
    import numpy as np
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def initialize(self, args):
            self.seen = []

        async def execute(self, requests):
            started = time.monotonic()
            await asyncio.sleep({pause})
            out = []
            for r in requests:
                x = r.inputs()[0].as_numpy()
                if {fail} and not x.any():
                    raise ValueError("zeros are not welcome")
                if len(self.seen) < 8:  # what warmup sent (kept small so cached responses stay small)
                    self.seen.append([r.inputs()[0].name(), x.tolist() if x.size <= 4 else None])
                lead = (1,) * (x.ndim - 1)  # the batch dimension, for models that have one
                span = np.array([started, time.monotonic()]).reshape(lead + (2,))
                seen = np.array([json.dumps(self.seen).encode()], dtype=object).reshape(lead + (1,))
                out.append(pb_utils.InferenceResponse([
                    pb_utils.Tensor("OUTPUT0", x * 2), pb_utils.Tensor("SPAN", span), pb_utils.Tensor("SEEN", seen)]))
            return out
"""


def _config(name: str, extra: str = "", max_batch_size: int = 0, dims: str = "[ -1 ]") -> str:
    return f"""
        name: "{name}"
        backend: "python"
        max_batch_size: {max_batch_size}
        input [{{ name: "INPUT0", data_type: TYPE_FP32, dims: {dims} }}]
        output [{{ name: "OUTPUT0", data_type: TYPE_FP32, dims: {dims} }},
                {{ name: "SPAN", data_type: TYPE_FP64, dims: [ 2 ] }},
                {{ name: "SEEN", data_type: TYPE_STRING, dims: [ 1 ] }}]
        {extra}
    """


def _warmup(name: str, data: str, dims: str = "[ 2 ]", batch_size: int = 1, count: int = 1) -> str:
    return (f'{{ name: "{name}" batch_size: {batch_size} count: {count} '
            f'inputs {{ key: "INPUT0" value {{ data_type: TYPE_FP32 dims: {dims} {data} }} }} }}')


LIMITED = 'instance_group [{ count: 2 kind: KIND_CPU rate_limiter { resources [{ name: "R" count: %d }] } }]'
MODELS = {
    "cached": (_config("cached", "response_cache { enable: true }"), 0, False),
    "uncached": (_config("uncached"), 0, False),
    "warm": (_config("warm", "model_warmup [ %s, %s, %s ]" % (
        _warmup("zeros", "zero_data: true", batch_size=2, count=3), _warmup("noise", "random_data: true"),
        _warmup("file", 'input_data_file: "raw"')), max_batch_size=4, dims="[ 2 ]"), 0, False),
    "warm_fail": (_config("warm_fail", "model_warmup [ %s ]" % _warmup("zeros", "zero_data: true")), 0, True),
    "warm_wild": (_config("warm_wild", "model_warmup [ %s ]" % _warmup("any", "zero_data: true", "[ -1 ]")), 0,
                  False),
    "limited": (_config("limited", LIMITED % 1), 0.3, False),
    "unlimited": (_config("unlimited", "instance_group [{ count: 2 kind: KIND_CPU }]"), 0.3, False),
    "greedy": (_config("greedy", LIMITED % 2), 0, False),
}
REASONS = {
    "warm_fail": "Invalid argument: failed to run warmup sample 'zeros': Failed to process the request(s) for model "
                 "'warm_fail_0', message: ValueError: zeros are not welcome",
    "warm_wild": "Invalid argument: warmup setting expects all variable-size dimensions are specified for input "
                 "'INPUT0'",
    "greedy": 'Invalid argument: Resource count for "R" is limited to 1 which will prevent scheduling of one or more '
              "model instances, the minimum required count is 2",
}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    repo: Path = tmp_path_factory.mktemp("cache")
    for name, (cfg, pause, fail) in MODELS.items():
        write_model(repo, name, cfg, DOUBLE.format(pause=pause, fail=fail))
    (repo / "warm" / "warmup").mkdir()
    (repo / "warm" / "warmup" / "raw").write_bytes(np.array([7, 8], np.float32).tobytes())
    running = RunningServer([repo], "--cache-config", "local,size=4096", "--rate-limit", "execution_count",
                            "--rate-limit-resource", "R:1", "--strict-readiness=false")
    yield running
    running.stop()



def _infer(client: httpclient.InferenceServerClient, model: str, data: np.ndarray) -> httpclient.InferResult:
    tensor = httpclient.InferInput("INPUT0", list(data.shape), "FP32")
    tensor.set_data_from_numpy(data)
    return client.infer(model, [tensor])


def _stats(client: httpclient.InferenceServerClient, model: str) -> dict:
    return client.get_inference_statistics(model)["model_stats"][0]


def test_a_cache_hit_skips_execution(client: httpclient.InferenceServerClient) -> None:
    data = np.arange(4, dtype=np.float32)
    first = _infer(client, "cached", data)
    second = _infer(client, "cached", data)
    np.testing.assert_array_equal(second.as_numpy("OUTPUT0"), data * 2)
    np.testing.assert_array_equal(second.as_numpy("SPAN"), first.as_numpy("SPAN"))  # the very same answer
    _infer(client, "cached", data + 1)  # other bytes: a miss
    stats = _stats(client, "cached")
    infer = stats["inference_stats"]
    assert stats["execution_count"] == 2 and stats["inference_count"] == 2
    assert infer["success"]["count"] == 3 and infer["queue"]["count"] == 3
    assert infer["cache_hit"]["count"] == 1 and infer["cache_hit"]["ns"] > 0
    assert infer["cache_miss"]["count"] == 2 and infer["cache_miss"]["ns"] > 0
    assert infer["compute_infer"]["count"] == 2


def test_the_cache_is_bounded_by_bytes(client: httpclient.InferenceServerClient) -> None:
    start = _stats(client, "cached")["inference_stats"]
    big = np.zeros(2048, np.float32)  # 8 KiB of output: never fits in 4 KiB
    _infer(client, "cached", big)
    _infer(client, "cached", big)
    before = _stats(client, "cached")["inference_stats"]
    assert before["cache_hit"]["count"] == start["cache_hit"]["count"]
    assert before["cache_miss"]["count"] == start["cache_miss"]["count"] + 2
    # Entries of ~1 KiB each: the fifth evicts the least recently used (the first).
    rows = [np.full(200, i, np.float32) for i in range(5)]
    for row in rows:
        _infer(client, "cached", row)
    _infer(client, "cached", rows[0])
    _infer(client, "cached", rows[4])
    after = _stats(client, "cached")["inference_stats"]
    assert after["cache_hit"]["count"] - before["cache_hit"]["count"] == 1  # rows[4] only


def test_cache_counters_on_the_metrics_page(server: RunningServer, client: httpclient.InferenceServerClient) -> None:
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    data = np.full(3, 42, np.float32)
    _infer(client, "cached", data)
    _infer(client, "cached", data)
    infer = _stats(client, "cached")["inference_stats"]
    with urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics") as page:
        text = page.read().decode()
    assert "# TYPE nv_cache_num_hits_per_model counter" in text
    samples = {(s.name.removesuffix("_total"), s.labels["model"]): s.value
               for family in text_string_to_metric_families(text) for s in family.samples
               if s.name.startswith("nv_cache_")}
    assert samples[("nv_cache_num_hits_per_model", "cached")] == infer["cache_hit"]["count"]
    assert samples[("nv_cache_num_misses_per_model", "cached")] == infer["cache_miss"]["count"]
    assert samples[("nv_cache_hit_duration_per_model", "cached")] == infer["cache_hit"]["ns"] // 1000
    assert ("nv_cache_num_hits_per_model", "uncached") not in samples  # only models that use the cache


def test_models_without_response_cache_never_hit(client: httpclient.InferenceServerClient) -> None:
    data = np.ones(3, np.float32)
    _infer(client, "uncached", data)
    _infer(client, "uncached", data)
    stats = _stats(client, "uncached")
    assert stats["execution_count"] == 2
    assert stats["inference_stats"]["cache_hit"]["count"] == stats["inference_stats"]["cache_miss"]["count"] == 0


def test_warmup_ran_before_ready_and_counts(client: httpclient.InferenceServerClient) -> None:
    stats = _stats(client, "warm")  # the server was ready: warmup already happened
    assert stats["execution_count"] == 5 and stats["inference_count"] == 8
    assert {b["batch_size"]: b["compute_infer"]["count"] for b in stats["batch_stats"]} == {1: 2, 2: 3}
    seen = json.loads(_infer(client, "warm", np.ones((1, 2), np.float32)).as_numpy("SEEN")[0, 0])
    warmup = [values for _, values in seen[:8]]
    assert warmup[:6] == [[[0.0, 0.0]]] * 6
    assert warmup[7] == [[7.0, 8.0]]


@pytest.mark.parametrize("model", sorted(REASONS))
def test_load_failures(server: RunningServer, model: str) -> None:
    status, _, body = server.request("POST", "/v2/repository/index", "{}")
    rows = {row["name"]: row for row in json.loads(body)}
    assert rows[model]["state"] == "UNAVAILABLE"
    assert rows[model]["reason"].startswith(REASONS[model])


def _spans(server: RunningServer, model: str) -> list[tuple[float, float]]:
    spans: list[tuple[float, float]] = []

    def one() -> None:
        with httpclient.InferenceServerClient(server.url) as c:
            spans.append(tuple(_infer(c, model, np.ones(1, np.float32)).as_numpy("SPAN")))

    threads = [threading.Thread(target=one) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return sorted(spans)


def test_rate_limiter_keeps_instances_sharing_one_resource_apart(server: RunningServer) -> None:
    first, second = _spans(server, "unlimited")
    assert second[0] < first[1]  # two instances, overlapping
    first, second = _spans(server, "limited")
    assert second[0] >= first[1]  # two instances, one R: one after the other
