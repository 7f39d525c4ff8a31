"""The table's rows (one per variant) and the choice: the highest throughput whose p95 latency meets the SLA."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from naiad.bench.api import LoadResult, TrafficResult
from naiad.bench.traffic import FLAT_GAIN
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
    runs: int = 0                              # repeats of the traffic pattern measured
    max_throughput_low: float | None = None    # the spread of max_throughput (the median) over the runs
    max_throughput_high: float | None = None
    sla_throughput_low: float | None = None    # the same within the SLA (a run with no level within it: 0)
    sla_throughput_high: float | None = None
    sla_runs_met: int = 0                      # runs with a level within the SLA
    sla_throughput_low_met: float | None = None  # the lowest of those runs' (the spread shown)
    generator_cpu_cores: float | None = None   # the load generator's CPU over the runs (this process included)
    generator_processes: int = 0
    machine_cpu_cores: float | None = None     # every process on the machine over the runs
    metrics: dict[str, Any] | None = None      # Inference Recommender's RecommendationMetrics (see ir_metrics)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def spread(self) -> str:
        """The lowest and highest run's max throughput, inferences/s."""
        return _range(self.max_throughput_low, self.max_throughput_high, self.runs)

    @property
    def sla_spread(self) -> str:
        """The same within the SLA, over the runs that had a level within it; how many did when not all (a run
        with none counts 0 in ``sla_throughput_low``, which the verdict reads, not in the range shown)."""
        if self.runs < 2 or self.sla_throughput_high is None:
            return ""
        if not self.sla_runs_met:
            return "no run"
        shown = _range(self.sla_throughput_low_met, self.sla_throughput_high, self.runs)
        return shown if self.sla_runs_met == self.runs else f"{shown} ({self.sla_runs_met} of {self.runs} runs)"


def _range(low: float | None, high: float | None, runs: int) -> str:
    return "" if low is None or high is None or runs < 2 else f"{low:.0f}-{high:.0f}"


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


def _run_best(run: TrafficResult, sla_p95_ms: float | None) -> float:
    """A run's best throughput (within the SLA when one is given; 0 when no level meets it)."""
    levels = [lv for lv in run.levels if lv.requests]
    if sla_p95_ms is not None:
        levels = [lv for lv in levels if lv.latency_us.get("p95", float("inf")) / 1000.0 <= sla_p95_ms]
    return max((lv.throughput for lv in levels), default=0.0)


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def plateau(levels: list[LoadResult]) -> LoadResult | None:
    """Where the invocations curve levels off, as Inference Recommender reads its results: the first level (in
    the order the load rose) within FLAT_GAIN of the best throughput."""
    measured = [lv for lv in levels if lv.requests]
    if not measured:
        return None
    top = max(lv.throughput for lv in measured)
    return next(lv for lv in measured if lv.throughput >= (1 - FLAT_GAIN) * top)


def ir_metrics(measured: Measured, price_per_hour: float | None) -> dict[str, Any] | None:
    """SageMaker's RecommendationMetrics for a variant, in its units: MaxInvocations (requests per minute, at
    the level where the curve levels off), ModelLatency (ms, average there), CpuUtilization and MemoryUtilization
    (percent, there; CPU as CloudWatch counts it: 100 per busy core), CostPerHour and CostPerInference (USD),
    ModelSetupTime (seconds, spawn to ready)."""
    traffic = measured.traffic
    level = plateau(traffic.levels) if traffic is not None else None
    if level is None:
        return None
    per_minute = _per_minute(level)
    cores, memory_mb = (measured.usage.between(level.start_ns, level.end_ns) if measured.usage and level.end_ns
                        else (None, None))
    if cores is None and measured.usage is not None:
        cores, memory_mb = measured.usage.cpu_cores_avg, measured.usage.memory_mb_avg
    import psutil

    total_mb = psutil.virtual_memory().total / 2**20
    return {
        "MaxInvocations": int(round(per_minute)),
        "ModelLatency": int(round(level.latency_us.get("avg", 0.0) / 1000.0)),
        # (SageMaker's NaN, "not available", is null here: JSON has no NaN)
        "CpuUtilization": round(100.0 * cores, 2) if cores is not None else None,
        "MemoryUtilization": round(100.0 * memory_mb / total_mb, 3) if memory_mb is not None else None,
        "CostPerHour": price_per_hour,
        "CostPerInference": (price_per_hour / (per_minute * 60.0) if price_per_hour is not None and per_minute
                             else None),
        "ModelSetupTime": int(round(measured.setup_s)) if measured.setup_s is not None else None,
    }


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
    runs = measured.runs or [traffic]
    bests = [_run_best(run, None) for run in runs]
    r.runs = len(runs)
    r.max_throughput = _median(bests) if len(runs) > 1 else (best.throughput if best else 0.0)
    r.max_throughput_low, r.max_throughput_high = min(bests), max(bests)
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
        sla_bests = [_run_best(run, sla_p95_ms) for run in runs]
        r.sla_throughput_low, r.sla_throughput_high = min(sla_bests), max(sla_bests)
        met = [best for best in sla_bests if best > 0]
        r.sla_runs_met, r.sla_throughput_low_met = len(met), min(met, default=None)
        if len(runs) > 1 and within:
            r.sla_throughput = _median(sla_bests) or top.throughput
            r.sla_invocations_per_minute = r.sla_throughput * 60   # recommend sends batch 1
    if measured.usage is not None:
        u = measured.usage
        r.cpu_cores, r.cpu_percent = u.cpu_cores_avg, u.cpu_percent
        r.memory_mb_avg, r.memory_mb_peak = u.memory_mb_avg, u.memory_mb_peak
    if measured.generator_usage is not None:
        r.generator_cpu_cores = measured.generator_usage.cpu_cores_avg
        r.machine_cpu_cores = measured.generator_usage.machine_cores_avg
    r.generator_processes = measured.generator_processes
    r.metrics = ir_metrics(measured, price_per_hour)
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



