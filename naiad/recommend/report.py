"""What ``naiad recommend`` writes: the table (CSV, JSON), one PNG per figure with its data as CSV and JSON beside
it, and an HTML page that puts them together."""

from __future__ import annotations

import csv
import html
import json
from pathlib import Path
from typing import Any

from naiad.recommend.select import Row
from naiad.recommend.sweep import Measured

# The table's columns as printed (key, heading, format).
COLUMNS: list[tuple[str, str, str]] = [
    ("variant", "variant", "{}"),
    ("max_invocations_per_minute", "max invocations/min", "{:.0f}"),
    ("max_throughput", "inferences/s (median run)", "{:.1f}"),
    ("spread", "lowest-highest run", "{}"),
    ("p50_ms", "p50 ms", "{:.2f}"),
    ("p95_ms", "p95 ms", "{:.2f}"),
    ("p99_ms", "p99 ms", "{:.2f}"),
    ("sla_invocations_per_minute", "invocations/min within SLA", "{:.0f}"),
    ("sla_p95_ms", "p95 ms there", "{:.2f}"),
    ("sla_spread", "within SLA: lowest-highest run", "{}"),
    ("cpu_cores", "CPU cores", "{:.2f}"),
    ("generator_cpu_cores", "generator CPU cores", "{:.2f}"),
    ("memory_mb_peak", "memory MB (peak)", "{:.0f}"),
    ("setup_s", "setup s", "{:.2f}"),
    ("load_duration_s", "model load s", "{:.3f}"),
    ("cost_per_hour", "cost/hour", "${:.3f}"),
    ("cost_per_million", "cost/1M inferences", "${:.4f}"),
    ("stop_reason", "stopped by", "{}"),
]


def cell(row: Row, key: str, fmt: str) -> str:
    value = getattr(row, key)
    if value is None or value == "":
        return "failed" if key == "max_invocations_per_minute" and row.status == "failed" else "-"
    return fmt.format(value)


def columns(rows: list[Row], sla: bool, price: bool) -> list[tuple[str, str, str]]:
    skip = set() if sla else {"sla_invocations_per_minute", "sla_p95_ms", "sla_spread"}
    if not price:
        skip |= {"cost_per_hour", "cost_per_million"}
    if all(r.runs < 2 for r in rows):
        skip |= {"spread", "sla_spread"}
    if all(r.generator_cpu_cores is None for r in rows):
        skip.add("generator_cpu_cores")
    if all(r.load_duration_s is None for r in rows):
        skip.add("load_duration_s")
    if all(r.stop_reason in ("", "completed") for r in rows):
        skip.add("stop_reason")   # every pattern ran to its end
    return [c for c in COLUMNS if c[0] not in skip]


def terminal_width() -> int:
    """The terminal's columns, held to 80-120 (wider lines are hard to follow; piped output gets 100)."""
    import shutil

    return max(80, min(120, shutil.get_terminal_size((100, 24)).columns))


