#!/usr/bin/env python3
"""One GPU command: how close one item per request, served by naiad, comes to batching in one process, and how the
server survives a bad token id.

1. Builds a BERT-base-sized encoder (12 x 768, 12 heads, seq 128, vocab 30522) and ResNet-50 in plain torch.nn with
   random weights (``gpu_models.py``), traced to TorchScript (fp16 on a GPU).
2. The in-process limit: the same TorchScript file run in this process at batch sizes 1 to 64, NumPy in and NumPy
   out; the best of them is the limit a server is measured against.
3. Serves both with the pytorch backend and with an equivalent Python-backend model.py (``gpu_python_model.py``),
   ``KIND_GPU`` (``KIND_CPU`` on ``--device cpu``), dynamic batching up to 64: ``python -m naiad serve`` in a
   subprocess, ``--frontend-processes`` passed through (a comma list runs each). The models are fp16 on a GPU
   (``--dtype``): INT64 token ids in, FP16 out for BERT, FP16 in and out for ResNet-50.
4. Drives each model at one item per request with ``naiad bench`` over gRPC (``--bench-processes`` worker processes)
   at each ``--concurrency``, while sampling GPU utilization (pynvml, else nvidia-smi, else none) and the server's
   CPU (psutil).
5. The fault test, per backend: one request with an out-of-range token id (a CUDA device-side assert on a GPU, an
   IndexError on the CPU), then good requests one after another: how many of the first 20 succeed, and how long
   until the model serves again; then whether the other model still serves.
6. Prints one table against the limit and the targets (BERT >= 0.9 of the limit, ResNet-50 >= 0.8, serving again
   within 5 s), and writes everything to ``--json-out``.

    python benchmarks/gpu.py                                    # a GPU host: the full run (~4 min per front-end count)
    python benchmarks/gpu.py --device cpu --small --concurrency 8 --bench-seconds 1   # smoke run on a CPU host
    bash benchmarks/gpu_device_run.sh                           # the device machine's one call (see that file)

Exit status: 0 when every part ran (targets missed or not), 1 when a part could not run (a server that did not
start, a bench that failed).
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import platform
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

TARGETS = {"bert": 0.9, "resnet50": 0.8}
RECOVERY_TARGET_S = 5.0
GOOD_AFTER_FAULT = 20


# --- processes --------------------------------------------------------------------------------------------------

def free_port() -> int:
    from naiad.core.free_ports import free_port as pick  # NAIAD_PORT_RANGE confines it

    return pick()


def child_env() -> dict[str, str]:
    path = [str(ROOT)] + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else [])
    return {**os.environ, "PYTHONPATH": os.pathsep.join(path)}


class Server:
    """``python -m naiad serve`` in its own process group, output to a log file (never to our stdout)."""

    def __init__(self, repo: Path, log: Path, frontend_processes: str, extra: list[str]) -> None:
        self.http_port, self.grpc_port, self.metrics_port = free_port(), free_port(), free_port()
        self.log = log
        command = [sys.executable, "-m", "naiad", "serve", "--model-repository", str(repo),
                   "--http-address", "127.0.0.1", "--http-port", str(self.http_port),
                   "--grpc-address", "127.0.0.1", "--grpc-port", str(self.grpc_port),
                   "--metrics-port", str(self.metrics_port), "--frontend-processes", frontend_processes, *extra]
        self.command = command
        with open(log, "wb") as out:
            self.process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                            env=child_env(), start_new_session=True)

    def wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"naiad exited with {self.process.returncode} before it was ready (log: {self.log})")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.http_port}/v2/health/ready", timeout=2) as r:
                    if r.status == 200:
                        return
            except (OSError, urllib.error.URLError):
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"naiad was not ready within {timeout:.0f} s (log: {self.log})")
            time.sleep(0.25)

    def cpu_seconds(self) -> float | None:
        """User + system CPU of the server and all its processes (front ends, Python workers) so far."""
        try:
            import psutil
        except ImportError:
            return None
        try:
            root = psutil.Process(self.process.pid)
            total = 0.0
            for proc in [root, *root.children(recursive=True)]:
                try:
                    t = proc.cpu_times()
                    total += t.user + t.system + t.children_user + t.children_system
                except psutil.NoSuchProcess:
                    pass
            return total
        except psutil.NoSuchProcess:
            return None

    def stop(self) -> None:
        if self.process.poll() is None:
            try:
                os.killpg(self.process.pid, signal.SIGTERM)
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                pass
            except ProcessLookupError:
                return
        try:
            os.killpg(self.process.pid, signal.SIGKILL)  # whatever of the group is left (workers, front ends)
        except ProcessLookupError:
            pass
        self.process.wait()


# --- GPU utilization ----------------------------------------------------------------------------------------------

class Gpu:
    """Reads one GPU's utilization (percent of the last sample period in which a kernel ran) and used memory: through
    pynvml, else nvidia-smi, else not at all (``how`` says which)."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.how = "none"
        self._nvml: Any = None
        self._handle: Any = None
        try:
            import pynvml
            pynvml.nvmlInit()
            self._handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            self._nvml = pynvml
            self.how = "pynvml"
        except Exception:  # noqa: BLE001 - no module, no driver, no device: try the next way
            if shutil.which("nvidia-smi") and self._smi() is not None:
                self.how = "nvidia-smi"

    def _smi(self) -> tuple[float, float] | None:
        try:
            line = subprocess.run(["nvidia-smi", "-i", str(self.index), "--query-gpu=utilization.gpu,memory.used",
                                   "--format=csv,noheader,nounits"], capture_output=True, text=True,
                                  timeout=5, check=False).stdout.strip()
            util, used = (float(v) for v in line.split(","))
            return util, used * 2**20
        except (OSError, ValueError, subprocess.SubprocessError):
            return None

    def read(self) -> tuple[float, float] | None:
        if self._nvml is not None:
            try:
                return (float(self._nvml.nvmlDeviceGetUtilizationRates(self._handle).gpu),
                        float(self._nvml.nvmlDeviceGetMemoryInfo(self._handle).used))
            except Exception:  # noqa: BLE001
                return None
        return self._smi() if self.how == "nvidia-smi" else None


