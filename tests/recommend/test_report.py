"""The report's files from measured results, without a price or an SLA, and with a failed variant."""

from __future__ import annotations

import csv
import json
from pathlib import Path

from naiad.config import ModelConfig
from naiad.recommend import report
from naiad.recommend.select import choose, row
from naiad.recommend.sweep import Measured
from naiad.recommend.variants import Variant
from tests.recommend.test_select import SWEEP


def test_without_price_or_sla(tmp_path: Path) -> None:
    failed = Measured(Variant("pytorch", "base", ModelConfig(), "pytorch: base"), Path("/x"),
                      error="the server exited with code 1 before 'm' was ready: <boom>")
    results = [*SWEEP, failed]
    rows = [row(m, None, None) for m in results]
    winner, reason = choose(rows, None)
    summary = {"model": "m", "winner": winner.variant if winner else None, "reason": reason, "server": "naiad",
               "protocol": "http", "machine": {"cpus": 2}, "traffic": {}, "stopping": None,
               "skipped": [["pytorch: dynamic batching", "torch is not installed"]], "notes": []}
    figures = report.write(tmp_path, summary, rows, results, None, None)
    assert figures == ["curves", "max_throughput"]
    assert not (tmp_path / "cost.png").exists() and not (tmp_path / "cost.csv").exists()
    html = (tmp_path / "report.html").read_text()
    assert "No cost figure: no --price-per-hour given." in html
    assert "cost/hour" not in html and "within SLA" not in html
    assert "&lt;boom&gt;" in html and "<boom>" not in html   # escaped
    assert "torch is not installed" in html
    curves = list(csv.DictReader(open(tmp_path / "curves.csv")))
    assert len(curves) == 6 and {c["variant"] for c in curves} == {"base", "dynamic batching", "instance group x2"}
    bars = json.loads((tmp_path / "max_throughput.json").read_text())
    assert [b["variant"] for b in bars] == ["base", "dynamic batching", "instance group x2"]   # failed: no bar
    table = report.text_table(rows, sla=False, price=False).splitlines()
    assert table[0].split()[:3] == ["variant", "max", "invocations/min"]
    assert table[-1].startswith("pytorch: base") and " failed " in table[-1]