def text_table(rows: list[Row], sla: bool, price: bool, width: int | None = None) -> str:
    """The table as blocks that each fit ``width`` columns (default: the terminal's, 80-120): the first names the
    variants, numbered; the next ones carry on with the other columns, by number. Headings wrap onto a second
    line where they are wider than their values."""
    import textwrap

    width = width or terminal_width()
    cols = columns(rows, sla, price)
    numbers = [str(i) for i in range(1, len(rows) + 1)]
    keyed = [("#", numbers), ("variant", [r.variant for r in rows])]
    metrics = [(heading, [cell(r, k, f) for r in rows]) for k, heading, f in cols if k != "variant"]

    def block(parts: list[tuple[str, list[str]]]) -> list[str]:
        wrapped = []
        for heading, values in parts:
            room = max([len(v) for v in values] + [len(word) for word in heading.split()] + [6])
            wrapped.append((textwrap.wrap(heading, room, break_on_hyphens=False, break_long_words=False) or [""],
                            values))
        widths = [max([len(v) for v in values] + [len(line) for line in heading]) for heading, values in wrapped]
        depth = max(len(heading) for heading, _ in wrapped)
        left = 2 if parts[1][0] == "variant" else 1  # left-aligned: the number, the variant
        lines = []
        for level in range(depth):
            texts = [(heading[level - depth + len(heading)] if level - depth + len(heading) >= 0 else "")
                     for heading, _ in wrapped]  # headings sit on their column's last line
            lines.append(_joined(texts, widths, left))
        lines.append("  ".join("-" * w for w in widths))
        lines.extend(_joined([values[i] for _, values in wrapped], widths, left) for i in range(len(rows)))
        return [line.rstrip() for line in lines]

    blocks: list[list[str]] = []
    current: list[tuple[str, list[str]]] = list(keyed)
    for metric in metrics:
        trial = block([*current, metric])
        if max(len(line) for line in trial) > width and len(current) > 1 and (current is not keyed or
                                                                             len(current) > 2):
            blocks.append(block(current))
            current = [keyed[0], metric]
        else:
            current.append(metric)
    blocks.append(block(current))
    return "\n\n".join("\n".join(lines) for lines in blocks)


def _joined(texts: list[str], widths: list[int], left: int) -> str:
    return "  ".join(t.ljust(w) if i < left else t.rjust(w) for i, (t, w) in enumerate(zip(texts, widths)))


def markdown_table(rows: list[Row], sla: bool, price: bool, winner: str | None = None) -> str:
    """The table for a README or a pull request, the winner in bold."""
    cols = columns(rows, sla, price)
    lines = ["| " + " | ".join(h for _, h, _ in cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        cells = [cell(r, k, f) for k, _, f in cols]
        if r.variant == winner:
            cells[0] = f"**{cells[0]}**"
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _write_data(out: Path, name: str, records: list[dict[str, Any]]) -> None:
    """``name.csv`` and ``name.json`` holding the same records."""
    (out / f"{name}.json").write_text(json.dumps(records, indent=2) + "\n", encoding="utf-8")
    with open(out / f"{name}.csv", "w", newline="", encoding="utf-8") as f:
        if records:
            writer = csv.DictWriter(f, fieldnames=list(records[0]))
            writer.writeheader()
            writer.writerows(records)


def _spread(values: list[float]) -> tuple[float, float, float]:
    """(median, min, max)."""
    ordered = sorted(values)
    middle = len(ordered) // 2
    median = ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2
    return median, ordered[0], ordered[-1]


def curve_records(results: list[Measured]) -> list[dict[str, Any]]:
    """One record per variant and load level: the median over the runs of the traffic pattern, with the
    lowest and highest run beside it (``_min`` / ``_max``)."""
    records = []
    for m in results:
        if m.traffic is None:
            continue
        runs = m.runs or [m.traffic]
        for step, level in enumerate(m.traffic.levels, 1):
            same = [run.levels[step - 1] for run in runs if len(run.levels) >= step and run.levels[step - 1].requests]
            if not same:
                same = [level]
            throughput = _spread([lv.throughput for lv in same])
            record: dict[str, Any] = {
                "variant": m.variant.label, "slug": m.variant.slug, "step": step,
                "concurrency": level.concurrency, "request_rate": level.request_rate,
                "requests": sum(lv.requests for lv in same), "errors": sum(lv.errors for lv in same),
                "stable": all(lv.stable for lv in same), "runs": len(same),
                "throughput": throughput[0], "throughput_min": throughput[1], "throughput_max": throughput[2],
            }
            for key in ("avg", "p50", "p90", "p95", "p99", "max"):
                values = [lv.latency_us[key] / 1000.0 for lv in same if key in lv.latency_us]
                median, low, high = _spread(values) if values else (None, None, None)
                record[f"{key}_ms"] = median
                if key == "p95":
                    record["p95_ms_min"], record["p95_ms_max"] = low, high
            records.append(record)
    return records


def _value_labels(ax: Any, fmt: str, reach: list[float | None] | None = None) -> None:
    """Each main bar's value (the first container) on its own row, past whatever is drawn on that row (``reach``:
    the whisker's end), so that a label is never read against another bar or on a whisker."""
    if not ax.containers:
        return
    bars = ax.containers[0]
    for i, bar in enumerate(bars):
        end = max(bar.get_width(), (reach[i] if reach is not None and reach[i] is not None else 0.0))
        ax.annotate(fmt.format(bar.get_width()), (end, bar.get_y() + bar.get_height() / 2), xytext=(6, 0),
                    textcoords="offset points", va="center", ha="left", fontsize=7,
                    bbox={"facecolor": "white", "edgecolor": "none", "alpha": 0.8, "pad": 1})
    ax.margins(x=0.2)


def _legend_below(ax: Any) -> None:
    """Under the axes, clear of the bars."""
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.15), ncol=2, frameon=False)


