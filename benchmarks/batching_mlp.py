#!/usr/bin/env python3
"""Does dynamic batching turn concurrency into throughput? A NumPy MLP (64 -> H -> H -> 16, tanh; H = --hidden) served
as a Triton python model, side by side in one run:

  naiad-batch   naiad, dynamic_batching (max_batch_size 32)
  naiad-single  naiad, the same model without dynamic_batching (one request per execution)
  limit         the same computation in-process (no server) at the batch size naiad-batch formed: the ceiling
  mlserver      MLServer 1.7.1 adaptive batching (max_batch_size 32) on the same computation
  triton        Triton 2.51 python backend with the same dynamic_batching config (optional, --peers)

Every server is pinned to one core (--server-cpu), wrk to another (--wrk-cpu); servers run one at a time.
BLAS is held to one thread everywhere (OPENBLAS_NUM_THREADS=1 ...) so the single core is all anyone gets.
Reuses the process helpers of http_add_sub.py. Run it under `flock /tmp/naiad-bench.lock`.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from http_add_sub import PEERS_DIR, PROJECT_DIR, Server, free_port, http, start, stop, wait_ready  # noqa: E402

MODEL = "mlp"
IN, OUT = 64, 16
HIDDEN = int(os.environ.get("NAIAD_BENCH_HIDDEN", "1024"))  # set by --hidden before anything is generated
ONE_THREAD = {v: "1" for v in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")}

# The computation, shared verbatim by every server and by the in-process limit.
COMPUTE = f"""
import numpy as np

_rng = np.random.default_rng(0)
W1 = (_rng.standard_normal(({IN}, {HIDDEN})) / 8).astype(np.float32)
W2 = (_rng.standard_normal(({HIDDEN}, {HIDDEN})) / 32).astype(np.float32)
W3 = (_rng.standard_normal(({HIDDEN}, {OUT})) / 32).astype(np.float32)


def mlp(x):
    return np.tanh(np.tanh(x @ W1) @ W2) @ W3
"""

TRITON_MODEL = COMPUTE + """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        # Python models get the batch as a list of requests: stack their rows, compute once, split back.
        xs = [pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy() for r in requests]
        y = mlp(np.concatenate(xs) if len(xs) > 1 else xs[0])
        out, row = [], 0
        for x in xs:
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", y[row:row + len(x)])]))
            row += len(x)
        return out
"""

MLSERVER_MODEL = COMPUTE + """
from mlserver import MLModel
from mlserver.codecs import NumpyCodec
from mlserver.types import InferenceRequest, InferenceResponse


class MLP(MLModel):
    async def load(self) -> bool:
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        x = NumpyCodec.decode_input(payload.inputs[0]).astype(np.float32)
        return InferenceResponse(model_name=self.name, outputs=[NumpyCodec.encode_output("OUTPUT0", mlp(x))])
