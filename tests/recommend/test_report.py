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
    for width in (80, 120):  # a terminal's width: blocks of columns, the variants numbered in the first
        text = report.text_table(rows, sla=True, price=True, width=width)
        assert max(len(line) for line in text.splitlines()) <= width, text
        first, *rest = [block.splitlines() for block in text.split("\n\n")]
        assert "variant" in " ".join(first[:3]) and first[-1].startswith("4  pytorch: base") and "failed" in first[-1]
        assert all(block[-1].startswith("4 ") for block in rest)
        every = " ".join(" ".join(line.split()) for block in [first, *rest] for line in block)
        assert all(word in every for word in ("p95 ms", "within SLA", "cost/hour", "memory"))
    assert len(report.text_table(rows, sla=True, price=True, width=80).split("\n\n")) > 1


def test_the_table_scrolls_inside_a_narrow_page(tmp_path: Path) -> None:
    """A 1,280 px window: the page holds its width (the table scrolls in its own box, headings wrap), figures
    shrink to fit."""
    rows = [row(m, None, None) for m in SWEEP]
    summary = {"model": "m", "winner": None, "reason": "-", "server": "naiad", "protocol": "http",
               "machine": {"cpus": 2}, "traffic": {}, "stopping": None, "skipped": [], "notes": []}
    report.write(tmp_path, summary, rows, list(SWEEP), None, None)
    html = (tmp_path / "report.html").read_text()
    assert '<div class="wide"><table>' in html and ".wide { overflow-x: auto; }" in html
    assert "th { white-space: normal; max-width: 7em;" in html and "img { max-width: 100%; }" in html


def test_value_labels_sit_past_their_whiskers() -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    ax.barh(["a", "b"], [100.0, 50.0])
    report._value_labels(ax, "{:,.0f}", [130.0, None])
    labels = {t.get_text(): t for t in ax.texts}
    assert labels["100"].xy[0] == 130.0 and labels["50"].xy[0] == 50.0   # past a's whisker; b has none
    assert labels["100"].xy[1] != labels["50"].xy[1]   # each on its own bar's row
    plt.close(fig)


def test_sla_spread_is_over_the_runs_that_met_it() -> None:
    from naiad.recommend.select import Row

    r = Row("a", "onnxruntime", "base", "a", "measured", runs=3, sla_throughput_low=0.0, sla_throughput_high=190.0,
            sla_runs_met=2, sla_throughput_low_met=150.0)
    assert r.sla_spread == "150-190 (2 of 3 runs)"
    r.sla_runs_met, r.sla_throughput_low = 3, 150.0
    assert r.sla_spread == "150-190"
    r.sla_runs_met, r.sla_throughput_low_met, r.sla_throughput_high = 0, None, 0.0
    assert r.sla_spread == "no run"