class Sampler:
    """Samples the GPU (if any) and the server's CPU seconds every ``interval`` s in a thread while a level runs;
    ``stop(last)`` summarizes the samples of the ``last`` seconds before it, i.e. naiad bench's measured windows
    rather than its start-up, ceiling probe and warm-up."""

    def __init__(self, gpu: Gpu | None, server: Server, interval: float = 0.2) -> None:
        self.gpu = gpu if gpu is not None and gpu.how != "none" else None
        self.server, self.interval = server, interval
        self._samples: list[tuple[float, tuple[float, float] | None, float | None]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while True:
            self._samples.append((time.monotonic(), self.gpu.read() if self.gpu else None, self.server.cpu_seconds()))
            if self._stop.wait(self.interval):
                return

    def start(self) -> Sampler:
        self._thread.start()
        return self

    def stop(self, last: float) -> dict[str, Any]:
        end = time.monotonic()
        self._stop.set()
        self._thread.join()
        # the bench's teardown (closing its workers) takes a moment after its last window
        inside = [s for s in self._samples if end - last - 0.3 <= s[0] <= end - 0.3] or self._samples
        out: dict[str, Any] = {"gpu": None, "server_cores": None}
        gpus = [g for _, g, _ in inside if g is not None]
        if gpus:
            utils = [u for u, _ in gpus]
            out["gpu"] = {"util_mean": sum(utils) / len(utils), "util_max": max(utils),
                          "memory_used_max": max(m for _, m in gpus), "samples": len(utils)}
        cpus = [(t, c) for t, _, c in inside if c is not None]
        if len(cpus) >= 2 and cpus[-1][0] > cpus[0][0]:
            out["server_cores"] = (cpus[-1][1] - cpus[0][1]) / (cpus[-1][0] - cpus[0][0])
        return out


# --- model repositories -----------------------------------------------------------------------------------------

def config_pbtxt(spec: Any, backend: str, gpu: int | None, args: argparse.Namespace) -> str:
    kind = f"KIND_GPU gpus: [ {gpu} ]" if gpu is not None else "KIND_CPU"
    where = 'platform: "pytorch_libtorch"' if backend == "pytorch" else 'backend: "python"'
    return (
        f'name: "{spec.name}"\n{where}\nmax_batch_size: {args.max_batch}\n'
        f'input [ {{ name: "{spec.input_name}" data_type: {spec.input_dtype} '
        f'dims: [ {", ".join(map(str, spec.input_dims))} ] }} ]\n'
        f'output [ {{ name: "{spec.output_name}" data_type: {spec.output_dtype} '
        f'dims: [ {", ".join(map(str, spec.output_dims))} ] }} ]\n'
        f"instance_group [ {{ kind: {kind} count: {args.instances} }} ]\n"
        f"dynamic_batching {{ max_queue_delay_microseconds: {args.queue_delay_us} }}\n"
    )


def write_repository(root: Path, backend: str, specs: dict[str, Any], files: dict[str, Path], gpu: int | None,
                     args: argparse.Namespace) -> Path:
    repo = root / f"repo-{backend}"
    for name, spec in specs.items():
        version = repo / name / "1"
        version.mkdir(parents=True, exist_ok=True)
        (repo / name / "config.pbtxt").write_text(config_pbtxt(spec, backend, gpu, args))
        shutil.copyfile(files[name], version / "model.pt")
        if backend == "python":
            shutil.copyfile(HERE / "gpu_python_model.py", version / "model.py")
    return repo


# --- load ---------------------------------------------------------------------------------------------------------

def bench(server: Server, model: str, concurrency: int, args: argparse.Namespace, workdir: Path,
          gpu: Gpu | None) -> dict[str, Any]:
    """One ``naiad bench`` level over gRPC, one item per request; GPU and server CPU sampled meanwhile."""
    label = f"{model}-{concurrency}-{server.log.stem}"
    csv_path = workdir / f"bench-{label}.csv"
    window_ms = int(args.bench_seconds * 1000)
    command = [sys.executable, "-m", "naiad", "bench", "-m", model, "-u", f"127.0.0.1:{server.grpc_port}",
               "-i", "grpc", "--concurrency-range", str(concurrency), "-p", str(window_ms),
               "-r", str(args.bench_trials), "-s", str(args.bench_stability), "--input-data", "zero",
               "--warmup-request-count", str(max(args.warmup_requests, 2 * concurrency)),
               "--processes", str(args.bench_processes), "-f", str(csv_path), "--no-progress"]
    sampler = Sampler(gpu, server).start()
    try:
        done = subprocess.run(command, check=False, capture_output=True, text=True, env=child_env(),
                              timeout=window_ms / 1000 * (args.bench_trials + 2) + 120)
    except subprocess.TimeoutExpired:
        done = None
    # naiad bench reports its last 3 windows (perf_analyzer's stability rule)
    row: dict[str, Any] = {"model": model, "concurrency": concurrency, **sampler.stop(3 * window_ms / 1000)}
    log = workdir / f"bench-{label}.log"
    if done is None:
        log.write_text("timed out\n")
        row["error"] = "naiad bench timed out"
        return row
    log.write_text(done.stdout + "\n--- stderr ---\n" + done.stderr)
    for line in done.stderr.splitlines():
        if "own ceiling" in line:
            try:
                row["generator_ceiling"] = float(line.split("own ceiling")[1].split()[0])
            except (IndexError, ValueError):
                pass
    if not csv_path.is_file():
        tail = (done.stderr.strip() or done.stdout.strip()).splitlines()[-1:] or [f"exit {done.returncode}"]
        row["error"] = f"naiad bench: {tail[0]}"
        return row
    records = list(csv.DictReader(io.StringIO(csv_path.read_text())))
    if not records:
        row["error"] = "naiad bench wrote no level"
        return row
    record = records[-1]
    row.update(items_per_s=float(record["Inferences/Second"]), p50_ms=int(record["p50 latency"]) / 1000,
               p99_ms=int(record["p99 latency"]) / 1000, stable=record.get("Stable", "1") == "1",
               bench_exit=done.returncode)
    return row


# --- the fault test -----------------------------------------------------------------------------------------------

WIRE = {np.dtype(np.int64): "INT64", np.dtype(np.float16): "FP16", np.dtype(np.float32): "FP32"}


def infer(port: int, spec: Any, data: np.ndarray, timeout: float = 10.0) -> tuple[int, str]:
    """One KServe v2 request of one item over HTTP, the tensors in binary both ways (JSON has no FP16)."""
    raw = np.ascontiguousarray(data).tobytes()
    header = json.dumps({
        "inputs": [{"name": spec.input_name, "shape": list(data.shape), "datatype": WIRE[data.dtype],
                    "parameters": {"binary_data_size": len(raw)}}],
        "outputs": [{"name": spec.output_name, "parameters": {"binary_data": True}}],
    }).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v2/models/{spec.name}/infer", data=header + raw,
                                     headers={"Content-Type": "application/octet-stream",
                                              "Inference-Header-Content-Length": str(len(header))})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            response.read()
            return response.status, ""
    except urllib.error.HTTPError as exc:
        text = exc.read().decode("utf-8", "replace")
        try:
            text = json.loads(text).get("error", text)
        except ValueError:
            pass
        return exc.code, text
    except OSError as exc:
        return 0, f"{type(exc).__name__}: {exc}"