"""


def config(dynamic: bool, delay_us: int) -> str:
    batching = f"dynamic_batching {{ max_queue_delay_microseconds: {delay_us} }}" if dynamic else ""
    return textwrap.dedent(f"""
        name: "{MODEL}"
        backend: "python"
        max_batch_size: 32
        input [{{ name: "INPUT0", data_type: TYPE_FP32, dims: [ {IN} ] }}]
        output [{{ name: "OUTPUT0", data_type: TYPE_FP32, dims: [ {OUT} ] }}]
        {batching}
        instance_group [{{ count: 1, kind: KIND_CPU }}]
    """)


def write_repo(root: Path, dynamic: bool, delay_us: int) -> Path:
    (root / MODEL / "1").mkdir(parents=True)
    (root / MODEL / "config.pbtxt").write_text(config(dynamic, delay_us))
    (root / MODEL / "1" / "model.py").write_text(TRITON_MODEL)
    return root


def write_mlserver(root: Path, max_batch_time: float) -> Path:
    (root / MODEL).mkdir(parents=True)
    (root / MODEL / "model.py").write_text(MLSERVER_MODEL)
    (root / MODEL / "model-settings.json").write_text(json.dumps({
        "name": MODEL, "implementation": "model.MLP", "max_batch_size": 32, "max_batch_time": max_batch_time,
        "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [-1, IN]}],
        "outputs": [{"name": "OUTPUT0", "datatype": "FP32", "shape": [-1, OUT]}],
    }))
    return root


def body() -> bytes:
    x = np.random.default_rng(1).standard_normal((1, IN)).round(3)
    return json.dumps({"inputs": [{"name": "INPUT0", "shape": [1, IN], "datatype": "FP32",
                                   "data": x.reshape(-1).tolist()}]}).encode()


def lua(path: Path, payload: bytes) -> Path:
    template = (Path(__file__).resolve().parent / "wrk_infer.lua").read_text()
    done = template[template.index("-- Emit one machine-readable line"):]
    path.write_text('wrk.method = "POST"\nwrk.headers["Content-Type"] = "application/json"\n'
                    f"wrk.body = '{payload.decode()}'\n\n{done}")
    return path


def wrk(url: str, script: Path, connections: int, duration: int, cpu: int) -> dict:
    argv = ["taskset", "-c", str(cpu), "wrk", "-t1", f"-c{connections}", f"-d{duration}s", "--timeout", "10s",
            "-s", str(script), url]
    out = subprocess.run(argv, capture_output=True, text=True, check=True, timeout=duration + 60).stdout
    for line in out.splitlines():
        if line.startswith("WRK_JSON "):
            return json.loads(line[len("WRK_JSON "):])
    raise RuntimeError(f"no WRK_JSON line in wrk output:\n{out}")


def verify(base: str, payload: bytes) -> None:
    namespace: dict = {}
    exec(COMPUTE, namespace)
    x = np.array(json.loads(payload)["inputs"][0]["data"], np.float32).reshape(1, IN)
    want = namespace["mlp"](x).reshape(-1)
    status, raw = http("POST", f"{base}/v2/models/{MODEL}/infer", payload)
    if status != 200:
        raise RuntimeError(f"infer returned HTTP {status}: {raw[:300]!r}")
    got = np.array(json.loads(raw)["outputs"][0]["data"], np.float32)
    if not np.allclose(got, want, rtol=1e-3, atol=1e-4):
        raise RuntimeError(f"wrong answer: {got[:4]} vs {want[:4]}")


def run_server(server: Server, args: argparse.Namespace, script: Path, payload: bytes, workdir: Path) -> dict:
    base = f"http://127.0.0.1:{server.http_port}"
    proc = start(server, args.server_cpu, workdir / f"{server.name}.log")
    try:
        wait_ready(base, proc, 120)
        verify(base, payload)
        url = f"{base}/v2/models/{MODEL}/infer"
        wrk(url, script, args.connections, args.warmup, args.wrk_cpu)
        before = http("GET", f"{base}/v2/models/{MODEL}/stats")[1] if server.name.startswith("naiad") else b""
        raw = wrk(url, script, args.connections, args.duration, args.wrk_cpu)
        result = {"server": server.name, "rps": raw["requests"] / (raw["duration_us"] / 1e6),
                  "p50_ms": raw["latency_us"]["p50"] / 1000, "p99_ms": raw["latency_us"]["p99"] / 1000,
                  "errors": sum(raw["errors"].values())}
        if before:
            after = json.loads(http("GET", f"{base}/v2/models/{MODEL}/stats")[1])["model_stats"][0]
            start_stats = json.loads(before)["model_stats"][0]
            inferences = after["inference_count"] - start_stats["inference_count"]
            executions = after["execution_count"] - start_stats["execution_count"]
            result["mean_batch"] = inferences / executions if executions else 0.0
        return result
    finally:
        stop(proc, server.stop_timeout)


def limit(batch: float, cpu: int, seconds: float = 5.0) -> dict:
    """The computation alone, in a fresh pinned interpreter, at the (rounded) batch size naiad formed."""
    size = max(1, round(batch))
    code = COMPUTE + textwrap.dedent(f"""
        import time
        x = np.random.default_rng(1).standard_normal(({size}, {IN})).astype(np.float32)
        for _ in range(20):
            mlp(x)
        n, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < {seconds}:
            mlp(x)
            n += 1
        print(n * {size} / (time.perf_counter() - t0))
    """)
    out = subprocess.run(["taskset", "-c", str(cpu), sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, env={**os.environ, **ONE_THREAD}).stdout
    return {"server": f"limit(b={size})", "rps": float(out.strip()), "p50_ms": 0.0, "p99_ms": 0.0, "errors": 0}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--duration", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--connections", type=int, default=64)
    p.add_argument("--hidden", type=int, default=1024, help="hidden width: how much compute per row")
    p.add_argument("--delay-us", type=int, default=0, help="max_queue_delay_microseconds for naiad and triton")
    p.add_argument("--mlserver-batch-time", type=float, default=0.001, help="MLServer max_batch_time (s)")
    p.add_argument("--peers", default="mlserver", help="comma list of mlserver,triton ('none' for neither)")
    p.add_argument("--server-cpu", type=int, default=1)
    p.add_argument("--wrk-cpu", type=int, default=0)
    p.add_argument("--json-out", type=Path)
    args = p.parse_args()
    if args.hidden != HIDDEN:  # the generated model sources read HIDDEN at import: start over with it set
        os.environ["NAIAD_BENCH_HIDDEN"] = str(args.hidden)
        os.execv(sys.executable, [sys.executable, *sys.argv])
    peers = [x for x in args.peers.split(",") if x and x != "none"]
    workdir = Path(tempfile.mkdtemp(prefix="naiad-batching-"))
    payload = body()
    script = lua(workdir / "mlp.lua", payload)
    naiad = [sys.executable, "-m", "naiad", "serve", "--http-address", "127.0.0.1"]
    results = []
    for name, dynamic in (("naiad-batch", True), ("naiad-single", False)):
        repo = write_repo(workdir / name, dynamic, args.delay_us)
        port = free_port()
        argv = [*naiad, "--model-repository", str(repo), "--http-port", str(port),
                "--grpc-port", str(free_port()), "--metrics-port", str(free_port())]
        server = Server(name, argv, port, PROJECT_DIR, env=ONE_THREAD)
        results.append(run_server(server, args, script, payload, workdir))
        print(results[-1], file=sys.stderr, flush=True)
    results.append(limit(results[0]["mean_batch"], args.server_cpu))
    print(results[-1], file=sys.stderr, flush=True)
    if "mlserver" in peers:
        root = write_mlserver(workdir / "mlserver", args.mlserver_batch_time)
        port = free_port()
        (root / "settings.json").write_text(json.dumps({"http_port": port, "grpc_port": free_port(),
                                                        "metrics_port": free_port(), "debug": False}))
        server = Server("mlserver", [str(PEERS_DIR / "mlserver.sh"), "run", str(root)], port, workdir,
                        env=ONE_THREAD, stop_timeout=3.0)
        results.append(run_server(server, args, script, payload, workdir))
        print(results[-1], file=sys.stderr, flush=True)
    if "triton" in peers:
        repo = write_repo(workdir / "triton", True, args.delay_us)
        ports = [free_port() for _ in range(3)]
        server = Server("triton", [str(PEERS_DIR / "triton.sh"), "run", str(repo), *map(str, ports)], ports[0],
                        workdir, env=ONE_THREAD, stop_timeout=20.0)
        results.append(run_server(server, args, script, payload, workdir))
        print(results[-1], file=sys.stderr, flush=True)

    batch = results[0]["rps"]
    print(f"\nMLP {IN}->{HIDDEN}->{HIDDEN}->{OUT} over HTTP/JSON, wrk -c{args.connections} {args.duration}s, "
          f"server on cpu {args.server_cpu}, wrk on cpu {args.wrk_cpu}\n")
    print(f"{'server':<14} {'req/s':>9} {'p50 ms':>8} {'p99 ms':>8} {'batch':>6} {'naiad-batch is':>15}")
    for r in results:
        ratio = batch / r["rps"] if r["rps"] else 0.0
        mean = f"{r['mean_batch']:.1f}" if "mean_batch" in r else "-"
        print(f"{r['server']:<14} {r['rps']:>9.1f} {r['p50_ms']:>8.2f} {r['p99_ms']:>8.2f} {mean:>6} "
              f"{ratio:>14.2f}x")
    if args.json_out:
        args.json_out.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()},
                                             "results": results}, indent=2))
    shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
