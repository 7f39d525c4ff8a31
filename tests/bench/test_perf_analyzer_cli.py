"""``naiad bench`` where scripts written for perf_analyzer 2.51 meet it: exit code 99 for option errors, the flags
they carry (--version, --profile-export-file, --grpc-compression-algorithm, --request-intervals, the sequence and
TLS families), Client Send measured, partial results written when a level is not stable, the
``naiad-perf-analyzer`` executable."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
import re
from pathlib import Path

import pytest

from tests.server import ROOT, RunningServer


def bench(*args: str, timeout: float = 60, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "naiad", "bench", "--processes", "1", "--no-progress", *args],
                          capture_output=True, text=True, cwd=cwd, timeout=timeout,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})


def test_option_errors_exit_99_and_version_exits_0() -> None:
    # perf_analyzer 2.51: "unrecognized option" and "Failed to parse" both exit 99; 2 means "unstable" to scripts
    for argv in (["-m", "x", "--bogus"], ["-m", "x", "--concurrency-range", "a"], ["-m", "x", "-p", "0"],
                 ["-m", "x", "--async", "--sync"]):
        run = bench(*argv)
        assert run.returncode == 99, (argv, run.stderr)
    version = bench("--version")
    assert version.returncode == 0 and "perf_analyzer 2.51.0" in version.stdout


def test_help_shows_the_defaults_of_p_s_r() -> None:
    text = " ".join(bench("--help").stdout.split())
    assert "time window of each measurement (default: 5000)" in text
    assert "in percent (default: 10.0)" in text
    assert "maximum windows per level (default: 10)" in text


def test_accepted_families_and_their_refusals(bench_server: RunningServer) -> None:
    url = bench_server.url
    run = bench("-m", "add_sub", "-u", url, "--grpc-compression-algorithm", "gzip")
    assert run.returncode == 99 and "Using compression algorithm is only allowed with gRPC protocol." in run.stderr
    run = bench("-m", "add_sub", "-u", bench_server.grpc_url, "-i", "grpc", "--ssl-grpc-use-ssl")
    assert run.returncode == 99 and "not TLS" in run.stderr
    run = bench("-m", "add_sub", "-u", f"https://{url}")
    assert run.returncode == 99 and "not TLS" in run.stderr
    run = bench("-m", "add_sub", "-u", url, "--request-intervals", "/no/such/file")
    assert run.returncode == 99 and "The value must be a valid file path" in run.stderr
    run = bench("-m", "add_sub", "-u", url, "--request-intervals", __file__, "--concurrency-range", "2")
    assert run.returncode == 99 and "Cannot specify more then one inference load mode" in run.stderr
    # the sequence family is accepted, and a sequence model is refused with what to do
    run = bench("-m", "seq", "-u", url, "--sequence-length", "5", "--num-of-sequences", "2", "--serial-sequences")
    assert run.returncode == 99 and "uses the sequence batcher" in run.stderr and "perf_analyzer" in run.stderr
    # TLS flags without TLS in use (perf_analyzer's defaults, as scripts pass them) change nothing
    run = bench("-m", "add_sub", "-u", url, "--ssl-https-verify-peer", "1", "--ssl-https-verify-host", "2",
                "-p", "150", "-s", "1000", "--no-generator-ceiling")
    assert run.returncode == 0, run.stderr


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_client_send_is_measured(bench_server: RunningServer, protocol: str, tmp_path: Path) -> None:
    url = bench_server.grpc_url if protocol == "grpc" else bench_server.url
    out = tmp_path / "out.csv"
    run = bench("-m", "add_sub", "-u", url, "-i", protocol, "-p", "200", "-s", "1000", "-f", str(out),
                "--no-generator-ceiling")
    assert run.returncode == 0, run.stderr
    row = next(csv.DictReader(out.open()))
    # the prepared request's write: microseconds, never more than the whole request
    assert 0 < int(row["Client Send"]) < int(row["p50 latency"]) + 1


def test_grpc_compression_runs(bench_server: RunningServer, tmp_path: Path) -> None:
    out = tmp_path / "gz.csv"
    run = bench("-m", "add_sub", "-u", bench_server.grpc_url, "-i", "grpc", "--grpc-compression-algorithm", "gzip",
                "-p", "150", "-s", "1000", "-f", str(out), "--no-generator-ceiling")
    assert run.returncode == 0, run.stderr
    assert float(next(csv.DictReader(out.open()))["Inferences/Second"]) > 0


def test_an_unstable_level_is_written_with_its_reason(bench_server: RunningServer, tmp_path: Path) -> None:
    out = tmp_path / "partial.csv"
    # -s 0: no two windows are ever equal, so the level cannot be stable
    run = bench("-m", "add_sub", "-u", bench_server.url, "-p", "100", "-s", "0", "-r", "3", "-f", str(out),
                "--no-generator-ceiling")
    assert run.returncode == 2, run.stderr   # perf_analyzer's code for it, still
    assert "Failed to obtain stable measurement" in run.stderr
    # stdout does not end at the level's heading: the reason follows it there too
    after = run.stdout.split("Request concurrency: 1\n", 1)[1]
    assert "Stopped: Failed to obtain stable measurement within 3 measurement windows" in after, run.stdout
    assert f"Partial results written to {out}" in run.stderr
    rows = list(csv.DictReader(out.open()))
    assert len(rows) == 1 and rows[0]["Stable"] == "0"
    assert "not stable after 3 window(s)" in rows[0]["Note"] and "-s allows 0 %" in rows[0]["Note"]
    assert float(rows[0]["Inferences/Second"]) > 0


def test_request_intervals_set_the_schedule(bench_server: RunningServer, tmp_path: Path) -> None:
    intervals = tmp_path / "intervals.txt"
    intervals.write_text("5000\n15000\n")   # 2 requests per 20 ms: 100 requests/s on average
    out = tmp_path / "iv.csv"
    run = bench("-m", "add_sub", "-u", bench_server.url, "--request-intervals", str(intervals), "-p", "500",
                "-s", "1000", "-f", str(out), "--no-generator-ceiling")
    assert run.returncode == 0, run.stderr
    row = next(csv.DictReader(out.open()))
    assert float(row["Request Rate"]) == pytest.approx(100)
    assert 80 < float(row["Inferences/Second"]) < 120


def test_profile_export_file(bench_server: RunningServer, tmp_path: Path) -> None:
    export = tmp_path / "export.json"
    run = bench("-m", "add_sub", "-u", bench_server.url, "--concurrency-range", "1:2", "-p", "150", "-s", "1000",
                "--profile-export-file", str(export), "--no-generator-ceiling")
    assert run.returncode == 0, run.stderr
    document = json.loads(export.read_text())
    assert document["version"] == "2.51.0" and document["service_kind"] == "triton"
    assert [e["experiment"] for e in document["experiments"]] == [{"mode": "concurrency", "value": 1},
                                                                   {"mode": "concurrency", "value": 2}]
    for experiment in document["experiments"]:
        requests = experiment["requests"]
        bounds = experiment["window_boundaries"]
        assert len(requests) > 3 and len(bounds) >= 4   # at least 3 windows
        assert all(r["timestamp"] < r["response_timestamps"][0] for r in requests)
        assert all(bounds[0] <= r["response_timestamps"][0] <= bounds[-1] for r in requests)


def test_naiad_perf_analyzer_executable(bench_server: RunningServer, tmp_path: Path) -> None:
    # (pyproject's [project.scripts] line, read without tomllib, which Python 3.10 lacks)
    entry = re.search(r'^naiad-perf-analyzer = "([^"]+)"$', (ROOT / "pyproject.toml").read_text(), re.M)
    assert entry is not None
    module, _, function = entry.group(1).partition(":")
    # what the installed script runs, from a folder holding nothing of naiad's
    line = f"import sys; from {module} import {function}; sys.exit({function}())"
    out = tmp_path / "pa.csv"
    run = subprocess.run([sys.executable, "-c", line, "-m", "add_sub", "-u", bench_server.url, "-p", "150",
                          "-s", "1000", "-f", str(out), "--processes", "1", "--no-progress",
                          "--no-generator-ceiling"],
                         capture_output=True, text=True, cwd=tmp_path, timeout=60,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert run.returncode == 0, run.stderr
    assert "Request concurrency: 1" in run.stdout and out.read_text().startswith("Concurrency,")
    bad = subprocess.run([sys.executable, "-c", line, "--bogus"], capture_output=True, text=True,
                         cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert bad.returncode == 99 and "naiad-perf-analyzer" in bad.stderr