def fault_test(server: Server, spec: Any, other: Any | None, timeout: float) -> dict[str, Any]:
    rng = np.random.default_rng(2)
    good = spec.sample(1, rng)
    bad = good.copy()
    bad[0, 1] = spec.vocab  # one token id just past the vocabulary
    before = infer(server.http_port, spec, good)
    status, text = infer(server.http_port, spec, bad)
    t0 = time.monotonic()
    results: list[tuple[float, int, str]] = []
    recovered: float | None = None
    while True:
        code, message = infer(server.http_port, spec, good)
        elapsed = time.monotonic() - t0
        results.append((elapsed, code, message))
        if code == 200 and recovered is None:
            recovered = elapsed
        if len(results) >= GOOD_AFTER_FAULT and recovered is not None:
            break
        if elapsed > timeout:
            break
        if len(results) >= GOOD_AFTER_FAULT:
            time.sleep(0.05)  # past the 20: poll until it serves again
    first = results[:GOOD_AFTER_FAULT]
    failures = [m for _, c, m in first if c != 200]
    out: dict[str, Any] = {
        "model": spec.name, "good_before": before[0] == 200, "bad_status": status, "bad_error": text,
        "good_ok": sum(1 for _, c, _ in first if c == 200), "good_sent": len(first),
        "first_failure": failures[0] if failures else "", "recovered_s": recovered,
        "requests_until_recovered": next((i + 1 for i, (_, c, _) in enumerate(results) if c == 200), None),
    }
    if other is not None:
        code, message = infer(server.http_port, other, other.sample(1, rng))
        out["other_model"] = other.name
        out["other_model_ok"] = code == 200
        out["other_model_error"] = message
    return out


