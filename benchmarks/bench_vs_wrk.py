#!/usr/bin/env python3
"""naiad bench against wrk (HTTP) and h2load (gRPC): same server, same endpoint, same request bytes, same
connection counts, one after the other.

The server (naiad serving the example add_sub) is pinned to one core (--server-cpu, default 1); every load
generator is pinned to the other (--load-cpu, default 0), naiad bench with one worker process there. Two
endpoints per protocol:

  add_sub infer         the server is the bottleneck: naiad bench must match wrk / h2load within 10 %
  health (live)         nearly free for the server: the generators' own ceilings, side by side

The infer body is the one naiad bench sends (binary tensor extension over HTTP; a raw_input_contents
ModelInferRequest over gRPC), written to a file that wrk (through a Lua script) and h2load (-d) send as is.

    python3 benchmarks/bench_vs_wrk.py                    # c = 1, 8, 32; 5 s per run
    python3 benchmarks/bench_vs_wrk.py --connections 8 --duration 3 --protocols http

Wrap runs in ``flock /tmp/naiad-bench.lock`` on a shared machine. Needs wrk, h2load (nghttp2-client), taskset.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

PROJECT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(PROJECT))

from naiad.bench.api import Target  # noqa: E402
from naiad.bench.inputs import grpc_request, http_request, infer_path  # noqa: E402
from naiad.bench.load import Generator  # noqa: E402
from naiad.bench.session import Options, Session, Settings, split_url  # noqa: E402

MODEL = "add_sub"
PEERS = Path("/work/shared/peers")
LUA = """
local f = io.open("{body}", "rb")
wrk.method = "POST"
wrk.body = f:read("*all")
f:close()
wrk.headers["Content-Type"] = "application/octet-stream"
wrk.headers["Inference-Header-Content-Length"] = "{header_length}"
done = function(summary, latency, requests)
  io.write(string.format('WRK_JSON {{"requests":%d,"duration_us":%d,"non2xx":%d,"errors":%d}}\\n',
    summary.requests, summary.duration, summary.errors.status,
    summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.timeout))