WINNER_MARK = "\u2605 recommended"


def _name(r: Row, winner: str | None) -> str:
    return f"{r.variant}  {WINNER_MARK}" if r.variant == winner else r.variant


def _bar_spread(ax: Any, labels: list[str], medians: list[float], lows: list[float | None],
                highs: list[float | None]) -> None:
    """Min-max whiskers over the runs on horizontal bars."""
    left = [max(0.0, m - (lo if lo is not None else m)) for m, lo in zip(medians, lows)]
    right = [max(0.0, (hi if hi is not None else m) - m) for m, hi in zip(medians, highs)]
    ax.errorbar(medians, labels, xerr=[left, right], fmt="none", ecolor="black", elinewidth=1, capsize=4,
                label="lowest-highest run")


def _mark_winner_bars(ax: Any, labels: list[str], winner: str | None) -> None:
    for bar, label in zip(ax.containers[0], labels):
        if winner is not None and label.startswith(winner) and label.endswith(WINNER_MARK):
            bar.set_edgecolor("gold")
            bar.set_linewidth(3)
            bar.set_hatch("//")
    for tick in ax.get_yticklabels():
        if tick.get_text().endswith(WINNER_MARK):
            tick.set_fontweight("bold")


def _figures(out: Path, rows: list[Row], curves: list[dict[str, Any]], sla_p95_ms: float | None,
             winner: str | None = None, undecided: str = "") -> list[str]:
    import matplotlib

    matplotlib.use("Agg")   # files only, never a display
    import matplotlib.pyplot as plt

    written = []
    measured = [r for r in rows if r.status == "measured"]
    runs = max((r.runs for r in measured), default=1)
    suffix = f" (median of {runs} runs; whiskers: lowest-highest)" if runs > 1 else ""
    banner = f"No clear winner: {undecided}" if undecided else ""

    def title(ax: Any, text: str) -> None:
        ax.set_title(text + suffix, fontsize=10)
        if banner:   # across the top of the figure, wrapped: the verdict travels with every image
            import textwrap

            ax.figure.text(0.5, 0.995, "\n".join(textwrap.wrap(banner, 120)[:2]), ha="center", va="top",
                           fontsize=8, color="darkred")

    def save(fig: Any, name: str) -> None:
        fig.tight_layout(rect=(0, 0, 1, 0.94) if banner else (0, 0, 1, 1))
        fig.savefig(out / f"{name}.png", dpi=100)
        plt.close(fig)
        written.append(name)

    fig, ax = plt.subplots(figsize=(9, 5.5))
    for r in measured:
        # in the order the load rose, so a level where throughput fell shows as the curve turning back
        points = [c for c in curves if c["slug"] == r.slug and c["requests"]]
        if not points:
            continue
        best = r.variant == winner
        xs = [c["throughput"] for c in points]
        ys = [c["p95_ms"] for c in points]
        xerr = [[x - c["throughput_min"] for x, c in zip(xs, points)],
                [c["throughput_max"] - x for x, c in zip(xs, points)]]
        yerr = [[y - c["p95_ms_min"] for y, c in zip(ys, points)], [c["p95_ms_max"] - y for y, c in zip(ys, points)]]
        bars = ax.errorbar(xs, ys, xerr=xerr, yerr=yerr, marker="*" if best else "o", markersize=12 if best else 5,
                           linewidth=3 if best else 1.2, elinewidth=0.8, capsize=3, zorder=3 if best else 2,
                           label=_name(r, winner))
        color = bars.lines[0].get_color()
        for c in points:
            load = f"c{c['concurrency']}" if c["concurrency"] is not None else f"{c['request_rate']:g}/s"
            ax.annotate(load, (c["throughput"], c["p95_ms"]), textcoords="offset points", xytext=(4, 4),
                        fontsize=7, color=color)
    if sla_p95_ms is not None:
        ax.axhline(sla_p95_ms, color="red", linestyle="--", linewidth=1, label=f"SLA p95 {sla_p95_ms:g} ms")
    ax.set_xlabel("throughput (inferences/s)")
    ax.set_ylabel("p95 latency (ms)")
    title(ax, "Throughput vs p95 latency per load level")
    ax.grid(True, alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)
    save(fig, "curves")

    labels = [_name(r, winner) for r in measured]
    fig, ax = plt.subplots(figsize=(9, 4.8))
    values = [r.max_throughput or 0.0 for r in measured]
    ax.barh(labels, values, color="tab:blue", label="max (median run)")
    _mark_winner_bars(ax, labels, winner)
    _value_labels(ax, "{:,.0f}", [r.sla_throughput_high if sla_p95_ms is not None else r.max_throughput_high
                                  for r in measured])
    if sla_p95_ms is not None:
        ax.barh(labels, [r.sla_throughput or 0.0 for r in measured], color="tab:green", height=0.4,
                label=f"within SLA (p95 <= {sla_p95_ms:g} ms)")
        # over the runs that met the SLA (a run that did not is in the table's count, not a whisker to 0)
        _bar_spread(ax, labels, [r.sla_throughput or 0.0 for r in measured],
                    [r.sla_throughput_low_met for r in measured], [r.sla_throughput_high for r in measured])
    else:
        _bar_spread(ax, labels, values, [r.max_throughput_low for r in measured],
                    [r.max_throughput_high for r in measured])
    _legend_below(ax)
    ax.set_xlabel("inferences per second")
    title(ax, "Max throughput per variant")
    ax.invert_yaxis()
    save(fig, "max_throughput")

    if measured and measured[0].cost_per_hour is not None:
        price = measured[0].cost_per_hour

        def per_million(throughput: float | None) -> float:
            return price / (throughput * 3600.0) * 1e6 if throughput else 0.0

        fig, ax = plt.subplots(figsize=(9, 4.8))
        costs = [r.cost_per_million or 0.0 for r in measured]
        ax.barh(labels, costs, color="tab:orange", label="at max throughput (median run)")
        _mark_winner_bars(ax, labels, winner)
        _value_labels(ax, "${:.4f}", [per_million(r.max_throughput_low) for r in measured])
        # the slowest run is the dearest
        _bar_spread(ax, labels, costs, [per_million(r.max_throughput_high) for r in measured],
                    [per_million(r.max_throughput_low) for r in measured])
        if sla_p95_ms is not None:
            ax.barh(labels, [r.sla_cost_per_million or 0.0 for r in measured], color="tab:purple", height=0.4,
                    label="at the SLA throughput")
        _legend_below(ax)
        ax.set_xlabel(f"USD per million inferences (instance at ${price:g}/hour)")
        title(ax, "Cost per million inferences")
        ax.invert_yaxis()
        save(fig, "cost")
    return written


