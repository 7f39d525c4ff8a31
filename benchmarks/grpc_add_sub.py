#!/usr/bin/env python3
"""Side-by-side gRPC benchmark of ``add_sub``: naiad vs NVIDIA Triton 2.51 vs a bare grpc.aio server doing no work.

Each server runs alone, pinned to one core (``--server-cpu``, default 1), is checked for a correct answer
with tritonclient.grpc, then loaded by h2load pinned to the other core (``--load-cpu``, default 0) with a
framed ``ModelInferRequest`` body (the 5-byte gRPC prefix plus the protobuf: two FP32 [4] raw inputs).
Results are ratios against Triton and against the echo server at each connection level.

    python3 benchmarks/grpc_add_sub.py                       # naiad + triton + echo, c=1,8,64, 10 s each
    python3 benchmarks/grpc_add_sub.py --peers echo --duration 5

Wrap runs in ``flock /tmp/naiad-bench.lock`` on a shared machine. Needs h2load (nghttp2-client) and taskset.
"""
from __future__ import annotations

import argparse
import json
import re
import shlex
import shutil
import struct
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import tritonclient.grpc as grpcclient
from http_add_sub import (
    DEFAULT_REPO,
    PEERS_DIR,
    PROJECT_DIR,
    Server,
    free_port,
    start,
    stop,
    wait_ready,
)
from tritonclient.grpc import service_pb2 as pb

from interpreter import describe_command  # a sibling script, as http_add_sub

BENCH_DIR = Path(__file__).resolve().parent
MODEL = "add_sub"
PATH = "/inference.GRPCInferenceService/ModelInfer"
PEERS = ("triton", "echo", "lean-echo")
A = np.array([1, 2, 3, 4], dtype=np.float32)
B = np.ones(4, dtype=np.float32)


@dataclass
class Result:
    server: str
    connections: int
    requests: int
    rps: float
    mean_ms: float
    errors: int
    vs_triton: float | None = None
    vs_echo: float | None = None


def framed_body() -> bytes:
    """What tritonclient sends for add_sub with raw tensors, as one gRPC length-prefixed message."""
    request = pb.ModelInferRequest(model_name=MODEL, raw_input_contents=[A.tobytes(), B.tobytes()])
    for name in ("INPUT0", "INPUT1"):
        request.inputs.add(name=name, datatype="FP32", shape=[4])
    message = request.SerializeToString()
    return b"\0" + struct.pack(">I", len(message)) + message


def verify(grpc_port: int, deadline: float) -> None:
    """One real tritonclient call before timing: a server that answers wrong gets no number."""
    while True:
        try:
            with grpcclient.InferenceServerClient(f"127.0.0.1:{grpc_port}") as client:
                inputs = [grpcclient.InferInput(n, [4], "FP32") for n in ("INPUT0", "INPUT1")]
                inputs[0].set_data_from_numpy(A)
                inputs[1].set_data_from_numpy(B)
                result = client.infer(MODEL, inputs)
            break
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.25)
    if not (np.array_equal(result.as_numpy("OUTPUT0"), A + B) and np.array_equal(result.as_numpy("OUTPUT1"), A - B)):
        raise RuntimeError("wrong add_sub answer")


def run_h2load(port: int, body: Path, connections: int, streams: int, duration: int, cpu: int) -> tuple[int, int, float]:
    argv = ["taskset", "-c", str(cpu), "h2load", "-t1", f"-c{connections}", f"-m{streams}", f"-D{duration}",
            "-H", "content-type: application/grpc", "-H", "te: trailers", "-d", str(body),
            f"http://127.0.0.1:{port}{PATH}"]
    out = subprocess.run(argv, capture_output=True, text=True, check=True, timeout=duration + 60).stdout
    done = re.search(r"requests: \d+ total, \d+ started, (\d+) done, (\d+) succeeded, (\d+) failed, (\d+) errored", out)
    mean = re.search(r"time for request:\s+\S+\s+\S+\s+(\S+)", out)
    if not done:
        raise RuntimeError(f"unexpected h2load output:\n{out}")
    succeeded, failed, errored = int(done.group(2)), int(done.group(3)), int(done.group(4))
    mean_ms = _ms(mean.group(1)) if mean else float("nan")
    return succeeded, failed + errored, mean_ms


def _ms(text: str) -> float:
    for unit, scale in (("us", 1e-3), ("ms", 1.0), ("s", 1e3)):
        if text.endswith(unit):
            return float(text[: -len(unit)]) * scale
    return float(text)


def servers(args: argparse.Namespace, workdir: Path) -> list[tuple[Server, int]]:
    """(how to start it, its gRPC port) for each server under test, naiad first."""
    out = []
    variants = [] if args.no_naiad else [("naiad", "")] + [tuple(v.split("=", 1)) for v in args.naiad_variant]
    for name, extra in variants:
        http, grpc = free_port(), free_port()
        argv = [*shlex.split(args.naiad_cmd), "--model-repository", str(args.repo), "--http-port", str(http),
                "--grpc-port", str(grpc), "--metrics-port", str(free_port()), *shlex.split(extra)]
        out.append((Server(name, argv, http, PROJECT_DIR), grpc))
    if "triton" in args.peers:
        http, grpc = free_port(), free_port()
        argv = [str(PEERS_DIR / "triton.sh"), "run", str(args.repo), str(http), str(grpc), str(free_port())]
        out.append((Server("triton", argv, http, workdir, stop_timeout=20.0), grpc))
    if "echo" in args.peers:
        grpc = free_port()
        out.append((Server("echo", [sys.executable, str(BENCH_DIR / "grpc_echo_server.py"), str(grpc)], 0,
                           PROJECT_DIR), grpc))
    if "lean-echo" in args.peers:
        grpc = free_port()
        out.append((Server("lean-echo", [sys.executable, str(BENCH_DIR / "grpc_lean_echo.py"), str(grpc)], 0,
                           PROJECT_DIR), grpc))
    return out


