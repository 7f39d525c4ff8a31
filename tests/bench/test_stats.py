"""perf_analyzer's arithmetic: percentile index, stability over the last 3 windows, merging windows, and the
server-side breakdown from /stats deltas."""

from __future__ import annotations

from naiad.bench.report import g
from naiad.bench.stats import ClientStats, PerfStatus, is_stable, merge, percentile_index, server_breakdown


def test_percentile_index_is_perf_analyzers() -> None:
    # index = p/100 * (n - 1) + 0.5, truncated
    assert [percentile_index(p, 10) for p in (50, 90, 95, 99)] == [5, 8, 9, 9]
    assert percentile_index(50, 1) == 0


def test_stability_needs_three_windows_within_the_threshold() -> None:
    assert not is_stable([100, 100], [5, 5], 0.1)
    assert is_stable([100, 105, 109], [5, 5.2, 5.4], 0.1)
    assert not is_stable([100, 105, 111], [5, 5, 5], 0.1)          # throughput max/min 1.11
    assert not is_stable([100, 100, 100], [5, 5, 5.6], 0.1)         # latency max/min 1.12
    assert is_stable([100, 100, 100], [5, 5, 5.6], 0.1, check_latency=False)
    assert not is_stable([0, 100, 100], [1, 1, 1], 10)               # a window without requests
    assert is_stable([50, 200, 100, 101, 102], [9, 1, 5, 5, 5], 0.1)   # only the last three count


def test_merge_pools_latencies_and_sums_counts() -> None:
    def window(latencies: list[int], seconds: float, success: int) -> PerfStatus:
        client = ClientStats(request_count=len(latencies), duration_ns=int(seconds * 1e9), latencies=latencies,
                             completed_count=len(latencies), avg_request_time_ns=1000)
        return PerfStatus(concurrency=2, batch_size=2, client=client,
                          server={"success_count": success, "success_ns": success * 4000})

    merged = merge([window([1000, 3000], 1.0, 2), window([2000, 4000, 5000], 1.5, 3)], -1)
    assert merged.client.latencies == [1000, 2000, 3000, 4000, 5000]
    assert merged.client.request_count == 5 and merged.client.avg_latency_ns == 3000
    assert merged.client.infer_per_sec == 5 * 2 / 2.5                  # requests x batch / seconds
    assert merged.client.percentile_latency_ns == {50: 3000, 90: 5000, 95: 5000, 99: 5000}
    assert merged.server == {"success_count": 5, "success_ns": 20000}
    assert merged.stabilizing_latency_ns == 3000
    assert merge([window([1000, 2000, 3000, 4000], 1, 4)], 85).stabilizing_latency_ns == 4000


def test_server_breakdown_as_perf_analyzer_prints_it() -> None:
    server = {"success_count": 10, "success_ns": 10 * 500_000, "queue_count": 10, "queue_ns": 10 * 100_000,
              "compute_input_count": 10, "compute_input_ns": 10 * 20_000, "compute_infer_count": 10,
              "compute_infer_ns": 10 * 300_000, "compute_output_count": 10, "compute_output_ns": 10 * 30_000}
    b = server_breakdown(server)
    assert (b["request"], b["queue"], b["compute_input"], b["compute_infer"], b["compute_output"]) == (
        500, 100, 20, 300, 30)
    assert b["overhead"] == 500 - 100 - 350
    assert server_breakdown({})["overhead"] == 0


def test_numbers_print_like_iostreams() -> None:
    assert [g(x) for x in (2584.8213, 130.0, 1234567.0, 0.5)] == ["2584.82", "130", "1.23457e+06", "0.5"]