def write(out: Path, summary: dict[str, Any], rows: list[Row], results: list[Measured],
          sla_p95_ms: float | None, price_per_hour: float | None) -> list[str]:
    """Every file of the report; returns the figures' names."""
    out.mkdir(parents=True, exist_ok=True)
    table = [r.as_dict() for r in rows]
    _write_data(out, "recommendations", table)
    (out / "recommendations.md").write_text(
        markdown_table(rows, sla_p95_ms is not None, price_per_hour is not None, summary.get("winner")) + "\n",
        encoding="utf-8")
    (out / "summary.json").write_text(json.dumps({**summary, "variants": table}, indent=2) + "\n",
                                      encoding="utf-8")
    curves = curve_records(results)
    _write_data(out, "curves", curves)
    _write_data(out, "max_throughput", [
        {"variant": r.variant, "max_invocations_per_minute": r.max_invocations_per_minute,
         "max_throughput": r.max_throughput, "max_throughput_min": r.max_throughput_low,
         "max_throughput_max": r.max_throughput_high, "sla_invocations_per_minute": r.sla_invocations_per_minute,
         "sla_throughput": r.sla_throughput, "sla_throughput_min": r.sla_throughput_low,
         "sla_throughput_max": r.sla_throughput_high, "runs": r.runs, "winner": r.variant == summary.get("winner")}
        for r in rows if r.status == "measured"])
    if price_per_hour is not None:
        _write_data(out, "cost", [
            {"variant": r.variant, "cost_per_hour": r.cost_per_hour, "cost_per_million": r.cost_per_million,
             "sla_cost_per_million": r.sla_cost_per_million} for r in rows if r.status == "measured"])
    verdict = summary.get("verdict") or {}
    figures = _figures(out, rows, curves, sla_p95_ms, summary.get("winner"),
                       "" if verdict.get("decided", True) else str(verdict.get("why", "")))
    if "InferenceRecommendations" in summary:
        (out / "inference_recommendations.json").write_text(json.dumps(
            {"JobName": f"naiad-recommend-{summary['model']}", "JobType": "Advanced", "Status": "COMPLETED",
             "InputConfig": {"TrafficPattern": summary.get("traffic"),
                             "StoppingConditions": summary.get("stopping")},
             "InferenceRecommendations": summary["InferenceRecommendations"]}, indent=2) + "\n",
            encoding="utf-8")
    (out / "report.html").write_text(_html(summary, rows, figures, sla_p95_ms, price_per_hour), encoding="utf-8")
    return figures