def bench(server: Server, grpc_port: int, args: argparse.Namespace, body: Path, workdir: Path) -> list[Result]:
    log_path = workdir / f"{server.name}.log"
    print(f"[{server.name}] starting: {shlex.join(server.argv)}", file=sys.stderr, flush=True)
    proc = start(server, args.server_cpu, log_path)
    try:
        if server.http_port:
            wait_ready(f"http://127.0.0.1:{server.http_port}", proc, args.ready_timeout)
        verify(grpc_port, time.monotonic() + args.ready_timeout)
        if args.warmup:
            run_h2load(grpc_port, body, max(args.connections), args.streams, args.warmup, args.load_cpu)
        results = []
        for connections in args.connections:
            done, errors, mean_ms = run_h2load(grpc_port, body, connections, args.streams, args.duration,
                                               args.load_cpu)
            result = Result(server.name, connections, done, round(done / args.duration, 1), mean_ms, errors)
            print(f"[{server.name}] c={connections:<4} {result.rps:>9.1f} req/s  errors {errors}", file=sys.stderr,
                  flush=True)
            results.append(result)
        if proc.poll() is not None:
            raise RuntimeError(f"{server.name} exited during the run")
        return results
    except Exception:
        print(log_path.read_text(errors="replace")[-2000:], file=sys.stderr)
        raise
    finally:
        stop(proc, server.stop_timeout)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repo", type=Path, default=DEFAULT_REPO)
    p.add_argument("--duration", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--connections", type=lambda s: [int(x) for x in s.split(",")], default=[1, 8, 64])
    p.add_argument("--streams", type=int, default=1, help="concurrent streams per connection (h2load -m)")
    p.add_argument("--peers", type=lambda s: [x for x in s.split(",") if x and x != "none"], default=list(PEERS))
    p.add_argument("--naiad-cmd", default=f"{sys.executable} -m naiad serve")
    p.add_argument("--no-naiad", action="store_true")
    p.add_argument("--naiad-variant", action="append", default=[], metavar="NAME=ARGS",
                   help="also run naiad with these extra flags under NAME, e.g. lean='--grpc-engine=lean'")
    p.add_argument("--server-cpu", type=int, default=1)
    p.add_argument("--load-cpu", type=int, default=0)
    p.add_argument("--ready-timeout", type=float, default=120.0)
    p.add_argument("--json-out", type=Path)
    args = p.parse_args()
    args.repo = args.repo.resolve()
    if not args.no_naiad:
        print(f"naiad runs on {describe_command(args.naiad_cmd)}", file=sys.stderr, flush=True)
    for tool in ("h2load", "taskset"):
        if shutil.which(tool) is None:
            print(f"error: `{tool}` not found on PATH", file=sys.stderr)
            return 2
    workdir = Path(tempfile.mkdtemp(prefix="naiad-grpc-bench-"))
    body = workdir / "add_sub.grpc"
    body.write_bytes(framed_body())
    results: list[Result] = []
    failures = {}
    for server, port in servers(args, workdir):
        try:
            results += bench(server, port, args, body, workdir)
        except Exception as exc:  # one broken server must not cost the others' numbers
            failures[server.name] = f"{type(exc).__name__}: {exc}"
    for r in results:
        base = {x.server: x.rps for x in results if x.connections == r.connections}
        r.vs_triton = round(r.rps / base["triton"], 3) if base.get("triton") else None
        r.vs_echo = round(r.rps / base["echo"], 3) if base.get("echo") else None
    print(f"\nadd_sub over gRPC (h2load -m{args.streams}), {args.duration}s per level, server on cpu "
          f"{args.server_cpu}, h2load on cpu {args.load_cpu}\n")
    print(f"{'server':<14} {'conns':>5} {'req/s':>10} {'mean ms':>8} {'errors':>6} {'vs triton':>9} {'vs echo':>8}")
    order = [r.server for r in results]
    for r in sorted(results, key=lambda r: (r.connections, order.index(r.server))):
        ratio = lambda v: f"{v:.2f}x" if v is not None else "-"
        print(f"{r.server:<14} {r.connections:>5} {r.rps:>10.1f} {r.mean_ms:>8.2f} {r.errors:>6} "
              f"{ratio(r.vs_triton):>9} {ratio(r.vs_echo):>8}")
    for name, why in failures.items():
        print(f"{name}: FAILED ({why})")
    if args.json_out:
        args.json_out.write_text(json.dumps({"results": [asdict(r) for r in results], "failures": failures,
                                             "args": {k: str(v) for k, v in vars(args).items()}}, indent=2))
    shutil.rmtree(workdir, ignore_errors=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