# The generator, not the server, set the pace: the server used under this much of a core (or of its pinned
# cores) while the generator's processes were this busy.
IDLE_SERVER = 0.5
SATURATED_GENERATOR = 0.7
# Other work on the machine (beyond the server and the generator) worth naming, in cores.
BUSY_MACHINE = 0.5


def limits(rows: list[Row], server_cpus: set[int] | None) -> tuple[bool, list[str]]:
    """Whether the load generator limited any variant (its numbers then compare generators, not configs), and
    sentences saying what limited what."""
    out = []
    limited = False
    budget = len(server_cpus) if server_cpus else 1
    for r in rows:
        if r.cpu_cores is None or r.generator_cpu_cores is None or r.status != "measured":
            continue
        if r.cpu_cores >= IDLE_SERVER * budget:
            continue
        others = max(0.0, (r.machine_cpu_cores or 0.0) - r.cpu_cores - r.generator_cpu_cores)
        if r.generator_processes and r.generator_cpu_cores >= SATURATED_GENERATOR * r.generator_processes:
            limited = True
            out.append(f"{r.variant}: the load generator was the limit, not the server: the server used "
                       f"{r.cpu_cores:.2f} of {budget} core(s) while the generator's {r.generator_processes} "
                       f"process(es) used {r.generator_cpu_cores:.2f} cores; give the generator more cores "
                       f"(--bench-cpus, --bench-processes) or pin the server apart (--server-cpus)")
        elif others >= BUSY_MACHINE:
            out.append(f"{r.variant}: the machine was busy with other work ({others:.2f} cores beside the server's "
                       f"{r.cpu_cores:.2f} and the generator's {r.generator_cpu_cores:.2f}): its numbers say more "
                       f"about the machine than about the variant")
    return limited, out


def verdict(rows: list[Row], winner: Row | None, sla_p95_ms: float | None,
            generator_limited: bool) -> tuple[bool, str]:
    """(decided, why): whether the winner beat every other variant in every run, so noise cannot have chosen it."""
    if winner is None:
        return False, "no winner"
    if generator_limited:
        return False, ("too noisy to choose: the load generator, not the server, limited the throughput, so the "
                       "variants were not compared (see the notes); what would decide it: the server and the "
                       "generator on cores of their own (--server-cpus, --bench-cpus), or more --bench-processes")
    low_key, high_key = (("sla_throughput_low", "sla_throughput_high") if sla_p95_ms is not None
                         else ("max_throughput_low", "max_throughput_high"))
    low = getattr(winner, low_key)
    rivals = [r for r in rows if r is not winner and r.status == "measured" and getattr(r, high_key) is not None]
    if low is None or not rivals:
        return True, f"{winner.variant}: the only variant measured"
    if winner.runs < 2:
        return True, (f"{winner.variant} ahead in the one run measured: no spread known (--repeats 3 measures "
                      "it)")
    rival = max(rivals, key=lambda r: getattr(r, high_key))
    high = getattr(rival, high_key)
    runs = winner.runs
    if high >= low:
        return False, (f"too noisy to choose: {winner.variant} ({low:.0f}-{getattr(winner, high_key):.0f} "
                       f"inferences/s over {runs} run(s)) and {rival.variant} ({getattr(rival, low_key):.0f}-"
                       f"{high:.0f}) overlap; rerun on a quieter machine, with longer steps, or more --repeats")
    return True, (f"{winner.variant} ahead in every run: its slowest of {runs} run(s), {low:.0f} inferences/s, beat "
                  f"the fastest run of any other variant ({rival.variant}, {high:.0f})")