def _pinned(words: str, cpus: list[int] | None) -> str:
    return f" {words} {','.join(map(str, cpus))}" if cpus else ""


_CAPTIONS = {
    "curves": "Throughput vs p95 latency per variant, one point per load level (median run; whiskers: lowest-highest)",
    "max_throughput": "Max throughput per variant (the winner marked; whiskers: lowest-highest run)",
    "cost": "Cost per million inferences",
}


def _verdict_html(summary: dict[str, Any]) -> str:
    verdict = summary.get("verdict")
    if not verdict or not (summary.get("winner") or summary.get("best_median")):
        return ""
    decided = verdict.get("decided")
    color, word = ("#e6f4e6", "Decided") if decided else ("#fde2e1", "Too noisy to choose")
    return (f'<p style="background:{color};padding:.6em;border-radius:4px"><b>Verdict: {word}.</b> '
            f'{html.escape(str(verdict.get("why", "")))}</p>')


def _html(summary: dict[str, Any], rows: list[Row], figures: list[str], sla_p95_ms: float | None,
          price_per_hour: float | None) -> str:
    e = html.escape
    cols = columns(rows, sla_p95_ms is not None, price_per_hour is not None)
    head = "".join(f"<th>{e(h)}</th>" for _, h, _ in cols)
    winner = summary.get("winner")
    body = "".join(
        f"<tr{' class=winner' if r.variant == winner else ''}>"
        + "".join(f"<td>{e(cell(r, k, f))}</td>" for k, _, f in cols) + "</tr>" for r in rows)
    failed = "".join(f"<li><b>{e(r.variant)}</b>: <pre>{e(r.error)}</pre></li>" for r in rows if r.error)
    skipped = "".join(f"<li><b>{e(label)}</b>: {e(why)}</li>" for label, why in summary.get("skipped", []))
    images = "".join(f'<figure><img src="{name}.png" alt="{e(_CAPTIONS[name])}"><figcaption>{e(_CAPTIONS[name])}'
                     f' (data: <a href="{name}.csv">CSV</a>, <a href="{name}.json">JSON</a>)</figcaption></figure>'
                     for name in figures)
    notes = "".join(f"<li>{e(line)}</li>" for line in summary.get("notes", []))
    config = summary.get("winner_config") or ""
    no_config = "none: the verdict is undecided (see above)" if summary.get("best_median") and not config else "none"
    policy = summary.get("scaling_policy")
    scaling = (f"<h2>Scaling policy</h2><p>{e(summary.get('scaling_policy_basis', ''))}. Application Auto Scaling's "
               "<code>put_scaling_policy</code> request (<a href=\"scaling_policy.json\">scaling_policy.json</a>: "
               "<code>aws application-autoscaling put-scaling-policy --cli-input-json file://scaling_policy.json</code>"
               f"):</p><pre>{e(json.dumps(policy, indent=2))}</pre>") if policy else ""
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>naiad recommend: {e(summary['model'])}</title>
<style>
body {{ font-family: sans-serif; margin: 2em auto; padding: 0 1em; max-width: 76em; }}
.wide {{ overflow-x: auto; }}
table {{ border-collapse: collapse; font-size: .8em; }}
td, th {{ border: 1px solid #ccc; padding: .3em .5em; text-align: right; }}
th {{ white-space: normal; max-width: 7em; vertical-align: bottom; }} td {{ white-space: nowrap; }}
td:first-child {{ white-space: normal; min-width: 10em; }}
td:first-child, th:first-child {{ text-align: left; }} tr.winner {{ background: #e6f4e6; font-weight: bold; }}
pre {{ background: #f6f6f6; padding: .6em; overflow-x: auto; }} img {{ max-width: 100%; }}
</style></head><body>
<h1>naiad recommend: {e(summary['model'])}</h1>
<p><b>Recommendation:</b> {e(summary['reason'])}</p>
{_verdict_html(summary)}
<p>Server: <code>{e(summary['server'])}</code>{_pinned("on cores", summary.get("server_cpus"))}. Load:
{e(summary['protocol'])}, generator on the same machine ({summary['machine']['cpus']} CPUs)
{_pinned("on cores", summary.get("bench_cpus"))}. CPU and memory are the server's process tree (model processes
included), memory as proportional set size; CPU cores is CPU seconds per second over the whole run.</p>
<h2>Variants</h2>
<div class="wide"><table><tr>{head}</tr>{body}</table></div>
<p>Data: <a href="recommendations.csv">CSV</a>, <a href="recommendations.json">JSON</a>,
<a href="recommendations.md">Markdown</a>, <a href="summary.json">summary</a>, and Inference Recommender's
<a href="inference_recommendations.json">InferenceRecommendations</a> (its field names and units: MaxInvocations
where the curve levels off, CPU and memory in percent, cost per inference). The traffic pattern ran
{summary.get("repeats", 1)} time(s) on each variant: throughput is the median run's, beside the lowest and highest
run; p50 / p95 / p99 are at the level of max invocations of the median run; the SLA columns at the busiest level
whose p95 meets the SLA. {f"The winner is marked {WINNER_MARK} in every figure." if winner else
"No variant is marked: the verdict is undecided."}</p>
{f"<h3>Notes</h3><ul>{notes}</ul>" if notes else ""}
{f"<h3>Skipped</h3><ul>{skipped}</ul>" if skipped else ""}
{f"<h3>Failed</h3><ul>{failed}</ul>" if failed else ""}
<h2>Figures</h2>
{images}
{"" if price_per_hour is not None else "<p>No cost figure: no --price-per-hour given.</p>"}
<h2>Recommended config.pbtxt</h2>
<pre>{e(config) if config else no_config}</pre>
{scaling}
<h2>Traffic pattern</h2>
<pre>{e(json.dumps({"TrafficPattern": summary['traffic'], "StoppingConditions": summary['stopping']}, indent=2))}</pre>
</body></html>
"""
