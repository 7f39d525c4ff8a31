"""``naiad recommend`` end to end on a tiny ONNX model: every variant served and measured, the report written, the
winner's config.pbtxt served by naiad."""

from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient

from tests import onnx_graphs
from tests.server import ROOT, RunningServer

CONFIG = """
name: "arith"
backend: "onnxruntime"
max_batch_size: 8
input [{ name: "INPUT0", data_type: TYPE_FP32, dims: [ 4 ] }, { name: "INPUT1", data_type: TYPE_FP32, dims: [ 4 ] }]
output [{ name: "OUTPUT0", data_type: TYPE_FP32, dims: [ 4 ] }, { name: "OUTPUT1", data_type: TYPE_FP32, dims: [ 4 ] }]
"""

# Two 1-second steps (1 then 2 users): enough for a curve, short enough for a test.
TRAFFIC = {"InputConfig": {"TrafficPattern": {"TrafficType": "STAIRS",
                                              "Stairs": {"DurationInSeconds": 1, "NumberOfSteps": 2,
                                                         "UsersPerStep": 1}}}}
# The module's fixture runs the whole sweep (~15 s here), counted in the first test's time.
pytestmark = pytest.mark.timeout(300)

KINDS = ["base", "dynamic batching", "instance group x2", "dynamic batching + instance group x2"]
PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def recommended(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, subprocess.CompletedProcess[str]]:
    tmp = tmp_path_factory.mktemp("recommend")
    model = onnx_graphs.write(tmp / "repo", "arith", onnx_graphs.add_sub("TYPE_FP32", [4]), CONFIG)
    (model / "1" / "model.pt").write_bytes(b"the TorchScript export of the same model")
    traffic = tmp / "job.json"
    traffic.write_text(json.dumps(TRAFFIC))
    out = tmp / "out"
    # Run from a folder holding a naiad/ package of its own, as a clone's parent folder holds the clone: the
    # servers and load workers must still import the naiad this command imported (-P: as the console script,
    # which does not put the current folder on sys.path either).
    decoy = tmp / "cwd"
    (decoy / "naiad").mkdir(parents=True)
    (decoy / "naiad" / "__init__.py").write_text("raise ImportError('the decoy naiad in the current folder')\n")
    safe = ["-P"] if sys.version_info >= (3, 11) else []   # (before 3.11 the command itself would take the decoy)
    done = subprocess.run(
        [sys.executable, *safe, "-m", "naiad", "recommend", str(model), "-o", str(out), "--traffic", str(traffic),
         "--sla-p95-ms", "1000", "--price-per-hour", "0.5", "--bench-processes", "1", "--repeats", "2"],
        capture_output=True, text=True, timeout=240, cwd=decoy if safe else ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)})
    return model, out, done


def test_every_variant_is_measured(recommended: tuple[Path, Path, subprocess.CompletedProcess[str]]) -> None:
    _, out, done = recommended
    assert done.returncode == 0, done.stdout + done.stderr
    summary = json.loads((out / "summary.json").read_text())
    onnx_rows = [r for r in summary["variants"] if r["backend"] == "onnxruntime"]
    assert [r["kind"] for r in onnx_rows] == KINDS
    for r in onnx_rows:
        assert r["status"] == "measured", r["error"]
        assert r["max_invocations_per_minute"] > 0 and r["errors"] == 0
        assert 0 < r["p50_ms"] <= r["p95_ms"] <= r["p99_ms"]
        assert r["setup_s"] > 0 and r["load_duration_s"] > 0
        assert r["cpu_cores"] > 0 and r["memory_mb_peak"] > 0
        assert r["cost_per_hour"] == 0.5
        assert r["cost_per_million"] == pytest.approx(0.5 / (r["max_throughput"] * 3600) * 1e6)
    # the TorchScript export is a backend of its own: served where torch is installed, skipped cleanly otherwise
    torch_rows = [r for r in summary["variants"] if r["backend"] == "pytorch"]
    if _has_torch():
        # a few bytes are no TorchScript: each variant fails to load and is recorded as failed
        assert [r["status"] for r in torch_rows] == ["failed"] * 4
        assert all("exited" in r["error"] for r in torch_rows)
    else:
        assert torch_rows == []
        assert [why for label, why in summary["skipped"]] == ["torch is not installed"] * 4
        assert "skipping pytorch: base: torch is not installed" in done.stdout
    curves = list(csv.DictReader(open(out / "curves.csv")))
    for kind in KINDS:   # two exports: labels name the backend
        assert [int(c["concurrency"]) for c in curves if c["variant"] == f"onnxruntime: {kind}"] == [1, 2]
    assert summary["traffic"] == TRAFFIC["InputConfig"]["TrafficPattern"]


def _has_torch() -> bool:
    import importlib.util

    return importlib.util.find_spec("torch") is not None


def test_report_and_figures(recommended: tuple[Path, Path, subprocess.CompletedProcess[str]]) -> None:
    from matplotlib.image import imread

    _, out, done = recommended
    html = (out / "report.html").read_text()
    for name in ("curves", "max_throughput", "cost"):
        png = out / f"{name}.png"
        assert png.read_bytes()[:8] == PNG
        height, width, _ = imread(png).shape
        assert width > 300 and height > 200
        assert f'src="{name}.png"' in html
        assert json.loads((out / f"{name}.json").read_text())
        assert (out / f"{name}.csv").read_text().count("\n") >= 2
    rows = list(csv.DictReader(open(out / "recommendations.csv")))
    assert [r["kind"] for r in rows if r["backend"] == "onnxruntime"] == KINDS
    summary = json.loads((out / "summary.json").read_text())
    markdown = (out / "recommendations.md").read_text().splitlines()
    assert len(markdown) == 2 + len(rows)
    assert f"recommendation: {summary['reason']}" in done.stdout
    if summary["verdict"]["decided"]:
        assert summary["winner"] == summary["best_median"]
        assert f"<tr class=winner><td>{summary['winner']}</td>" in html
        assert f"| **{summary['winner']}** |" in (out / "recommendations.md").read_text()
        assert "\u2605 recommended" in html
    else:  # undecided: nothing marked or recommended, and the verdict says what would decide it
        assert summary["winner"] is None and summary["best_median"]
        assert "class=winner" not in html and "**" not in (out / "recommendations.md").read_text()
        assert "\u2605" not in html + done.stdout
        assert "none: the verdict is undecided" in html
        assert any(word in summary["verdict"]["why"] for word in ("rerun", "--repeats", "--bench-cpus"))


