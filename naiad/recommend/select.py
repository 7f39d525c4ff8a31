"""The table's rows (one per variant) and the choice: the highest throughput whose p95 latency meets the SLA."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from naiad.bench.api import LoadResult
from naiad.recommend.sweep import Measured


@dataclass
class Row:
    variant: str                       # its label in the table
    backend: str
    kind: str
    slug: str
    status: str                        # "measured" | "failed"
    max_invocations_per_minute: float | None = None
    max_throughput: float | None = None        # inferences/s at the best level
    p50_ms: float | None = None                # latency at that throughput
    p95_ms: float | None = None
    p99_ms: float | None = None
    sla_throughput: float | None = None        # the best level whose p95 meets the SLA (None: none does)
    sla_invocations_per_minute: float | None = None
    sla_p95_ms: float | None = None
    min_p95_ms: float | None = None            # the lowest p95 at any level
    cpu_cores: float | None = None             # CPU seconds per second over the run, server tree
    cpu_percent: float | None = None           # of the machine's cores
    memory_mb_avg: float | None = None
    memory_mb_peak: float | None = None
    setup_s: float | None = None               # spawn to model ready
    load_duration_s: float | None = None       # server-reported nv_model_load_duration_secs
    cost_per_hour: float | None = None
    cost_per_million: float | None = None      # at max throughput
    sla_cost_per_million: float | None = None  # at the SLA throughput
    errors: int = 0
    stop_reason: str = ""
    error: str = ""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _ms(value: float | None) -> float | None:
    return None if value is None else value / 1000.0


def _per_million(price: float | None, throughput: float | None) -> float | None:
    if price is None or not throughput:
        return None
    return price / (throughput * 3600.0) * 1e6


def _per_minute(level: LoadResult) -> float:
    return level.requests / level.duration_s * 60 if level.duration_s else 0.0


def _best_level(levels: list[LoadResult], per_minute: float) -> LoadResult | None:
    """The level the bench counted as max invocations (with ModelLatencyThresholds, the best one within them)."""
    measured = [level for level in levels if level.requests]
    return min(measured, key=lambda level: abs(_per_minute(level) - per_minute)) if measured else None


def row(measured: Measured, sla_p95_ms: float | None, price_per_hour: float | None) -> Row:
    v = measured.variant
    r = Row(v.label, v.backend, v.kind, v.slug, "measured" if measured.ok else "failed", error=measured.error,
            setup_s=measured.setup_s, load_duration_s=measured.load_duration_s)
    traffic = measured.traffic
    if traffic is None or not measured.ok:
        return r
    best = _best_level(traffic.levels, traffic.max_invocations_per_minute)
    latency = traffic.latency_at_max_us or (best.latency_us if best else {})
    r.max_invocations_per_minute = traffic.max_invocations_per_minute
    r.max_throughput = best.throughput if best else 0.0
    r.p50_ms, r.p95_ms, r.p99_ms = (_ms(latency.get(k)) for k in ("p50", "p95", "p99"))
    r.errors = sum(level.errors for level in traffic.levels)
    r.stop_reason = traffic.stop_reason
    p95s = [lv.latency_us["p95"] / 1000.0 for lv in traffic.levels if lv.requests and "p95" in lv.latency_us]
    r.min_p95_ms = min(p95s) if p95s else None
    if sla_p95_ms is not None:
        within = [lv for lv in traffic.levels if lv.requests and lv.latency_us.get("p95", float("inf")) / 1000.0
                  <= sla_p95_ms]
        if within:
            top = max(within, key=lambda lv: lv.throughput)
            r.sla_throughput, r.sla_p95_ms = top.throughput, top.latency_us["p95"] / 1000.0
            r.sla_invocations_per_minute = _per_minute(top)
    if measured.usage is not None:
        u = measured.usage
        r.cpu_cores, r.cpu_percent = u.cpu_cores_avg, u.cpu_percent
        r.memory_mb_avg, r.memory_mb_peak = u.memory_mb_avg, u.memory_mb_peak
    if price_per_hour is not None:
        r.cost_per_hour = price_per_hour   # one server per instance: the instance's price
        r.cost_per_million = _per_million(price_per_hour, r.max_throughput)
        r.sla_cost_per_million = _per_million(price_per_hour, r.sla_throughput)
    return r


def choose(rows: list[Row], sla_p95_ms: float | None) -> tuple[Row | None, str]:
    """The winner and a sentence saying why (or why there is none)."""
    measured = [r for r in rows if r.status == "measured" and r.max_throughput]
    if not measured:
        return None, "no variant could be measured"
    if sla_p95_ms is None:
        best = max(measured, key=lambda r: (r.max_throughput or 0.0, -(r.p95_ms or 0.0)))
        return best, (f"{best.variant}: the highest throughput, {best.max_throughput:.1f} inferences/s "
                      f"(p95 {best.p95_ms:.2f} ms; no SLA given)")
    within = [r for r in measured if r.sla_throughput]
    if not within:
        fastest = min(measured, key=lambda r: r.min_p95_ms if r.min_p95_ms is not None else float("inf"))
        return None, (f"no variant meets the SLA p95 <= {sla_p95_ms:g} ms at any load level measured (the lowest "
                      f"p95 was {fastest.min_p95_ms or float('nan'):.2f} ms, {fastest.variant}): no config.pbtxt "
                      f"written; try a lighter traffic pattern or a larger instance")
    best = max(within, key=lambda r: (r.sla_throughput or 0.0, -(r.sla_p95_ms or 0.0)))
    return best, (f"{best.variant}: the highest throughput whose p95 meets the SLA (<= {sla_p95_ms:g} ms): "
                  f"{best.sla_throughput:.1f} inferences/s at p95 {best.sla_p95_ms:.2f} ms")


# Below these shares the measurement may say more about the generator (or the machine) than about the server.
NEAR_CEILING = 0.7
BUSY_SERVER = 0.7


def notes(rows: list[Row], generator_ceiling: float | None, server_cpus: set[int] | None) -> list[str]:
    """Warnings about what may have limited the numbers other than the variant itself."""
    out = []
    if generator_ceiling:
        near = [r.variant for r in rows if r.max_invocations_per_minute
                and r.max_invocations_per_minute / 60 >= NEAR_CEILING * generator_ceiling]
        if near:
            out.append(f"{', '.join(near)}: within {100 - NEAR_CEILING * 100:.0f} % of the load generator's own "
                       f"ceiling ({generator_ceiling:.0f} requests/s on the server's cheapest route): the generator "
                       f"may have limited these; give it more cores (--bench-cpus, --bench-processes)")
    if server_cpus:
        idle = [f"{r.variant} ({r.cpu_cores:.2f})" for r in rows if r.cpu_cores is not None
                and r.cpu_cores < BUSY_SERVER * len(server_cpus)]
        if idle:
            out.append(f"the server used less than {BUSY_SERVER * 100:.0f} % of its {len(server_cpus)} pinned "
                       f"core(s) in {', '.join(idle)}: the load generator or other work on the machine may have "
                       f"limited throughput, not the server")
    return out