# --- report -------------------------------------------------------------------------------------------------------

def short(text: str, width: int = 150) -> str:
    """An error's last line (TorchScript puts a traceback first), cut to ``width``."""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    line = lines[-1] if lines else ""
    if lines and len(lines) > 1 and not line.startswith(("PyTorch", "RuntimeError", "IndexError")):
        line = f"{lines[0][:60]} ... {line}"
    return line if len(line) <= width else line[: width - 3] + "..."


def table(rows: list[dict[str, Any]], faults: list[dict[str, Any]]) -> str:
    head = (f"{'model':9} {'backend':8} {'fe':>2} {'conc':>5} {'items/s':>9} {'limit':>8} {'xlimit':>6} "
            f"{'target':>8} {'GPU %':>6} {'p50 ms':>7} {'p99 ms':>7} {'srv cores':>9}")
    lines = [head, "-" * len(head)]
    for r in rows:
        if "error" in r:
            lines.append(f"{r['model']:9} {r['backend']:8} {r['frontend_processes']:>2} {r['concurrency']:>5}  "
                         f"FAILED: {r['error']}")
            continue
        target = TARGETS.get(r["model"])
        verdict = "" if target is None else f">={target:.1f} {'ok' if r['fraction'] >= target else 'NO'}"
        gpu = f"{r['gpu']['util_mean']:.0f}" if r.get("gpu") else "-"
        cores = f"{r['server_cores']:.1f}" if r.get("server_cores") is not None else "-"
        unstable = "" if r.get("stable", True) else "  (unstable)"
        lines.append(f"{r['model']:9} {r['backend']:8} {r['frontend_processes']:>2} {r['concurrency']:>5} "
                     f"{r['items_per_s']:>9,.0f} {r['limit']:>8,.0f} {r['fraction']:>6.2f} {verdict:>8} {gpu:>6} "
                     f"{r['p50_ms']:>7.2f} {r['p99_ms']:>7.2f} {cores:>9}{unstable}")
    for r in rows:
        ceiling = r.get("generator_ceiling")
        if ceiling and r.get("items_per_s", 0) > 0.8 * ceiling:
            lines.append(f"note: {r['model']} {r['backend']} c={r['concurrency']}: {r['items_per_s']:,.0f} items/s is "
                         f"over 0.8 of naiad bench's own ceiling ({ceiling:,.0f}/s): raise --bench-processes")
    for f in faults:
        recovered = f["recovered_s"]
        verdict = ("serving again after " + f"{recovered:.2f} s" if recovered is not None
                   else f"not serving again after {f['timeout_s']:.0f} s")
        meets = "ok" if recovered is not None and recovered <= RECOVERY_TARGET_S else "NO"
        lines.append(f"fault {f['model']} {f['backend']} fe={f['frontend_processes']}: bad id -> {f['bad_status']} "
                     f"{short(f['bad_error'], 110)!r}; then {f['good_ok']}/{f['good_sent']} good ok; {verdict} "
                     f"(target <= {RECOVERY_TARGET_S:.0f} s: {meets})")
        if f["first_failure"]:
            lines.append(f"      first good request's error: {short(f['first_failure'], 130)!r}")
        if "other_model" in f:
            lines.append(f"      {f['other_model']} afterwards: "
                         f"{'ok' if f['other_model_ok'] else 'FAILED ' + short(f['other_model_error'], 100)}")
    return "\n".join(lines)


