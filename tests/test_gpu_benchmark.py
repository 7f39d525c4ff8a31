"""benchmarks/gpu.py, the one GPU command, in its CPU smoke mode: tiny models, one short level per model and backend,
the fault test. Needs torch (not in CI: skipped there); the GPU run itself is benchmarks/gpu_device_run.sh."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

from gpu_models import Encoder, ResNet50


def test_the_models_have_their_namesakes_sizes() -> None:
    # torchvision's resnet50 has 25,557,032 parameters; BERT-base's encoder (less token types, 128 positions) ~109 M
    assert sum(p.numel() for p in ResNet50().parameters()) == 25_557_032
    encoder = Encoder(vocab=1000, hidden=768, layers=1, heads=12, seq=128)
    per_layer = sum(p.numel() for p in encoder.encoder.layers[0].parameters())
    assert per_layer == 7_087_872  # one BERT-base layer: attention 4 x (768^2 + 768), FFN 2 x 768 x 3072 + biases, 2 norms


def test_cpu_smoke_run(tmp_path: Path) -> None:
    out = tmp_path / "gpu.json"
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "gpu.py"), "--device", "cpu", "--small", "--dtype", "fp16",
         "--concurrency", "4", "--bench-seconds", "0.5", "--bench-trials", "2", "--bench-processes", "1",
         "--warmup-requests", "20", "--limit-seconds", "0.2", "--batch-sizes", "1,4", "--workdir",
         str(tmp_path / "work"), "--json-out", str(out)],
        capture_output=True, text=True, timeout=110, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(out.read_text())
    rows = {(r["model"], r["backend"]): r for r in report["rows"]}
    assert set(rows) == {(m, b) for m in ("bert", "resnet50") for b in ("pytorch", "python")}
    for row in rows.values():
        assert row["items_per_s"] > 0 and row["p99_ms"] >= row["p50_ms"] > 0
        assert row["fraction"] == pytest.approx(row["items_per_s"] / max(report["limits"][row["model"]].values()))
    faults = {f["backend"]: f for f in report["faults"]}
    assert set(faults) == {"pytorch", "python"}
    for fault in faults.values():
        # on the CPU the bad token id is an IndexError of that one request; the model serves on at once
        assert fault["bad_status"] == 500 and "index out of range" in fault["bad_error"]
        assert fault["good_ok"] == fault["good_sent"] == 20 and fault["recovered_s"] < 5
        assert fault["other_model"] == "resnet50" and fault["other_model_ok"]
    table = done.stdout
    assert "xlimit" in table and ">=0.9" in table and "serving again after" in table
