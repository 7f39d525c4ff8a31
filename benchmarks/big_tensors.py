"""naiad against real Triton 2.51 through NVIDIA's perf_analyzer: big FP32 tensors (an identity Python model, the
same bytes back), add_sub at one and many connections, over gRPC and HTTP; the ratios issue 32 asks for.

    flock /tmp/naiad-bench.lock python benchmarks/big_tensors.py                 # the whole side-by-side
    python benchmarks/big_tensors.py --cases grpc:identity:1MiB:4 --rounds 3     # one case
    python benchmarks/big_tensors.py --base /tmp/base32 --servers naiad,base     # before / after a change

Each case is ``protocol:model:size:concurrency`` (size only counts for ``identity``: the FP32 request and reply
each carry that many bytes). Servers: ``naiad`` (this tree, the lean gRPC engine), ``grpcio`` (this tree,
``--grpc-engine=grpcio``), ``base`` (the tree ``--base`` names, as it starts by default, with ``--base-args``),
``native`` and ``native-grpcio`` (this tree, either engine, with identity_fp32 on the built-in identity backend:
no Python worker, so the gap to ``naiad`` is what the worker's hop costs) and ``triton``. Every
server runs pinned to ``--server-cpu`` (its Python workers and Triton's stub inherit it), perf_analyzer to
``--load-cpu``. Rounds alternate the servers (a fresh server per round and case), and the table gives per server and
case the medians over rounds of throughput, p50 and p99 latency (perf_analyzer's), and the server's CPU per
request (its process and children, from /proc), each server's ratio to Triton, and ``spread``: how far apart a
server's rounds were ((max - min) / median of its throughput), the run's noise.

``--server-share 0.5`` holds every server to that fraction of one CPU (a CFS quota in a cgroup of its own, as
Docker's ``--cpus`` does), so that the server, not perf_analyzer, is what limits the rate: on a 2-core machine
perf_analyzer's one core spends ~1,600 µs per 1 MiB request, about what a server does, and the rates otherwise
compare what each server costs the client. Under a share the ratios are per CPU (the rate a server reaches on the
same CPU budget); use two or more connections, since at one a server waits for the client.

``--python`` names the interpreter naiad's servers run on (a virtualenv's, with naiad's dependencies), and
``--base-python`` the base server's: the interpreter's build moves naiad's CPU per request by 6-24 %. naiad's
container image runs python:3.11-slim's interpreter (configured ``--enable-optimizations --with-lto``; its local
stand-in, Debian's python3.11, is a PGO and LTO build too), and Triton's Python stub here links Debian's
libpython3.11; pyenv's default build has neither. So compare like with like::

    /usr/bin/python3.11 -m venv /tmp/naiad-deb && /tmp/naiad-deb/bin/pip install -e .
    python benchmarks/big_tensors.py --python /tmp/naiad-deb/bin/python

Needs taskset and ``../shared/peers/perf_analyzer.sh install`` / ``triton.sh``; ``--server-share`` needs root and
cgroups (v1's cpu controller, or v2's with cpu enabled for the root's children).
"""

from __future__ import annotations

import argparse
import csv
import os
import resource
import shlex
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
import urllib.request
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
TREE = BENCH_DIR.parent
PEERS = Path(os.environ.get("NAIAD_PEERS_SCRIPTS", "/work/shared/peers"))
sys.path.insert(0, str(BENCH_DIR))

from http_add_sub import server_env  # noqa: E402 - the benchmark folder is not a package
from interpreter import describe  # noqa: E402

IDENTITY_CONFIG = """
name: "identity_fp32"
backend: "python"
max_batch_size: 0
input [{ name: "INPUT0", data_type: TYPE_FP32, dims: [ -1 ] }]
output [{ name: "OUTPUT0", data_type: TYPE_FP32, dims: [ -1 ] }]
instance_group [{ kind: KIND_CPU, count: 1 }]
"""
IDENTITY_MODEL = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", pb_utils.get_input_tensor_by_name(
            request, "INPUT0").as_numpy())]) for request in requests]