end
"""


def free_port() -> int:
    from naiad.core.free_ports import free_port as pick  # NAIAD_PORT_RANGE confines it

    return pick()


def start_server(cpu: int, server: str = "naiad") -> tuple[subprocess.Popen[bytes], int, int]:
    http, grpc, metrics = free_port(), free_port(), free_port()
    repo = PROJECT / "examples" / "model_repository"
    if server == "triton":
        # The system Python first: Triton's python backend stub links Debian's libpython and numpy.
        argv = ["env", "PATH=/usr/bin:/bin", str(PEERS / "triton.sh"), "run", str(repo), str(http), str(grpc),
                str(metrics)]
    else:
        argv = [sys.executable, "-m", "naiad", "serve", "--model-repository", str(repo), "--http-port", str(http),
                "--grpc-port", str(grpc), "--metrics-port", str(metrics), "--http-address", "127.0.0.1",
                "--grpc-address", "127.0.0.1", "--log-info", "false"]
    log = open(Path(tempfile.gettempdir()) / f"bench_vs_wrk-{server}-{http}.log", "wb")
    proc = subprocess.Popen(["taskset", "-c", str(cpu), *argv], cwd=PROJECT, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{http}/v2/models/{MODEL}/ready", timeout=1) as r:
                if r.status == 200:
                    return proc, http, grpc
        except OSError:
            time.sleep(0.2)
    proc.kill()
    raise RuntimeError(f"{server} did not become ready; see {log.name}")


def run_wrk(url: str, lua: Path | None, connections: int, seconds: int, cpu: int) -> tuple[float, int]:
    argv = ["taskset", "-c", str(cpu), "wrk", "-t1", f"-c{connections}", f"-d{seconds}s"]
    if lua is not None:
        argv += ["-s", str(lua)]
    out = subprocess.run(argv + [url], capture_output=True, text=True, timeout=seconds + 60).stdout
    match = re.search(r"WRK_JSON (\{.*\})", out)
    if match:
        data = json.loads(match.group(1))
        return data["requests"] / (data["duration_us"] / 1e6), data["non2xx"] + data["errors"]
    rate = re.search(r"Requests/sec:\s+([\d.]+)", out)
    if not rate:
        raise RuntimeError(f"unexpected wrk output:\n{out}")
    return float(rate.group(1)), 0


def run_h2load(url: str, body: Path, concurrency: int, seconds: int, cpu: int, layout: str) -> tuple[float, int]:
    connections, streams = (1, concurrency) if layout == "streams" else (concurrency, 1)
    argv = ["taskset", "-c", str(cpu), "h2load", "-t1", f"-c{connections}", f"-m{streams}", f"-D{seconds}",
            "-H", "content-type: application/grpc", "-H", "te: trailers", "-d", str(body), url]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=seconds + 60).stdout
    done = re.search(r"requests: \d+ total, \d+ started, (\d+) done, (\d+) succeeded, (\d+) failed, (\d+) errored",
                     out)
    rate = re.search(r"finished in [\d.]+\w+, ([\d.]+) req/s", out)
    if not done or not rate:
        raise RuntimeError(f"unexpected h2load output:\n{out}")
    return float(rate.group(1)), int(done.group(3)) + int(done.group(4))


def run_bench(url: str, protocol: str, connections: int, seconds: int, cpu: int, channels: int) -> tuple[float, int]:
    """naiad bench measuring one window of `seconds` (after a short warm-up), one worker process on `cpu`."""
    settings = Settings(measurement_interval_ms=int(seconds * 1000 / 1.2), max_trials=1, stability_percentage=1000)
    options = Options(cpus=[cpu], grpc_channels=channels)
    with Session(Target(url, MODEL, protocol=protocol), settings, options, processes=1) as session:
        status = session.profile(concurrency=connections, warmup=connections * 10)
        return status.client.infer_per_sec, status.client.errors


def run_bench_health(url: str, protocol: str, connections: int, seconds: int, cpu: int,
                     channels: int) -> tuple[float, int]:
    if protocol == "http":
        host, port = split_url(url, 8000)
        body = (f"GET /v2/health/live HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n").encode()
        spec = {"protocol": "http", "host": host, "port": port, "bodies": [body]}
    else:
        spec = {"protocol": "grpc", "target": url, "bodies": [b""], "grpc_channels": channels,
                "method": "/inference.GRPCInferenceService/ServerLive"}
    generator = Generator(spec, 1, [cpu])
    try:
        generator.set_concurrency(connections)
        time.sleep(0.5)
        generator.swap()
        start = time.monotonic_ns()
        time.sleep(seconds)
        end = time.monotonic_ns()
        records = generator.swap()
        return sum(1 for e in records.ends if e <= end) / ((end - start) / 1e9), records.errors
    finally:
        generator.stop()


def served(http_port: int) -> int:
    """The server's own count of successful add_sub requests (its /stats), to check both generators' numbers."""
    with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/v2/models/{MODEL}/stats", timeout=10) as r:
        stats = json.load(r)
    return int(stats["model_stats"][0]["inference_stats"]["success"]["count"])


def bodies(workdir: Path, http_port: int) -> tuple[Path, Path, Path, Path]:
    from naiad.bench.control import Control
    from naiad.bench.inputs import build_inputs

    control = Control(f"127.0.0.1:{http_port}", "http")
    model = control.model(MODEL)
    control.close()
    tensors = build_inputs(model)[0]
    raw = http_request(f"127.0.0.1:{http_port}", model, tensors)
    head, _, body = raw.partition(b"\r\n\r\n")
    header_length = re.search(rb"Inference-Header-Content-Length: (\d+)", head).group(1).decode()  # type: ignore[union-attr]
    http_body = workdir / "infer.bin"
    http_body.write_bytes(body)
    lua = workdir / "infer.lua"
    lua.write_text(LUA.format(body=http_body, header_length=header_length))
    message = grpc_request(model, tensors)
    grpc_body = workdir / "infer.grpc"
    grpc_body.write_bytes(b"\0" + struct.pack(">I", len(message)) + message)
    health = workdir / "live.grpc"
    health.write_bytes(b"\0\0\0\0\0")
    return lua, grpc_body, health, http_body


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--connections", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--duration", type=int, default=5, help="seconds per run")
    parser.add_argument("--endpoints", nargs="+", default=["infer", "health"], choices=["infer", "health"])
    parser.add_argument("--repeat", type=int, default=3, help="runs of each generator, alternating; medians reported")
    parser.add_argument("--server-cpu", type=int, default=1)
    parser.add_argument("--load-cpu", type=int, default=0)
    parser.add_argument("--protocols", nargs="+", default=["http", "grpc"], choices=["http", "grpc"])
    parser.add_argument("--grpc-layout", choices=["streams", "connections"], default="streams",
                        help="gRPC concurrency c as one connection with c streams (h2load -c1 -mc; naiad bench's "
                             "default) or c connections of one stream (h2load -cc -m1; --grpc-connections c)")
    parser.add_argument("--server", choices=["naiad", "triton"], default="naiad",
                        help="the server under load (triton: /work/shared/peers/triton.sh, real Triton 2.51)")
    parser.add_argument("--json", default="", help="also write the rows here")
    args = parser.parse_args()
    for tool in ("wrk", "h2load", "taskset"):
        if not shutil.which(tool):
            print(f"needs {tool}", file=sys.stderr)
            return 2
    proc, http_port, grpc_port = start_server(args.server_cpu, args.server)
    rows = []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            lua, grpc_body, health_body, _ = bodies(Path(tmp), http_port)
            http_url, grpc_url = f"127.0.0.1:{http_port}", f"127.0.0.1:{grpc_port}"
            for protocol in args.protocols:
                peer = "wrk" if protocol == "http" else "h2load"
                for endpoint in args.endpoints:
                    for c in args.connections:
                        url = http_url if protocol == "http" else grpc_url
                        channels = 1 if args.grpc_layout == "streams" else c

                        def peer_run() -> tuple[float, int]:
                            if protocol == "http":
                                path = infer_path(MODEL, "") if endpoint == "infer" else "/v2/health/live"
                                return run_wrk(f"http://{http_url}{path}", lua if endpoint == "infer" else None, c,
                                               args.duration, args.load_cpu)
                            method = "ModelInfer" if endpoint == "infer" else "ServerLive"
                            return run_h2load(f"http://{grpc_url}/inference.GRPCInferenceService/{method}",
                                              grpc_body if endpoint == "infer" else health_body, c, args.duration,
                                              args.load_cpu, args.grpc_layout)

                        def our_run() -> tuple[float, int]:
                            if endpoint == "infer":
                                return run_bench(url, protocol, c, args.duration, args.load_cpu, channels)
                            return run_bench_health(url, protocol, c, args.duration, args.load_cpu, channels)

                        theirs, ours, counted = [], [], {"peer": 0, "naiad_bench": 0}
                        # Alternating, repeated: neighbours on a shared machine shift a single run a lot.
                        for round_ in range(args.repeat):
                            order = [("peer", peer_run), ("naiad_bench", our_run)]
                            for who, run in (order if round_ % 2 == 0 else order[::-1]):
                                before = served(http_port)
                                rate, errors = run()
                                counted[who] += served(http_port) - before
                                (theirs if who == "peer" else ours).append((rate, errors))
                        peer_rps = statistics.median(r for r, _ in theirs)
                        our_rps = statistics.median(r for r, _ in ours)
                        row = {"server": args.server, "protocol": protocol, "endpoint": endpoint, "connections": c,
                               "peer": peer, "peer_rps": round(peer_rps, 1), "naiad_bench_rps": round(our_rps, 1),
                               "ratio": round(our_rps / peer_rps, 3) if peer_rps else None,
                               "peer_runs": [round(r, 1) for r, _ in theirs],
                               "naiad_bench_runs": [round(r, 1) for r, _ in ours],
                               "peer_errors": sum(e for _, e in theirs), "naiad_bench_errors": sum(e for _, e in ours),
                               "server_counted": counted if endpoint == "infer" else None}
                        rows.append(row)
                        errors = row["peer_errors"] + row["naiad_bench_errors"]
                        print(f"{args.server:6} {protocol:5} {endpoint:7} c={c:<3} {peer:7} {peer_rps:9.1f} req/s   "
                              f"naiad bench {our_rps:9.1f} req/s   ratio {row['ratio']}"
                              f"{f'   ERRORS {errors}' if errors else ''}", flush=True)
    finally:
        proc.terminate()   # taskset, env and triton.sh exec: this is the server itself
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
