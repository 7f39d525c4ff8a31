"""``naiad bench`` as perf_analyzer's command line: its report layout, its CSV columns exactly, its exit codes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from naiad.bench.report import csv_header
from tests.server import ROOT, RunningServer

# report_writer.cc's columns for a model without response cache or decoupling, with server statistics.
PERF_ANALYZER_COLUMNS = ("Concurrency,Inferences/Second,Client Send,Network+Server Send/Recv,Server Queue,"
                         "Server Compute Input,Server Compute Infer,Server Compute Output,Client Recv,"
                         "p50 latency,p90 latency,p95 latency,p99 latency")


def bench(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "naiad", "bench", "--processes", "1", "--no-progress", *args],
                          capture_output=True, text=True, cwd=ROOT, timeout=timeout)


def test_csv_header_variants() -> None:
    base = dict(concurrency_mode=True, decoupled=False, server_stats=True, cache=False, percentiles=[50, 90, 95, 99],
                verbose_csv=False, percentile=-1, metrics=False)
    assert ",".join(csv_header(**base)) == PERF_ANALYZER_COLUMNS
    assert csv_header(**{**base, "concurrency_mode": False})[0] == "Request Rate"
    assert csv_header(**{**base, "decoupled": True})[1:3] == ["Inferences/Second", "Response Throughput"]
    assert "Server Cache Hit,Server Cache Miss,Client Recv" in ",".join(csv_header(**{**base, "cache": True}))
    assert ",".join(csv_header(**{**base, "verbose_csv": True})).endswith(
        "p99 latency,Avg latency,request/response,response wait")
    assert ",".join(csv_header(**{**base, "verbose_csv": True, "percentile": 85,
                                  "percentiles": [50, 85, 90, 95, 99], "metrics": True})).endswith(
        "p50 latency,p85 latency,p90 latency,p95 latency,p99 latency,request/response,response wait,"
        "Avg GPU Utilization,Avg GPU Power Usage,Max GPU Memory Usage,Total GPU Memory")
    assert csv_header(**{**base, "server_stats": False}) == [
        "Concurrency", "Inferences/Second", "Client Send", "Client Recv", "p50 latency", "p90 latency",
        "p95 latency", "p99 latency"]


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_sweep_report_and_csv(bench_server: RunningServer, protocol: str, tmp_path: Path) -> None:
    url = bench_server.grpc_url if protocol == "grpc" else bench_server.url
    csv = tmp_path / "out.csv"
    run = bench("-m", "add_sub", "-u", url, "-i", protocol, "--concurrency-range", "1:2", "-p", "150", "-s", "1000",
                "-f", str(csv), "--no-generator-ceiling")
    assert run.returncode == 0, run.stderr
    out = run.stdout
    assert out.startswith("*** Measurement Settings ***\n  Batch size: 1\n")
    for line in ("Request concurrency: 1\n  Client: \n    Request count: ", "Request concurrency: 2\n",
                 "  Server: \n    Inference count: ", "    Avg request latency: ",
                 f"    Avg {'gRPC' if protocol == 'grpc' else 'HTTP'} time: ",
                 "Inferences/Second vs. Client Average Batch Latency\nConcurrency: 1, throughput: "):
        assert line in out
    rows = csv.read_text().splitlines()
    assert rows[0] == PERF_ANALYZER_COLUMNS
    assert len(rows) == 3
    throughputs = [float(row.split(",")[1]) for row in rows[1:]]
    assert throughputs == sorted(throughputs)        # perf_analyzer sorts rows by throughput
    for row in rows[1:]:
        p50, p90, p95, p99 = (int(x) for x in row.split(",")[-4:])
        assert 0 < p50 <= p90 <= p95 <= p99


def test_request_rate_verbose_csv_and_percentile(bench_server: RunningServer, tmp_path: Path) -> None:
    csv = tmp_path / "rate.csv"
    run = bench("-m", "add_sub", "-u", bench_server.url, "--request-rate-range", "50", "-p", "300", "-s", "1000",
                "--percentile", "95", "-f", str(csv), "--verbose-csv", "--no-generator-ceiling")
    assert run.returncode == 0, run.stderr
    assert "Request Rate: 50 inference requests per second" in run.stdout
    assert "Inferences/Second vs. Client p95 Batch Latency\nRequest Rate: 50, throughput: " in run.stdout
    assert "Avg latency" not in run.stdout.split("Request Rate: 50 inference")[1]
    header = csv.read_text().splitlines()[0]
    assert header == PERF_ANALYZER_COLUMNS.replace("Concurrency", "Request Rate") + ",request/response,response wait"


def test_traffic_file(bench_server: RunningServer, tmp_path: Path) -> None:
    pattern = tmp_path / "phases.json"
    pattern.write_text(json.dumps({
        "TrafficPattern": {"TrafficType": "PHASES",
                           "Phases": [{"InitialNumberOfUsers": 1, "SpawnRate": 0, "DurationInSeconds": 1}]},
        "StoppingConditions": {"MaxInvocations": 100000000}}))
    run = bench("-m", "add_sub", "-u", bench_server.url, "--traffic", str(pattern))
    assert run.returncode == 0, run.stderr
    assert "phase 1: 1 users for 1 s" in run.stdout
    assert "Stop reason: completed" in run.stdout
    assert "Max invocations: " in run.stdout


def test_option_errors_are_perf_analyzers(capsys: pytest.CaptureFixture[str]) -> None:
    from naiad.bench.cli import main

    for argv, code, message in (
            (["--async", "--sync"], 99, "Cannot specify --async and --sync simultaneously."),
            (["--concurrency-range", "1:0"], 99,
             "The end of the search range and the latency limit can not be both 0 (or 0.0) simultaneously"),
            (["--streaming"], 99, "Streaming is only allowed with gRPC protocol and Triton C API."),
            (["--binary-search", "--concurrency-range", "1:4"], 99,
             "The --latency-threshold cannot be 0 for binary search mode."),
            (["--percentile", "100"], 99, "Failed to parse --percentile."),
    ):
        assert main(["-m", "add_sub", *argv]) == code
        assert message in capsys.readouterr().err


def test_unreachable_server(capsys: pytest.CaptureFixture[str]) -> None:
    from naiad.bench.cli import main
    from tests.server import free_port

    assert main(["-m", "add_sub", "-u", f"127.0.0.1:{free_port()}", "--no-progress"]) == 99
    assert capsys.readouterr().err.startswith("error: ")


def test_binary_search_and_verbose_passes(bench_server: RunningServer) -> None:
    # slow: one instance, 5 ms a request, so latency is ~5 ms x concurrency: 1 and 2 meet 15 ms, 4 and 8 do not.
    run = bench("-m", "slow", "-u", bench_server.url, "--concurrency-range", "1:8:1", "--binary-search", "-l", "15",
                "-p", "150", "-s", "1000", "-v", "--measurement-mode", "count_windows",
                "--measurement-request-count", "20", "--no-generator-ceiling")
    assert run.returncode == 0, run.stderr
    assert "  Using Binary Search algorithm\n" in run.stdout
    assert "  Minimum number of samples in each window: 20\n" in run.stdout
    visited = [int(line.split(": ")[1]) for line in run.stdout.splitlines() if line.startswith("Request concurrency")]
    assert visited[:4] == [1, 8, 4, 2]
    assert "  Pass [1] throughput: " in run.stdout
    assert "Measured latency went over the set limit of 15 msec." in run.stderr