"""
# Decoupled: 64 one-token responses per request, each its own message on the gRPC stream.
STREAM_CONFIG = """
name: "stream64"
backend: "python"
max_batch_size: 0
model_transaction_policy { decoupled: true }
input [{ name: "IN", data_type: TYPE_INT32, dims: [ 1 ] }]
output [{ name: "OUT", data_type: TYPE_INT32, dims: [ 1 ] }]
instance_group [{ kind: KIND_CPU, count: 1 }]
"""
STREAM_MODEL = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            for i in range(64):
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([i], np.int32))]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""
DEFAULT_CASES = (
    # item 1: big tensors over gRPC (and HTTP alongside)
    "grpc:identity:256KiB:1", "grpc:identity:1MiB:1", "grpc:identity:1MiB:4", "grpc:identity:4MiB:4",
    "grpc:identity:16MiB:1", "grpc:identity:1MiB:16", "http:identity:1MiB:4", "http:identity:16MiB:1",
    # item 2: one connection
    "grpc:add_sub:-:1", "http:add_sub:-:1",
    # item 3 and 5: many connections
    "http:add_sub:-:8", "http:add_sub:-:64", "grpc:add_sub:-:64",
    # item 5: streaming
    "grpc:stream64:-:1", "grpc:stream64:-:8",
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def size_bytes(text: str) -> int:
    for unit, scale in (("KiB", 1024), ("MiB", 1024 * 1024)):
        if text.endswith(unit):
            return int(float(text[:-len(unit)]) * scale)
    return int(text)


def repository(into: Path, native: bool = False) -> Path:
    """``native``: identity_fp32 on naiad's built-in identity backend (Triton's test backend: no Python worker,
    run on a thread of the server), for the ``native`` servers: what the engine reaches with no model in the way."""
    model = into / "identity_fp32"
    (model / "1").mkdir(parents=True)
    if native:
        (model / "config.pbtxt").write_text(textwrap.dedent(IDENTITY_CONFIG).replace('"python"', '"identity"'))
    else:
        (model / "config.pbtxt").write_text(textwrap.dedent(IDENTITY_CONFIG))
        (model / "1" / "model.py").write_text(textwrap.dedent(IDENTITY_MODEL))
    stream = into / "stream64"
    (stream / "1").mkdir(parents=True)
    (stream / "config.pbtxt").write_text(textwrap.dedent(STREAM_CONFIG))
    (stream / "1" / "model.py").write_text(textwrap.dedent(STREAM_MODEL))
    add_sub = TREE / "examples" / "model_repository" / "add_sub"
    (into / "add_sub").symlink_to(add_sub)
    return into


def cpu_seconds(pid: int) -> float:
    """User + system time of ``pid`` and its live descendants (Python workers, Triton's stubs), from /proc."""
    ticks = os.sysconf("SC_CLK_TCK")
    total, todo = 0.0, [pid]
    while todo:
        p = todo.pop()
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / ticks
            for task in Path(f"/proc/{p}/task").iterdir():
                todo += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            continue
    return total


class CpuShare:
    """A cgroup that holds what runs in it to ``share`` of one CPU (a CFS quota per 100 ms period)."""

    PERIOD_US = 100_000

    def __init__(self, share: float) -> None:
        name = f"naiad-bench-{os.getpid()}"
        v1, v2 = Path("/sys/fs/cgroup/cpu"), Path("/sys/fs/cgroup")
        quota = int(share * self.PERIOD_US)
        if (v1 / "cpu.cfs_quota_us").exists():
            self.path = v1 / name
            self.path.mkdir(exist_ok=True)
            (self.path / "cpu.cfs_period_us").write_text(str(self.PERIOD_US))
            (self.path / "cpu.cfs_quota_us").write_text(str(quota))
        elif "cpu" in (v2 / "cgroup.controllers").read_text().split():
            self.path = v2 / name
            self.path.mkdir(exist_ok=True)
            (self.path / "cpu.max").write_text(f"{quota} {self.PERIOD_US}")
        else:
            raise RuntimeError("--server-share needs a cgroup cpu controller (v1 /sys/fs/cgroup/cpu, or v2 with cpu)")

    def wrap(self, argv: list[str]) -> list[str]:
        """``argv`` run inside the group (joined before exec, so every process it starts is in it too)."""
        return ["sh", "-c", 'echo $$ > "$0/cgroup.procs" && exec "$@"', str(self.path), *argv]

    def close(self) -> None:
        try:
            self.path.rmdir()
        except OSError:
            pass


class Server:
    def __init__(self, kind: str, repo: Path, base: Path | None, cpu: str, log: Path,
                 share: CpuShare | None = None, extra: tuple[str, ...] = (), python: str = sys.executable) -> None:
        self.http, self.grpc, metrics = free_port(), free_port(), free_port()
        if kind == "triton":
            argv = [str(PEERS / "triton.sh"), "run", str(repo), str(self.http), str(self.grpc), str(metrics)]
            cwd, env = None, server_env({})
        else:
            tree = base if kind == "base" else TREE
            assert tree is not None, "--base is needed for the base server"
            argv = [python, "-m", "naiad", "serve", "--model-repository", str(repo),
                    "--http-port", str(self.http), "--grpc-port", str(self.grpc), "--metrics-port", str(metrics)]
            if kind in ("grpcio", "native-grpcio"):
                argv.append("--grpc-engine=grpcio")
            argv += extra
            cwd, env = tree, {**os.environ, "PYTHONPATH": str(tree)}
        argv = ["taskset", "-c", cpu, *argv]
        self.proc = subprocess.Popen(share.wrap(argv) if share else argv, cwd=cwd, env=env, stdout=open(log, "wb"),
                                     stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 180
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.http}/v2/health/ready", timeout=1) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline or self.proc.poll() is not None:
                self.stop()
                raise RuntimeError(f"{kind} did not become ready:\n{log.read_text()[-9000:]}")
            time.sleep(0.2)
        for model in ("identity_fp32", "add_sub", "stream64"):  # Triton loads models after it says ready on some paths
            while True:
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{self.http}/v2/models/{model}/ready",
                                                timeout=1) as r:
                        if r.status == 200:
                            break
                except OSError:
                    pass
                if time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"{kind}: {model} not ready: see {log}")
                time.sleep(0.2)

    def stop(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                return
            try:
                self.proc.wait(20)
                return
            except subprocess.TimeoutExpired:
                continue


def perf_analyzer() -> str:
    return subprocess.run([str(PEERS / "perf_analyzer.sh"), "path"], capture_output=True, text=True,
                          check=True).stdout.strip()


def run_case(pa: str, server: Server, case: str, args: argparse.Namespace, scratch: Path) -> dict[str, float]:
    protocol, model, size, concurrency = case.split(":")
    port = server.grpc if protocol == "grpc" else server.http
    report = scratch / "pa.csv"
    name = {"identity": "identity_fp32"}.get(model, model)
    argv = ["taskset", "-c", args.load_cpu, pa, "-m", name,
            "-i", protocol, "-u", f"127.0.0.1:{port}", "--concurrency-range", concurrency,
            "--measurement-mode", "time_windows", "--measurement-interval", str(args.window_ms),
            "--stability-percentage", "10000", "--max-trials", "3", "-f", str(report)]
    if model == "identity":
        argv += ["--shape", f"INPUT0:{size_bytes(size) // 4}"]
    if model == "stream64":
        argv.append("--streaming")  # infer/s counts requests, each answered by 64 responses
    pid = server.proc.pid
    before, start, client_before = cpu_seconds(pid), time.monotonic(), _children_cpu()
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=args.case_timeout)
    except subprocess.TimeoutExpired:
        # Seen with HTTP at 64 connections against a server faster than perf_analyzer's one core can drive: its
        # 64 threads keep that core busy, the window never closes, and its memory grows by GBs a minute.
        raise RuntimeError(f"perf_analyzer did not finish {case} in {args.case_timeout} s: where it, not the "
                           "server, is the limit it may never close a window; --server-share gives it room") from None
    wall, cpu = time.monotonic() - start, cpu_seconds(pid) - before
    client = _children_cpu() - client_before  # perf_analyzer's own (taskset execs it: the same process)
    if out.returncode != 0 or not report.exists():
        raise RuntimeError(f"perf_analyzer failed on {case}:\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}")
    with open(report) as fh:
        row = next(csv.DictReader(fh))
    report.unlink()
    rate = float(row["Inferences/Second"])
    # perf_analyzer's requests over the whole run (trials and their warm-up) are not reported, so CPU per request
    # is the CPU over the run divided by the run's requests at the measured rate.
    requests = max(rate * wall, 1)
    return {"rps": rate, "p50": float(row["p50 latency"]) / 1000, "p99": float(row["p99 latency"]) / 1000,
            "cpu_us": cpu / requests * 1e6, "client_us": client / requests * 1e6}


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cases", default=",".join(DEFAULT_CASES), help="protocol:model:size:concurrency, comma-separated")
    p.add_argument("--servers", default="naiad,grpcio,triton",
                   help="naiad, grpcio, base, triton; native and native-grpcio: naiad (either engine) with "
                        "identity_fp32 on the built-in identity backend, no Python worker")
    p.add_argument("--base", type=Path, help="a naiad checkout for the 'base' server (e.g. git worktree add ...)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--window-ms", type=int, default=2000, help="perf_analyzer's measurement window")
    p.add_argument("--server-cpu", default="1")
    p.add_argument("--load-cpu", default="0")
    p.add_argument("--server-share", type=float, help="hold each server to this fraction of one CPU (e.g. 0.5)")
    p.add_argument("--base-args", default="", help="more arguments for the base server (e.g. --idle-poll-us 0, with "
                                                   "--base . to try a flag against the tree as it is)")
    p.add_argument("--case-timeout", type=float, default=180, help="seconds one perf_analyzer run may take")
    p.add_argument("--python", default=sys.executable,
                   help="the interpreter naiad's servers run on, with naiad's dependencies installed (default: this "
                        "one); its Python workers run on it too")
    p.add_argument("--base-python", help="the base server's interpreter (default: --python's)")
    args = p.parse_args()
    servers = args.servers.split(",")
    base_python = args.base_python or args.python
    print(f"naiad runs on {describe(args.python)}", file=sys.stderr)
    if "base" in servers and base_python != args.python:
        print(f"base runs on {describe(base_python)}", file=sys.stderr)
    share = CpuShare(args.server_share) if args.server_share else None
    cases = args.cases.split(",")
    pa = perf_analyzer()
    results: dict[tuple[str, str], list[dict[str, float]]] = {}
    with tempfile.TemporaryDirectory(prefix="big_tensors.") as tmp:
        scratch = Path(tmp)
        repo = repository(scratch / "repo")
        native = any(kind.startswith("native") for kind in servers)
        native_repo = repository(scratch / "native", native=True) if native else repo
        for rnd in range(args.rounds):
            # Alternate the order each round, so neither side always runs just after the other.
            for kind in (servers if rnd % 2 == 0 else servers[::-1]):
                server = Server(kind, native_repo if kind.startswith("native") else repo, args.base, args.server_cpu,
                                scratch / f"{kind}.log", share,
                                tuple(shlex.split(args.base_args)) if kind == "base" else (),
                                base_python if kind == "base" else args.python)
                try:
                    for case in cases:
                        if kind.endswith("grpcio") and not case.startswith("grpc:"):
                            continue  # the engine changes gRPC only
                        try:
                            r = run_case(pa, server, case, args, scratch)
                        except (RuntimeError, subprocess.TimeoutExpired) as exc:
                            print(f"round {rnd + 1} {kind} {case}: {exc}", file=sys.stderr)
                            continue
                        results.setdefault((kind, case), []).append(r)
                        print(f"round {rnd + 1} {kind:13s} {case:24s} {r['rps']:9.1f}/s p50 {r['p50']:7.2f} ms "
                              f"p99 {r['p99']:7.2f} ms cpu {r['cpu_us']:8.0f} us/req client {r['client_us']:6.0f}",
                              file=sys.stderr, flush=True)
                finally:
                    server.stop()
    if share:
        share.close()
        print(f"\nEach server held to {args.server_share:g} of one CPU: the ratios are per CPU.")
    print(f"\n{'case':24s} {'server':13s} {'infer/s':>9s} {'p50 ms':>8s} {'p99 ms':>8s} {'cpu us':>8s} "
          f"{'client us':>9s} {'MiB/s':>8s} {'spread':>7s} {'vs triton':>9s}")
    for case in cases:
        triton = results.get(("triton", case))
        reference = statistics.median(r["rps"] for r in triton) if triton else None
        protocol, model, size, _ = case.split(":")
        for kind in servers:
            rows = results.get((kind, case))
            if not rows:
                continue
            med = {key: statistics.median(r[key] for r in rows) for key in rows[0]}
            rates = [r["rps"] for r in rows]
            spread = (max(rates) - min(rates)) / med["rps"] if med["rps"] else 0.0
            mib = med["rps"] * size_bytes(size) / 2**20 if model == "identity" else 0.0
            ratio = f"{med['rps'] / reference:.2f}x" if reference else "-"
            print(f"{case:24s} {kind:13s} {med['rps']:9.1f} {med['p50']:8.2f} {med['p99']:8.2f} "
                  f"{med['cpu_us']:8.0f} {med['client_us']:9.0f} {mib:8.0f} {spread:6.0%} {ratio:>9s}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
