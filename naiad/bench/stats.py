"""perf_analyzer's numbers: a window's client statistics from its request records, the server's from /stats
deltas, the merge of the last stable windows, and the stability rule (the last 3 windows' throughput and
latency each within max/min <= 1 + stability threshold)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

STABILITY_WINDOW = 3
BASE_PERCENTILES = (50, 90, 95, 99)


@dataclass
class ClientStats:
    request_count: int = 0
    delayed_request_count: int = 0
    response_count: int = 0
    duration_ns: int = 0
    latencies: list[int] = field(default_factory=list, repr=False)   # sorted, ns
    avg_latency_ns: int = 0
    std_us: int = 0
    percentile_latency_ns: dict[int, int] = field(default_factory=dict)
    completed_count: int = 0
    avg_request_time_ns: int = 0
    avg_send_time_ns: int = 0
    avg_receive_time_ns: int = 0
    infer_per_sec: float = 0.0
    responses_per_sec: float = 0.0
    errors: int = 0


@dataclass
class PerfStatus:
    concurrency: int = 0
    request_rate: float = 0.0
    batch_size: int = 1
    client: ClientStats = field(default_factory=ClientStats)
    server: dict[str, int] = field(default_factory=dict)           # the model's counter deltas
    composing: dict[str, dict[str, int]] = field(default_factory=dict)   # an ensemble's steps
    stabilizing_latency_ns: int = 0
    send_request_rate: float = 0.0
    metrics: dict[str, dict[str, float]] = field(default_factory=dict)   # --collect-metrics
    error: str | None = None
    stable: bool = False
    note: str = ""                 # why a level is reported although not stable
    requests: list[tuple[int, int]] = field(default_factory=list, repr=False)   # (start, end) ns, when kept
    windows: list[int] = field(default_factory=list)   # measurement window boundaries, ns


def percentile_index(p: float, n: int) -> int:
    return int((p / 100.0) * (n - 1) + 0.5)


def summarize_latency(status: PerfStatus, percentile: int) -> None:
    latencies = status.client.latencies
    if not latencies:
        status.error = "No valid requests recorded within time interval. Please use a larger time window."
        return
    n = len(latencies)
    avg = sum(latencies) // n
    status.client.avg_latency_ns = avg
    if n > 1:
        status.client.std_us = int(math.sqrt(sum((x - avg) ** 2 for x in latencies) / (n - 1)) / 1000)
    else:
        status.client.std_us = 2 ** 64 - 1
    wanted = set(BASE_PERCENTILES)
    if percentile != -1:
        wanted.add(percentile)
    status.client.percentile_latency_ns = {p: latencies[percentile_index(p, n)] for p in sorted(wanted)}
    status.stabilizing_latency_ns = (status.client.percentile_latency_ns[percentile] if percentile != -1
                                     else avg)


def rates(status: PerfStatus) -> None:
    seconds = status.client.duration_ns / 1e9
    if seconds > 0:
        status.client.infer_per_sec = status.client.request_count * status.batch_size / seconds
        status.client.responses_per_sec = status.client.response_count / seconds


def merge(statuses: list[PerfStatus], percentile: int) -> PerfStatus:
    """perf_analyzer's MergePerfStatusReports: counts and durations summed, latencies pooled, library times
    weighted by completed requests, server counters summed."""
    first = statuses[0]
    out = PerfStatus(concurrency=first.concurrency, request_rate=first.request_rate, batch_size=first.batch_size)
    client = out.client
    request_time = send_time = receive_time = 0
    for status in statuses:
        c = status.client
        client.request_count += c.request_count
        client.delayed_request_count += c.delayed_request_count
        client.response_count += c.response_count
        client.duration_ns += c.duration_ns
        client.latencies.extend(c.latencies)
        client.completed_count += c.completed_count
        client.errors += c.errors
        request_time += c.avg_request_time_ns * c.completed_count
        send_time += c.avg_send_time_ns * c.completed_count
        receive_time += c.avg_receive_time_ns * c.completed_count
        out.send_request_rate += status.send_request_rate / len(statuses)
        for key, value in status.server.items():
            out.server[key] = out.server.get(key, 0) + value
        for name, counters in status.composing.items():
            merged = out.composing.setdefault(name, {})
            for key, value in counters.items():
                merged[key] = merged.get(key, 0) + value
    if client.completed_count:
        client.avg_request_time_ns = request_time // client.completed_count
        client.avg_send_time_ns = send_time // client.completed_count
        client.avg_receive_time_ns = receive_time // client.completed_count
    client.latencies.sort()
    rates(out)
    summarize_latency(out, percentile)
    return out


def is_stable(throughputs: list[float], latencies: list[float], threshold: float, check_latency: bool = True) -> bool:
    if len(throughputs) < STABILITY_WINDOW:
        return False
    ips = throughputs[-STABILITY_WINDOW:]
    lat = latencies[-STABILITY_WINDOW:]
    if any(x == 0 for x in ips):
        return False
    if max(ips) / min(ips) > 1 + threshold:
        return False
    if check_latency and (min(lat) == 0 or max(lat) / min(lat) > 1 + threshold):
        return False
    return True


# --- server side, as perf_analyzer derives it ----------------------------------------------------------------

def average_us(total_ns: int, count: int) -> int:
    return total_ns // (count * 1000) if count else 0


def server_breakdown(server: dict[str, int]) -> dict[str, int]:
    """Per-request averages in usec: request latency split into overhead + queue + compute input/infer/output
    (cache hit/miss too), as perf_analyzer prints them."""
    count = server.get("success_count", 0)
    compute_count = server.get("compute_input_count", 0)
    compute_ns = (server.get("compute_input_ns", 0) + server.get("compute_infer_ns", 0)
                  + server.get("compute_output_ns", 0))
    out = {
        "request": average_us(server.get("success_ns", 0), count),
        "queue": average_us(server.get("queue_ns", 0), server.get("queue_count", 0)),
        "compute_input": average_us(server.get("compute_input_ns", 0), compute_count),
        "compute_infer": average_us(server.get("compute_infer_ns", 0), server.get("compute_infer_count", 0)),
        "compute_output": average_us(server.get("compute_output_ns", 0), server.get("compute_output_count", 0)),
        "compute": average_us(compute_ns, compute_count),
        "cache_hit": average_us(server.get("cache_hit_ns", 0), server.get("cache_hit_count", 0)),
        "cache_miss": average_us(server.get("cache_miss_ns", 0), server.get("cache_miss_count", 0)),
        "combined_cache_compute": average_us(
            server.get("cache_hit_ns", 0) + server.get("cache_miss_ns", 0) + compute_ns,
            compute_count + server.get("cache_hit_count", 0)),
    }
    out["overhead"] = max(0, out["request"] - out["queue"] - out["compute"])
    out["overhead_cache"] = max(0, out["request"] - out["queue"] - out["combined_cache_compute"])
    return out