def test_the_winner_config_loads_in_naiad(recommended: tuple[Path, Path, subprocess.CompletedProcess[str]],
                                          tmp_path: Path) -> None:
    model, out, done = recommended
    summary = json.loads((out / "summary.json").read_text())
    if summary["verdict"]["decided"]:
        text = (out / "config.pbtxt").read_text()
        assert text == summary["winner_config"] and f"# naiad recommend: {summary['winner']}" in text
        policy = json.loads((out / "scaling_policy.json").read_text())
        assert policy == summary["scaling_policy"] and f"scaling policy: {out / 'scaling_policy.json'}" in done.stdout
        chosen = summary["winner"]
    else:  # no config and no scaling policy: the best median run's config is served instead
        assert not (out / "config.pbtxt").exists() and not (out / "scaling_policy.json").exists()
        assert summary["winner_config"] == "" and summary["scaling_policy"] is None and "config: " not in done.stdout
        chosen = summary["best_median"]
        slug = next(r["slug"] for r in summary["variants"] if r["variant"] == chosen)
        text = (out / "variants" / slug / "arith" / "config.pbtxt").read_text()
    repo = tmp_path / "repo"
    shutil.copytree(model / "1", repo / "arith" / "1")
    (repo / "arith" / "config.pbtxt").write_text(text)
    server = RunningServer([repo], "--exit-on-error=true")
    try:
        with httpclient.InferenceServerClient(server.url) as client:
            a = np.arange(8, dtype=np.float32).reshape(2, 4)
            inputs = [httpclient.InferInput("INPUT0", [2, 4], "FP32"), httpclient.InferInput("INPUT1", [2, 4], "FP32")]
            inputs[0].set_data_from_numpy(a)
            inputs[1].set_data_from_numpy(np.ones_like(a))
            result = client.infer("arith", inputs)
            np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + 1)
            np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - 1)
            served = client.get_model_config("arith")
    finally:
        server.stop()
    winner = next(r for r in summary["variants"] if r["variant"] == chosen)
    assert ("dynamic_batching" in served) == ("dynamic batching" in winner["kind"])


def test_spread_verdict_and_inference_recommender_fields(
        recommended: tuple[Path, Path, subprocess.CompletedProcess[str]]) -> None:
    _, out, done = recommended
    assert "decoy" not in done.stdout + done.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["repeats"] == 2
    verdict = summary["verdict"]
    assert isinstance(verdict["decided"], bool) and verdict["why"]
    assert f"verdict: {'decided' if verdict['decided'] else 'undecided'}: {verdict['why']}" in done.stdout
    onnx_rows = [r for r in summary["variants"] if r["backend"] == "onnxruntime"]
    for r in onnx_rows:
        assert r["runs"] == 2
        assert 0 < r["max_throughput_low"] <= r["max_throughput"] <= r["max_throughput_high"]
        assert r["generator_cpu_cores"] > 0 and r["generator_processes"] == 1
    # the verdict follows from the spreads: decided only when the winner's slowest run beat every other's fastest
    winner = next(r for r in onnx_rows if r["variant"] == summary["best_median"])
    rivals = max(r["sla_throughput_high"] for r in onnx_rows if r is not winner)
    assert verdict["decided"] == (winner["sla_throughput_low"] > rivals) or "load generator" in verdict["why"]
    curves = list(csv.DictReader(open(out / "curves.csv")))
    for c in curves:
        assert int(c["runs"]) == 2
        assert float(c["throughput_min"]) <= float(c["throughput"]) <= float(c["throughput_max"])
        assert float(c["p95_ms_min"]) <= float(c["p95_ms"]) <= float(c["p95_ms_max"])
    # Inference Recommender's names and units
    recommendations = json.loads((out / "inference_recommendations.json").read_text())
    assert recommendations["InputConfig"]["TrafficPattern"] == summary["traffic"]
    by_id = {rec["RecommendationId"]: rec["Metrics"] for rec in recommendations["InferenceRecommendations"]}
    for r in onnx_rows:
        metrics = by_id[r["slug"]]
        assert isinstance(metrics["MaxInvocations"], int) and metrics["MaxInvocations"] > 0
        assert metrics["MaxInvocations"] <= r["max_invocations_per_minute"] * 1.001   # where the curve levels off
        assert isinstance(metrics["ModelLatency"], int)
        assert 0 < metrics["CpuUtilization"] < 100 * (os.cpu_count() or 1)
        assert 0 < metrics["MemoryUtilization"] < 100
        assert metrics["CostPerHour"] == 0.5
        # (MaxInvocations is rounded to an integer; the cost per inference is not)
        assert metrics["CostPerInference"] == pytest.approx(0.5 / (metrics["MaxInvocations"] * 60), rel=1e-3)
    # the traffic file's 1 s steps are shorter than SageMaker would take? STAIRS has no minimum: no note
    assert "SageMaker would refuse" not in done.stdout