# --- main -------------------------------------------------------------------------------------------------------

def ints(text: str) -> list[int]:
    return [int(v) for v in text.split(",") if v]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--device", choices=("cuda", "cpu"), default=None,
                        help="where the models run (default: cuda when torch sees one, else cpu)")
    parser.add_argument("--gpu", type=int, default=0, help="the GPU's index")
    parser.add_argument("--small", action="store_true", help="tiny models (a smoke run on a CPU)")
    parser.add_argument("--dtype", choices=("fp16", "fp32"), default=None,
                        help="the models' floating-point type (default: fp16 on a GPU, fp32 on the CPU)")
    parser.add_argument("--cpu-threads", type=int, default=1,
                        help="--device cpu: torch's threads, in the limit and in the servers (OMP_NUM_THREADS); its "
                             "spinning OpenMP threads starve the server on a small host (2 cores: 40 against 2,400 "
                             "items/s); 0: torch's default")
    parser.add_argument("--models", default="bert,resnet50")
    parser.add_argument("--backends", default="pytorch,python")
    parser.add_argument("--batch-sizes", default="1,2,4,8,16,32,64", help="the in-process limit's batch sizes")
    parser.add_argument("--limit-seconds", type=float, default=1.5, help="time per batch size for the limit")
    parser.add_argument("--max-batch", type=int, default=64, help="the served models' max_batch_size")
    parser.add_argument("--instances", type=int, default=1, help="instances per model (instance_group count)")
    parser.add_argument("--queue-delay-us", type=int, default=0, help="dynamic_batching max_queue_delay_microseconds")
    parser.add_argument("--frontend-processes", default="1",
                        help="naiad serve --frontend-processes; a comma list runs each (e.g. 1,4)")
    parser.add_argument("--serve-args", default="", help="more naiad serve options, one shell-quoted string")
    parser.add_argument("--concurrency", default="64,256", help="naiad bench concurrency levels")
    parser.add_argument("--bench-processes", type=int, default=max(1, min(6, (os.cpu_count() or 2) // 2)),
                        help="naiad bench --processes (load-generator worker processes)")
    parser.add_argument("--bench-seconds", type=float, default=2.0, help="naiad bench's window (-p)")
    parser.add_argument("--bench-trials", type=int, default=4, help="naiad bench's most windows per level (-r)")
    parser.add_argument("--bench-stability", type=float, default=15.0, help="naiad bench -s (percent)")
    parser.add_argument("--warmup-requests", type=int, default=500, help="answered before a level is measured")
    parser.add_argument("--ready-timeout", type=float, default=300.0)
    parser.add_argument("--fault-timeout", type=float, default=20.0,
                        help="how long the fault test waits for the model to serve again")
    parser.add_argument("--no-fault", action="store_true", help="skip the fault test")
    parser.add_argument("--deadline", type=float, default=0.0,
                        help="seconds: start no server or level after this (a started server still gets its fault test), and "
                             "report what was measured (0: none)")
    parser.add_argument("--workdir", type=Path, default=None, help="models, repositories and logs (default: a temp dir)")
    parser.add_argument("--json-out", type=Path, default=None)
    args = parser.parse_args()

    started = time.monotonic()
    import torch
    from gpu_models import in_process_limit, save_torchscript, specs

    device_type = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device_type == "cuda" and not torch.cuda.is_available():
        print(f"--device cuda, but torch {torch.__version__} sees no GPU", file=sys.stderr)
        return 1
    device = torch.device("cuda", args.gpu) if device_type == "cuda" else torch.device("cpu")
    if device_type == "cuda" and "NAIAD_GPUS" not in os.environ and not os.path.isdir("/proc/driver/nvidia/gpus"):
        # naiad finds GPUs in the driver's /proc folder, which some VMs and containers lack; torch's count stands in
        os.environ["NAIAD_GPUS"] = ",".join(str(i) for i in range(torch.cuda.device_count()))
        print(f"no /proc/driver/nvidia/gpus: NAIAD_GPUS={os.environ['NAIAD_GPUS']} for the servers", file=sys.stderr)
    if device_type == "cpu" and args.cpu_threads > 0:
        torch.set_num_threads(args.cpu_threads)
        os.environ["OMP_NUM_THREADS"] = str(args.cpu_threads)  # the servers' (and their workers') environment
    gpu_index = args.gpu if device_type == "cuda" else None
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="naiad-gpu-"))
    workdir.mkdir(parents=True, exist_ok=True)
    half = (args.dtype or ("fp16" if device_type == "cuda" else "fp32")) == "fp16"
    all_specs = specs(args.small, fp16=half)
    chosen = {name: all_specs[name] for name in args.models.split(",") if name}
    gpu = Gpu(args.gpu) if device_type == "cuda" else None
    host: dict[str, Any] = {
        "cpus": os.cpu_count(), "python": platform.python_version(), "torch": torch.__version__,
        "device": torch.cuda.get_device_name(device) if device_type == "cuda" else platform.processor() or "cpu",
        "gpu_sampling": gpu.how if gpu else "none (cpu)", "small": args.small, "fp16": half,
    }
    print(f"device {host['device']} | torch {host['torch']} | {host['cpus']} cpus | GPU sampling: "
          f"{host['gpu_sampling']} | work in {workdir}", file=sys.stderr, flush=True)

    files: dict[str, Path] = {}
    limits: dict[str, dict[int, float]] = {}
    for name, spec in chosen.items():
        files[name] = workdir / "models" / f"{name}.pt"
        t0 = time.monotonic()
        save_torchscript(name, spec, args.small, device, half, files[name])
        limits[name] = in_process_limit(files[name], spec, device, ints(args.batch_sizes), args.limit_seconds)
        print(f"limit {name}: " + ", ".join(f"b{b} {v:,.0f}" for b, v in limits[name].items())
              + f" items/s ({time.monotonic() - t0:.0f} s)", file=sys.stderr, flush=True)

    rows: list[dict[str, Any]] = []
    faults: list[dict[str, Any]] = []

    def late(what: str) -> bool:
        if args.deadline and time.monotonic() - started > args.deadline:
            print(f"  skipped ({what}): past --deadline {args.deadline:.0f} s", file=sys.stderr, flush=True)
            return True
        return False

    def dump() -> None:
        # after every row, so a run cut short still leaves what it measured
        if args.json_out:
            args.json_out.parent.mkdir(parents=True, exist_ok=True)
            report = {"host": host, "options": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
                      "limits": {n: {str(b): v for b, v in lim.items()} for n, lim in limits.items()},
                      "targets": {**TARGETS, "recovery_s": RECOVERY_TARGET_S}, "rows": rows, "faults": faults}
            args.json_out.write_text(json.dumps(report, indent=2))

    def on_term(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt  # `timeout`'s SIGTERM: stop the server, print what was measured

    signal.signal(signal.SIGTERM, on_term)
    dump()
    try:
        for index, frontends in enumerate(args.frontend_processes.split(",")):
            for backend in args.backends.split(","):
                if late(f"{backend} fe={frontends}"):
                    continue
                repo = write_repository(workdir, backend, chosen, files, gpu_index, args)
                server = Server(repo, workdir / f"server-{backend}-fe{frontends}.log", frontends,
                                shlex.split(args.serve_args))
                try:
                    serve_one(server, backend, frontends, chosen, limits, args, workdir, gpu, late, rows, dump)
                    # once per backend: the front ends play no part in a fault of the model
                    if "bert" in chosen and not args.no_fault and index == 0:
                        other = next((s for n, s in chosen.items() if n != "bert"), None)
                        fault = fault_test(server, chosen["bert"], other, args.fault_timeout)
                        fault.update(backend=backend, frontend_processes=frontends, timeout_s=args.fault_timeout,
                                     server_alive=server.process.poll() is None)
                        faults.append(fault)
                        dump()
                        print(f"  fault: {fault['good_ok']}/{fault['good_sent']} good ok, serving again after "
                              f"{fault['recovered_s']} s", file=sys.stderr, flush=True)
                finally:
                    server.stop()
    except KeyboardInterrupt:
        print("interrupted: the table holds what was measured", file=sys.stderr, flush=True)

    print(f"\nnaiad on {host['device']}, one item per request over gRPC, dynamic batching up to {args.max_batch}, "
          f"{args.instances} instance(s); limit = best in-process items/s at batch 1..{max(ints(args.batch_sizes))}")
    print(table(rows, faults), flush=True)
    dump()
    return 1 if any("error" in r for r in rows) else 0


def serve_one(server: Server, backend: str, frontends: str, chosen: dict[str, Any], limits: dict[str, dict[int, float]],
              args: argparse.Namespace, workdir: Path, gpu: Gpu | None, late: Any,
              rows: list[dict[str, Any]], dump: Any) -> None:
    """Every model at every concurrency on one running server; a server that does not start is one failed row."""
    try:
        t0 = time.monotonic()
        server.wait_ready(args.ready_timeout)
    except RuntimeError as exc:
        print(f"{backend} fe={frontends}: {exc}", file=sys.stderr, flush=True)
        rows.append({"model": "-", "backend": backend, "frontend_processes": frontends, "concurrency": 0,
                     "error": str(exc)})
        dump()
        return
    print(f"{backend} fe={frontends}: ready in {time.monotonic() - t0:.1f} s", file=sys.stderr, flush=True)
    for name in chosen:
        limit = max(limits[name].values())
        for concurrency in ints(args.concurrency):
            if late(f"{name} {backend} c={concurrency}"):
                continue
            row = bench(server, name, concurrency, args, workdir, gpu)
            row.update(backend=backend, frontend_processes=frontends, limit=limit)
            if "items_per_s" in row:
                row["fraction"] = row["items_per_s"] / limit
                print(f"  {name} c={concurrency}: {row['items_per_s']:,.0f} items/s ({row['fraction']:.2f} of the "
                      f"limit)", file=sys.stderr, flush=True)
            else:
                print(f"  {name} c={concurrency}: {row['error']}", file=sys.stderr, flush=True)
            rows.append(row)
            dump()


if __name__ == "__main__":
    sys.exit(main())
