#!/usr/bin/env python3
"""SageMaker multi-model endpoint under a memory budget: on-demand loads from S3 archives and eviction.

naiad serves a multi-model endpoint (``SAGEMAKER_MULTI_MODEL=true``) whose ``--sagemaker-model-data-url`` is an
``s3://`` prefix on a loopback moto server (tests/s3.py) holding ``--models`` archives of a Python model that
keeps ``--weights-mb`` of random weights in memory. ``--threads`` boto3 clients send a Zipf-distributed
(``--zipf-s``, seeded) stream of ``--requests`` ``invoke_endpoint`` calls with ``TargetModel=model_NN.tar.gz``.

Two servers run, one after the other:

  all-loaded  no memory limit. First the cold load of ``--cold-samples`` models (first-invoke latency and the
              server's download / loading metrics), then one loaded model's footprint (its worker processes'
              PSS), then every model warmed and the trace replayed: the latency of an endpoint where every
              request is a cache hit.
  limited     ``--model-memory-limit`` = ``--fit`` x that footprint; the same trace from a fresh start, the
              server's process tree memory sampled every ``--sample-interval`` seconds and its metrics every
              ``--metrics-interval`` seconds. One limited run per ``--traces`` x ``--policies`` (each a
              ``--sagemaker-eviction-policy``), each from a fresh start.

Reported: failed requests, memory peaks against the limit, the hit ratio against the Belady-optimal hit ratio
of the same trace (computed offline, in the order requests were issued), the cold-load time, and the p50/p99
of cache hits against the all-loaded endpoint. A table goes to stdout, then one line per limited run (policy x
trace: hit ratio over Belady's, p50/p99 of hits and of misses), JSON to ``--out``.

``--simulate`` starts no server: it drives naiad's policy objects (naiad/repository/eviction.py) offline over
seeded traces (eviction_replay.py) against Belady's MIN, LRU, LFU, classic GDSF and the A0 bound, in a second.

Archive layout: a repository of one model, ``model_NN/config.pbtxt`` and ``model_NN/1/{model.py,weights.npy}``
at the archive's top level. Archives are built once into ``--work-dir`` and reused while their parameters match.

    flock /tmp/naiad-bench.lock python benchmarks/sagemaker_mme.py --out /tmp/mme.json
    python benchmarks/sagemaker_mme.py --models 12 --requests 300 --threads 4 --weights-mb 4 --fit 4   # quick run
    python benchmarks/sagemaker_mme.py --self-check                                            # offline checks
    python benchmarks/sagemaker_mme.py --simulate                     # the policies offline: Zipf 0.8/1.1/1.4, shift
    python benchmarks/sagemaker_mme.py --traces zipf1.1,shift1.1 --policies gdsf,lru --skip-all-loaded  # live

Needs boto3, moto (server mode), numpy, psutil and taskset. See docs/benchmarks/sagemaker-mme.md.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import itertools
import json
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import psutil

BENCH_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR))
sys.path.insert(0, str(BENCH_DIR.parent))
from eviction_replay import (belady_hits, gdsf_inflation_hits, lfu_hits, lru_hits,  # noqa: E402
                             noisy_costs, oracle_hits, phases, replay, shift_trace, zipf_trace)
from http_add_sub import PROJECT_DIR, Server, free_port, server_env, start, stop  # noqa: E402

from naiad.repository.eviction import POLICIES, GdsfPolicy, LruPolicy  # noqa: E402

BUCKET = "naiad-bench"
PREFIX = "mme/"
ENDPOINT = "bench"
INPUT = [1.0, 2.0, 3.0, 4.0]
BODY = json.dumps({"inputs": [{"name": "INPUT0", "shape": [4], "datatype": "FP32", "data": INPUT}]}).encode()
ARCHIVE_FORMAT = 1  # bump when the model or the layout changes, so cached archives are rebuilt

MODEL_PY = '''"""naiad benchmark model: keeps its weights in memory and answers OUTPUT0 = INPUT0 + weights[:4]."""

import os

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        path = os.path.join(args["model_repository"], args["model_version"], "weights.npy")
        self.weights = np.load(path)  # read into the process (no mmap): the model really holds the memory
        self.head = self.weights[:4].astype(np.float32)

    def execute(self, requests):
        responses = []
        for request in requests:
            value = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", value + self.head)]))
        return responses
'''

CONFIG = '''name: "{name}"
backend: "python"
input [{{ name: "INPUT0", data_type: TYPE_FP32, dims: [ 4 ] }}]
output [{{ name: "OUTPUT0", data_type: TYPE_FP32, dims: [ 4 ] }}]
instance_group [{{ kind: KIND_CPU, count: 1 }}]
'''


# --- the workload ------------------------------------------------------------------------------------------------

def model_name(index: int) -> str:
    return f"model_{index:02d}"


def target(index: int) -> str:
    return f"{model_name(index)}.tar.gz"


def percentile(values: list[float], q: float) -> float | None:
    """Linear interpolation between closest ranks (numpy's default); None for no values."""
    if not values:
        return None
    return float(np.percentile(np.asarray(values, dtype=np.float64), q))


def latency_summary(seconds: list[float]) -> dict[str, float | int | None]:
    ms = [s * 1e3 for s in seconds]
    return {"count": len(ms), "p50_ms": percentile(ms, 50), "p99_ms": percentile(ms, 99),
            "mean_ms": statistics.fmean(ms) if ms else None, "max_ms": max(ms) if ms else None}


# --- archives -----------------------------------------------------------------------------------------------------

def weights_for(index: int, weights_mb: float, seed: int) -> np.ndarray:
    count = int(weights_mb * (1 << 20)) // 4
    return np.random.default_rng([seed, index]).random(count, dtype=np.float32)


def build_archive(index: int, weights_mb: float, seed: int, path: Path) -> list[float]:
    """Write ``model_NN.tar.gz`` (a repository holding one model) and return the model's weights[:4]."""
    name = model_name(index)
    weights = weights_for(index, weights_mb, seed)
    npy = io.BytesIO()
    np.save(npy, weights)
    files = {f"{name}/config.pbtxt": CONFIG.format(name=name).encode(), f"{name}/1/model.py": MODEL_PY.encode(),
             f"{name}/1/weights.npy": npy.getvalue()}
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".partial")
    # Level 1: random weights do not compress, so a higher level only costs time.
    with tarfile.open(partial, "w:gz", compresslevel=1) as tar:
        for folder in (name, f"{name}/1"):
            info = tarfile.TarInfo(folder)
            info.type, info.mode = tarfile.DIRTYPE, 0o755
            tar.addfile(info)
        for member, data in files.items():
            info = tarfile.TarInfo(member)
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    partial.replace(path)
    return [float(x) for x in weights[:4]]


def build_archives(folder: Path, models: int, weights_mb: float, seed: int, log: Callable[[str], None]
                   ) -> dict[int, list[float]]:
    """The archives in ``folder`` (reused when built with the same parameters) and each model's weights[:4]."""
    manifest_path = folder / "manifest.json"
    wanted = {"format": ARCHIVE_FORMAT, "weights_mb": weights_mb, "seed": seed}
    manifest: dict[str, Any] = {}
    if manifest_path.is_file():
        manifest = json.loads(manifest_path.read_text())
        if {key: manifest.get(key) for key in wanted} != wanted:
            manifest = {}
    heads: dict[str, list[float]] = manifest.get("heads", {})
    built = 0
    for index in range(models):
        path = folder / target(index)
        if str(index) in heads and path.is_file():
            continue
        heads[str(index)] = build_archive(index, weights_mb, seed, path)
        built += 1
        manifest_path.write_text(json.dumps({**wanted, "heads": heads}))
    log(f"archives: {models} in {folder} ({built} built, {models - built} reused)")
    return {index: heads[str(index)] for index in range(models)}


# --- measuring the server -----------------------------------------------------------------------------------------

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text format: ``name`` or ``name{labels}`` -> value."""
    values: dict[str, float] = {}
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if match is not None:
            name, labels, value = match.groups()
            values[name + (labels or "")] = float(value)
    return values


def scrape(port: int) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as response:
        return parse_metrics(response.read().decode())


def delta(after: dict[str, float], before: dict[str, float], name: str) -> float:
    return after.get(name, 0.0) - before.get(name, 0.0)


def mean_delta_ms(after: dict[str, float], before: dict[str, float], family: str) -> float | None:
    """Mean of a ``<family>_sum``/``_count`` summary (microseconds) over the interval, in milliseconds."""
    count = delta(after, before, f"{family}_count")
    return delta(after, before, f"{family}_sum") / count / 1e3 if count else None


def pss(process: psutil.Process) -> int:
    try:
        return int(process.memory_full_info().pss)
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return 0


def tree_memory(pid: int) -> tuple[int, int, int]:
    """(PSS of the server and all its descendants, PSS of the descendants alone, number of processes)."""
    root = psutil.Process(pid)
    children = root.children(recursive=True)
    workers = sum(pss(child) for child in children)
    return pss(root) + workers, workers, 1 + len(children)


def _sample_tree(pid: int, interval: float, done: Any, out: Any) -> None:
    """The sampler process: tree memory at a fixed rate until ``done`` is set, then the peaks through ``out``."""
    peaks = {"samples": 0, "max_tree": 0, "max_workers": 0, "max_root": 0, "max_processes": 0}
    series: list[tuple[float, int, int]] = []  # (seconds from start, tree, workers)
    started = due = time.monotonic()
    out.send("started")
    while not done.is_set():
        try:
            tree, workers, processes = tree_memory(pid)
        except psutil.NoSuchProcess:
            break
        peaks["samples"] += 1
        for name, value in (("max_tree", tree), ("max_workers", workers), ("max_root", tree - workers),
                            ("max_processes", processes)):
            peaks[name] = max(peaks[name], value)
        series.append((round(time.monotonic() - started, 3), tree, workers))
        due = max(due + interval, time.monotonic())  # a fixed rate; a late sample does not pile up
        done.wait(due - time.monotonic())
    elapsed = time.monotonic() - started
    out.send({**peaks, "period_ms": elapsed / peaks["samples"] * 1e3 if peaks["samples"] else None,
              "series": series[::max(1, len(series) // 400)]})


class TreeSampler:
    """Samples the server's process tree memory (sum of PSS) from a process of its own, so the client
    threads' hold on the GIL does not stretch the sampling period."""

    def __init__(self, pid: int, interval: float) -> None:
        import multiprocessing

        context = multiprocessing.get_context("spawn")
        self.done = context.Event()
        self.results, sender = context.Pipe(duplex=False)
        self.process = context.Process(target=_sample_tree, args=(pid, interval, self.done, sender), daemon=True)

    def start(self) -> None:
        self.process.start()
        if self.results.recv() != "started":
            raise RuntimeError("the memory sampler did not start")

    def stop(self) -> dict[str, Any]:
        self.done.set()
        peaks = self.results.recv()
        self.process.join()
        return peaks


class MetricsPoller(threading.Thread):
    """Scrapes /metrics until stopped; keeps the peaks of the memory in use and of the loaded models."""

    def __init__(self, port: int, interval: float) -> None:
        super().__init__(daemon=True)
        self.port, self.interval = port, interval
        self.done = threading.Event()
        self.samples = 0
        self.max_used = 0.0
        self.max_loaded = 0.0
        self.errors = 0

    def run(self) -> None:
        while not self.done.wait(self.interval):
            self.poll()

    def poll(self) -> None:
        try:
            values = scrape(self.port)
        except OSError:
            self.errors += 1
            return
        self.samples += 1
        self.max_used = max(self.max_used, values.get("sagemaker_memory_used_bytes", 0.0))
        self.max_loaded = max(self.max_loaded, values.get("sagemaker_loaded_model_count", 0.0))

    def stop(self) -> None:
        self.done.set()
        self.join()
        self.poll()


# --- the endpoint ---------------------------------------------------------------------------------------------------

@dataclass
class Endpoint:
    proc: subprocess.Popen
    port: int
    metrics_port: int
    log_path: Path
    limit: int | None


def start_endpoint(work: Path, label: str, data_url: str, env: dict[str, str], limit: int | None, cpu: int | None,
                   timeout: float = 120.0, extra: tuple[str, ...] = ()) -> Endpoint:
    root = work / f"models-{label}"
    shutil.rmtree(root, ignore_errors=True)
    empty = work / "empty-repository"
    empty.mkdir(parents=True, exist_ok=True)
    port, metrics_port = free_port(), free_port()
    argv = [sys.executable, "-m", "naiad", "serve", "--model-repository", str(empty), "--allow-sagemaker=true",
            "--sagemaker-port", str(port), "--allow-http=false", "--allow-grpc=false", "--allow-metrics=true",
            "--metrics-port", str(metrics_port), "--model-control-mode=explicit",
            "--sagemaker-models-root", str(root), "--sagemaker-model-data-url", data_url]
    if limit is not None:
        argv += ["--model-memory-limit", str(limit)]
    argv += extra
    log_path = work / f"server-{label}.log"
    server = Server(f"naiad-{label}", argv, port, PROJECT_DIR, {**env, "SAGEMAKER_MULTI_MODEL": "true"})
    # Pinned, the workers the server starts inherit its core.
    proc = start(server, cpu, log_path) if cpu is not None else subprocess.Popen(
        argv, cwd=PROJECT_DIR, env=server_env(server.env), stdout=open(log_path, "wb"), stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL, start_new_session=True)
    endpoint = Endpoint(proc, port, metrics_port, log_path, limit)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"naiad exited with {proc.returncode}; log: {log_path}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/ping", timeout=2) as response:
                if response.status == 200:
                    return endpoint
        except OSError:
            pass
        time.sleep(0.1)
    stop(proc)
    raise RuntimeError(f"naiad's /ping did not answer 200 within {timeout:.0f}s; log: {log_path}")


def unload(endpoint: Endpoint, name: str) -> None:
    """DELETE /models/<key> (SageMaker's key of a target model is the md5 of its name)."""
    key = hashlib.md5(name.encode()).hexdigest()
    request = urllib.request.Request(f"http://127.0.0.1:{endpoint.port}/models/{key}", method="DELETE")
    with urllib.request.urlopen(request, timeout=60) as response:
        if response.status != 200:
            raise RuntimeError(f"DELETE /models/{key} ({name}) answered {response.status}")


def runtime_client(endpoint: Endpoint) -> Any:
    import boto3
    from botocore.config import Config

    # No retries: a failed invoke must count as failed, not be hidden by botocore retrying it.
    config = Config(retries={"total_max_attempts": 1, "mode": "standard"}, read_timeout=600, connect_timeout=10,
                    max_pool_connections=4)
    return boto3.session.Session().client(
        "sagemaker-runtime", endpoint_url=f"http://127.0.0.1:{endpoint.port}", region_name="us-east-1",
        aws_access_key_id="x", aws_secret_access_key="x", config=config)


@dataclass
class Record:
    index: int  # position in the trace, which is the order requests were issued
    model: int
    sent: float  # seconds from the start of the run
    latency: float  # seconds
    error: str = ""


def invoke(client: Any, model: int, head: list[float]) -> str:
    """One invoke_endpoint; '' when it answered right, else what went wrong."""
    try:
        answer = client.invoke_endpoint(EndpointName=ENDPOINT, TargetModel=target(model),
                                        ContentType="application/json", Body=BODY)
        payload = json.loads(answer["Body"].read())
    except Exception as exc:  # noqa: BLE001 - any failure is a failed request, reported by kind
        response = getattr(exc, "response", None) or {}
        status = response.get("ResponseMetadata", {}).get("HTTPStatusCode", "")
        return f"{type(exc).__name__} {status}: {str(exc)[:300]}".strip()
    try:
        data = next(o["data"] for o in payload["outputs"] if o["name"] == "OUTPUT0")
    except (KeyError, StopIteration, TypeError):
        return f"unexpected answer: {json.dumps(payload)[:300]}"
    want = [x + w for x, w in zip(INPUT, head)]
    if len(data) != 4 or any(abs(x - y) > 1e-4 for x, y in zip(data, want)):
        return f"wrong answer from {target(model)}: {data} != {want}"
    return ""


def run_trace(endpoint: Endpoint, trace: list[int], threads: int, heads: dict[int, list[float]]) -> list[Record]:
    """Send ``trace`` from ``threads`` closed-loop clients; each takes the next request when its last one
    answered, so the order requests were issued is the trace's."""
    clients = [runtime_client(endpoint) for _ in range(threads)]
    records: list[Record | None] = [None] * len(trace)
    next_index = itertools.count()
    lock = threading.Lock()
    started = time.perf_counter()

    def client_loop(client: Any) -> None:
        while True:
            with lock:
                index = next(next_index)
            if index >= len(trace):
                return
            model = trace[index]
            sent = time.perf_counter()
            error = invoke(client, model, heads[model])
            records[index] = Record(index, model, sent - started, time.perf_counter() - sent, error)

    workers = [threading.Thread(target=client_loop, args=(client,), daemon=True) for client in clients]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    return [r for r in records if r is not None]


# --- the two runs ---------------------------------------------------------------------------------------------------

@dataclass
class Args:
    models: int
    requests: int
    threads: int
    weights_mb: float
    zipf_s: float
    seed: int
    fit: float
    cold_samples: int
    sample_interval: float
    metrics_interval: float
    server_cpu: int | None
    load_cpu: int | None
    work_dir: Path
    out: Path | None
    data: str
    skip_all_loaded: bool
    serial_requests: int
    traces: list[str]  # what the limited runs replay: zipf<s> or shift<s> (the ranks dealt again halfway)
    policies: list[str]  # --sagemaker-eviction-policy of the limited runs
    seeds: int  # --simulate: seeds per trace


def say(message: str) -> None:
    print(f"[sagemaker_mme {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def errors_summary(records: list[Record]) -> dict[str, Any]:
    failed = [r for r in records if r.error]
    kinds = Counter(r.error.split(":")[0] for r in failed)
    return {"failed": len(failed), "kinds": dict(kinds.most_common(10)),
            "first": [f"#{r.index} {target(r.model)}: {r.error}" for r in failed[:5]]}


def all_loaded_run(args: Args, data_url: str, env: dict[str, str], trace: list[int],
                   heads: dict[int, list[float]]) -> dict[str, Any]:
    """No limit: cold loads, one model's footprint, then everything warmed and the trace replayed (all hits)."""
    endpoint = start_endpoint(args.work_dir, "all-loaded", data_url, env, None, args.server_cpu)
    try:
        time.sleep(0.5)
        base_tree, base_workers, _ = tree_memory(endpoint.proc.pid)
        client = runtime_client(endpoint)
        cold: list[dict[str, Any]] = []
        footprint: dict[str, Any] = {}
        for index in range(min(args.cold_samples, args.models)):
            before = scrape(endpoint.metrics_port)
            sent = time.perf_counter()
            error = invoke(client, index, heads[index])
            latency = time.perf_counter() - sent
            after = scrape(endpoint.metrics_port)
            if error:
                raise RuntimeError(f"cold load of {target(index)} failed: {error}; log: {endpoint.log_path}")
            cold.append({"model": target(index), "first_invoke_ms": latency * 1e3,
                         "downloading_ms": mean_delta_ms(after, before, "sagemaker_model_downloading_time_us"),
                         "loading_ms": mean_delta_ms(after, before, "sagemaker_model_loading_time_us"),
                         "loading_wait_ms": mean_delta_ms(after, before, "sagemaker_model_loading_wait_time_us")})
            say(f"cold load {target(index)}: {latency * 1e3:.0f} ms")
            if index == 0:
                time.sleep(0.5)  # let the worker settle before measuring it
                tree, workers, processes = tree_memory(endpoint.proc.pid)
                metric = scrape(endpoint.metrics_port).get(f'sagemaker_model_memory_bytes{{model="{target(0)}"}}')
                footprint = {"worker_pss_bytes": workers - base_workers, "tree_growth_bytes": tree - base_tree,
                             "server_metric_bytes": metric, "processes": processes,
                             "base_tree_bytes": base_tree}
                say(f"one loaded model: worker PSS {mib(footprint['worker_pss_bytes'])}, server's measure "
                    f"{mib(metric)}, tree growth {mib(footprint['tree_growth_bytes'])}")
        result: dict[str, Any] = {"cold_load": cold, "footprint": footprint}
        if args.skip_all_loaded:
            return result
        say(f"warming all {args.models} models")
        warm = [r for r in run_trace(endpoint, list(range(args.models)), args.threads, heads) if r.error]
        if warm:
            raise RuntimeError(f"warming failed: {warm[0].error}; log: {endpoint.log_path}")
        before = scrape(endpoint.metrics_port)
        loaded = before.get("sagemaker_loaded_model_count", 0)
        say(f"all-loaded: {loaded:.0f} models, {mib(before.get('sagemaker_memory_used_bytes'))}; replaying "
            f"{len(trace)} requests")
        started = time.perf_counter()
        records = run_trace(endpoint, trace, args.threads, heads)
        duration = time.perf_counter() - started
        # One client: the concurrency the limited run's hits mostly see (its other clients wait on loads).
        serial = run_trace(endpoint, trace[:args.serial_requests], 1, heads)
        after = scrape(endpoint.metrics_port)
        per_model = [v for k, v in before.items() if k.startswith("sagemaker_model_memory_bytes{")]
        result["all_loaded"] = {
            "loaded_models": loaded, "memory_used_bytes": before.get("sagemaker_memory_used_bytes"),
            "mean_model_bytes_all_loaded": statistics.fmean(per_model) if per_model else None,
            "tree_bytes": tree_memory(endpoint.proc.pid)[0], "duration_s": duration,
            "requests": len(records), **errors_summary(records),
            "cache_misses": delta(after, before, "sagemaker_model_cache_miss_total"),
            "latency": latency_summary([r.latency for r in records if not r.error]),
            "in_flight": sum(r.latency for r in records) / duration,  # Little's law: mean requests in flight
            "serial_failed": errors_summary(serial)["failed"],
            "latency_serial": latency_summary([r.latency for r in serial if not r.error]),
        }
        return result
    finally:
        stop(endpoint.proc)


def limited_run(args: Args, data_url: str, env: dict[str, str], trace: list[int], heads: dict[int, list[float]],
                limit: int, miss_threshold: float, policy: str = "gdsf") -> dict[str, Any]:
    endpoint = start_endpoint(args.work_dir, "limited", data_url, env, limit, args.server_cpu,
                              extra=("--sagemaker-eviction-policy", policy))
    try:
        # The idle baseline after one load and unload: the server's own one-time growth (its S3 client, the
        # archive code) is then in it, and what the tree grows by during the run is the models'.
        error = invoke(runtime_client(endpoint), 0, heads[0])
        if error:
            raise RuntimeError(f"first invoke failed: {error}; log: {endpoint.log_path}")
        unload(endpoint, target(0))
        time.sleep(0.5)
        idle = [tree_memory(endpoint.proc.pid) for _ in range(5)]
        base_tree = min(tree for tree, _, _ in idle)
        base_server = min(tree - workers for tree, workers, _ in idle)
        sampler = TreeSampler(endpoint.proc.pid, args.sample_interval)
        poller = MetricsPoller(endpoint.metrics_port, args.metrics_interval)
        before = scrape(endpoint.metrics_port)
        say(f"limited ({policy}): limit {mib(limit)}; replaying {len(trace)} requests from {args.threads} threads")
        sampler.start()
        poller.start()
        started = time.perf_counter()
        records = run_trace(endpoint, trace, args.threads, heads)
        duration = time.perf_counter() - started
        peaks = sampler.stop()
        poller.stop()
        after = scrape(endpoint.metrics_port)
    finally:
        stop(endpoint.proc)
    hits = delta(after, before, "sagemaker_model_cache_hit_total")
    misses = delta(after, before, "sagemaker_model_cache_miss_total")
    loads = delta(after, before, "sagemaker_model_loading_time_us_count")
    ok = [r for r in records if not r.error]
    slow = [r for r in ok if r.latency >= miss_threshold]
    fast = [r for r in ok if r.latency < miss_threshold]
    models_peak = peaks["max_tree"] - base_tree
    return {
        "policy": policy, "limit_bytes": limit, "duration_s": duration, "requests": len(records),
        **errors_summary(records),
        "invocations": delta(after, before, "sagemaker_invocations_total"),
        "cache_hits": hits, "cache_misses": misses, "loads": loads,
        "evictions": delta(after, before, "sagemaker_model_evictions_total"),
        "hit_ratio": hits / (hits + misses) if hits + misses else None,
        "hit_ratio_loads": 1 - loads / len(records) if records else None,
        "hit_ratio_timing": len(fast) / len(ok) if ok else None,
        "miss_threshold_ms": miss_threshold * 1e3,
        "loading_ms": mean_delta_ms(after, before, "sagemaker_model_loading_time_us"),
        "downloading_ms": mean_delta_ms(after, before, "sagemaker_model_downloading_time_us"),
        "unloading_ms": mean_delta_ms(after, before, "sagemaker_model_unloading_time_us"),
        "max_loaded_models": poller.max_loaded,
        "memory": {
            "limit_bytes": limit, "base_tree_bytes": base_tree, "base_server_bytes": base_server,
            "max_tree_bytes": peaks["max_tree"], "max_models_bytes": models_peak, "slack_bytes": limit - models_peak,
            "max_server_bytes": peaks["max_root"],
            "max_workers_bytes": peaks["max_workers"], "workers_slack_bytes": limit - peaks["max_workers"],
            "max_metric_used_bytes": poller.max_used, "metric_slack_bytes": limit - poller.max_used,
            "max_processes": peaks["max_processes"], "samples": peaks["samples"],
            "sample_period_ms": peaks["period_ms"], "metric_samples": poller.samples,
            "series": peaks["series"],
        },
        "latency_hits": latency_summary([r.latency for r in fast]),
        "hits_in_flight": sum(r.latency for r in fast) / duration,  # Little's law: mean hits in flight
        "latency_misses": latency_summary([r.latency for r in slow]),
        "latency_all": latency_summary([r.latency for r in ok]),
    }


def offline(trace: list[int], ks: list[int]) -> dict[str, dict[str, float]]:
    """Hit ratios of Belady's MIN, LRU, LFU and naiad's GDSF (equal sizes and load times) on the issued trace
    for each cache capacity in ``ks``."""
    n = len(trace)
    return {str(k): {"belady": belady_hits(trace, k) / n, "lru": lru_hits(trace, k) / n, "lfu": lfu_hits(trace, k) / n,
                     "gdsf": replay(GdsfPolicy(), trace, [1] * (max(trace, default=0) + 1), k, lambda _: 1.0) / n}
            for k in ks}


def mib(value: float | int | None) -> str:
    return "-" if value is None else f"{value / (1 << 20):.1f} MiB"


def fmt(value: float | int | None, spec: str = ".1f") -> str:
    return "-" if value is None else format(value, spec)


def table(results: dict[str, Any]) -> str:
    limited, base = results.get("limited", {}), results.get("all_loaded") or {}
    mem = limited.get("memory", {})
    cold = results.get("cold_load", [])
    opt = results.get("optimal", {})
    k = opt.get("k")
    sim = opt.get("by_k", {}).get(str(k), {})
    rows = [
        ("requests (limited run)", f"{limited.get('requests')} from {results['config']['threads']} threads, "
                                   f"{fmt(limited.get('duration_s'))} s"),
        ("failed requests", f"{limited.get('failed')} limited, {base.get('failed', '-')} all-loaded (target 0)"),
        ("memory limit", f"{mib(mem.get('limit_bytes'))} = {results['config']['fit']} x one model "
                         f"({mib(results.get('footprint', {}).get('worker_pss_bytes'))} worker PSS)"),
        ("tree PSS max - idle server", f"{mib(mem.get('max_models_bytes'))}, slack {mib(mem.get('slack_bytes'))} "
                                       f"(max {mib(mem.get('max_tree_bytes'))}, idle {mib(mem.get('base_tree_bytes'))}"
                                       f", {mem.get('samples')} samples every {fmt(mem.get('sample_period_ms'))} ms)"),
        ("workers' PSS max", f"{mib(mem.get('max_workers_bytes'))}, slack {mib(mem.get('workers_slack_bytes'))}"),
        ("server process PSS", f"idle {mib(mem.get('base_server_bytes'))}, max {mib(mem.get('max_server_bytes'))} "
                               "(outside the limit)"),
        ("sagemaker_memory_used max", f"{mib(mem.get('max_metric_used_bytes'))}, slack "
                                      f"{mib(mem.get('metric_slack_bytes'))}"),
        ("models resident (max)", f"{fmt(limited.get('max_loaded_models'), '.0f')}; k for Belady = {k}"),
        ("hit ratio, 1 - loads/requests", f"{fmt(limited.get('hit_ratio_loads'), '.3f')} "
                                          f"({fmt(limited.get('loads'), '.0f')} loads, "
                                          f"{fmt(limited.get('evictions'), '.0f')} evictions)"),
        ("hit ratio, server's counter", f"{fmt(limited.get('hit_ratio'), '.3f')} "
                                        f"({fmt(limited.get('cache_hits'), '.0f')} hits, "
                                        f"{fmt(limited.get('cache_misses'), '.0f')} misses; by latency "
                                        f"{fmt(limited.get('hit_ratio_timing'), '.3f')}, miss >= "
                                        f"{fmt(limited.get('miss_threshold_ms'), '.0f')} ms)"),
        (f"Belady-optimal, k={k}", f"{fmt(sim.get('belady'), '.3f')}"),
        ("vs Belady", f"{fmt(opt.get('ratio_fetch'), '.3f')} by loads, {fmt(opt.get('ratio_strict'), '.3f')} by the "
                      "server's counter (target >= 0.9)"),
        ("offline on the same trace", f"LRU {fmt(sim.get('lru'), '.3f')} ({fmt(opt.get('ratio_lru_offline'), '.3f')} "
                                      f"of Belady), LFU {fmt(sim.get('lfu'), '.3f')} "
                                      f"({fmt(opt.get('ratio_lfu_offline'), '.3f')}), GDSF "
                                      f"{fmt(sim.get('gdsf'), '.3f')} ({fmt(opt.get('ratio_gdsf_offline'), '.3f')})"),
    ]
    for sample in cold:
        rows.append((f"cold load {sample['model']}", f"{fmt(sample['first_invoke_ms'], '.0f')} ms first invoke "
                     f"(download+extract {fmt(sample['downloading_ms'], '.0f')} ms, load "
                     f"{fmt(sample['loading_ms'], '.0f')} ms)"))
    hits, misses, all_loaded = (limited.get("latency_hits", {}), limited.get("latency_misses", {}),
                                base.get("latency", {}))
    serial = base.get("latency_serial", {})
    rows += [
        ("cache hits p50 / p99", f"{fmt(hits.get('p50_ms'), '.2f')} / {fmt(hits.get('p99_ms'), '.2f')} ms "
                                 f"({hits.get('count')} requests)"),
        ("all loaded p50 / p99", f"{fmt(all_loaded.get('p50_ms'), '.2f')} / {fmt(all_loaded.get('p99_ms'), '.2f')} ms "
                                 f"({all_loaded.get('count')} requests, {base.get('loaded_models', '-')} models, "
                                 f"{fmt(base.get('in_flight'))} in flight; the hits above: "
                                 f"{fmt(limited.get('hits_in_flight'), '.2f')})"),
        ("all loaded, 1 client", f"{fmt(serial.get('p50_ms'), '.2f')} / {fmt(serial.get('p99_ms'), '.2f')} ms "
                                 f"({serial.get('count')} requests)"),
        ("misses p50 / p99", f"{fmt(misses.get('p50_ms'), '.0f')} / {fmt(misses.get('p99_ms'), '.0f')} ms "
                             f"({misses.get('count')} requests)"),
    ]
    width = max(len(name) for name, _ in rows)
    return "\n".join(f"{name:<{width}}  {value}" for name, value in rows)


def upload(data_dir: Path, models: int, s3: Any) -> None:
    s3.create_bucket(Bucket=BUCKET)
    for index in range(models):
        s3.upload_file(str(data_dir / target(index)), BUCKET, PREFIX + target(index))


def make_trace(spec: str, models: int, requests: int, seed: int) -> list[int]:
    """``zipf<s>``: a Zipf trace; ``shift<s>``: one whose ranks are dealt again halfway."""
    kind, s = parse_trace(spec)
    return (shift_trace if kind == "shift" else zipf_trace)(models, requests, s, seed)


def parse_trace(spec: str) -> tuple[str, float]:
    match = re.fullmatch(r"(zipf|shift)(\d+(?:\.\d+)?)", spec)
    if match is None:
        raise ValueError(f"unknown trace '{spec}': expected zipf<s> or shift<s>, e.g. zipf1.1")
    return match.group(1), float(match.group(2))


def optimal(trace: list[int], limited: dict[str, Any], limit: int, footprint: int, models: int) -> dict[str, Any]:
    nominal = min(models, max(1, limit // footprint))
    k = max(nominal, int(limited["max_loaded_models"] or 0))  # the larger k: the higher (stricter) optimum
    by_k = offline(trace, sorted({nominal, k, max(1, k - 1), k + 1}))
    optimum = by_k[str(k)]["belady"]
    return {
        "k": k, "k_nominal": nominal, "by_k": by_k,
        # Belady's hit ratio is 1 - loads/requests of a serial replay; the server's own counter also calls a
        # miss every request that waited on a load another request had started (a "delayed hit").
        "ratio_fetch": limited["hit_ratio_loads"] / optimum if optimum else None,
        "ratio_strict": limited["hit_ratio"] / optimum if limited["hit_ratio"] is not None and optimum else None,
        "ratio_lru_offline": by_k[str(k)]["lru"] / optimum if optimum else None,
        "ratio_lfu_offline": by_k[str(k)]["lfu"] / optimum if optimum else None,
        "ratio_gdsf_offline": by_k[str(k)]["gdsf"] / optimum if optimum else None,
    }


def run(args: Args) -> dict[str, Any]:
    if args.load_cpu is not None:
        os.sched_setaffinity(0, {args.load_cpu})  # the clients, and moto, which inherits it
    data_dir = args.work_dir / f"archives-{args.weights_mb:g}mb-seed{args.seed}"  # quick runs keep the default set
    heads = build_archives(data_dir, args.models, args.weights_mb, args.seed, say)
    traces = {spec: make_trace(spec, args.models, args.requests, args.seed) for spec in args.traces}
    trace = traces[args.traces[0]]
    config = {**{k: str(v) if isinstance(v, Path) else v for k, v in asdict(args).items()},
              "layout": "repository of one model: model_NN/config.pbtxt, model_NN/1/{model.py,weights.npy}",
              "trace_distinct_models": len(set(trace)),
              "trace_top": Counter(trace).most_common(8)}
    s3_server = None
    runs: list[dict[str, Any]] = []
    try:
        if args.data == "s3":
            from tests.s3 import S3Server

            s3_server = S3Server()
            upload(data_dir, args.models, s3_server.client())
            data_url, env = f"s3://{BUCKET}/{PREFIX}", s3_server.env()
            say(f"uploaded {args.models} archives to {data_url} on moto at {s3_server.endpoint_url}")
        else:
            data_url, env = str(data_dir), {}
        results: dict[str, Any] = {"config": config}
        results.update(all_loaded_run(args, data_url, env, trace, heads))
        footprint = int(results["footprint"]["worker_pss_bytes"])
        limit = int(args.fit * footprint)
        fastest_cold = min(c["first_invoke_ms"] for c in results["cold_load"]) / 1e3
        # A hit answers in milliseconds; a miss costs at least a download, an extraction and a worker start.
        threshold = max(0.05, fastest_cold / 2)
        for spec, replayed in traces.items():
            for policy in args.policies:
                limited = limited_run(args, data_url, env, replayed, heads, limit, threshold, policy)
                runs.append({"trace": spec, "policy": policy, "limited": limited,
                             "optimal": optimal(replayed, limited, limit, footprint, args.models)})
    finally:
        if s3_server is not None:
            s3_server.stop()
    results["runs"] = runs
    results["limited"], results["optimal"] = runs[0]["limited"], runs[0]["optimal"]
    return results


def matrix_table(runs: list[dict[str, Any]]) -> str:
    """The live runs: policy x trace -> hit ratio against Belady, hits' and misses' latency."""
    header = ("trace", "policy", "hits/Belady", "(counter)", "offline", "hits p50/p99 ms", "misses p50/p99 ms",
              "failed")
    rows = [header]
    for r in runs:
        limited, opt = r["limited"], r["optimal"]
        hits, misses = limited.get("latency_hits", {}), limited.get("latency_misses", {})
        rows.append((r["trace"], r["policy"], fmt(opt.get("ratio_fetch"), ".3f"), fmt(opt.get("ratio_strict"), ".3f"),
                     fmt(opt.get(f"ratio_{r['policy']}_offline"), ".3f"),
                     f"{fmt(hits.get('p50_ms'), '.1f')} / {fmt(hits.get('p99_ms'), '.1f')}",
                     f"{fmt(misses.get('p50_ms'), '.0f')} / {fmt(misses.get('p99_ms'), '.0f')}",
                     str(limited.get("failed"))))
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    return "\n".join("  ".join(cell.ljust(width) for cell, width in zip(row, widths)) for row in rows)


# --- simulation: the policy objects driven offline ------------------------------------------------------------------

SIMULATED = ("gdsf", "lru", "lfu", "gdsf-L", "A0")


def simulate(args: Args) -> dict[str, Any]:
    """Every trace over ``args.seeds`` seeds: each policy's hits over Belady's. Models of equal size (``--fit``
    of them fit, Belady's MIN over that many slots is then the optimum) and load times of 0.5 s, each load off
    by a log-normal factor (sigma 0.3) as measured load times are."""
    k = int(args.fit)
    sizes = [1 << 20] * args.models
    results: dict[str, Any] = {"k": k, "models": args.models, "requests": args.requests, "seeds": args.seeds,
                               "traces": {}}
    for spec in args.traces:
        kind, s = parse_trace(spec)
        ratios: dict[str, list[float]] = {name: [] for name in SIMULATED}
        for seed in range(args.seed, args.seed + args.seeds):
            trace = make_trace(spec, args.models, args.requests, seed)
            best = belady_hits(trace, k)
            known = phases(args.models, args.requests, s, seed, kind == "shift")
            hits = {"gdsf": replay(GdsfPolicy(), trace, sizes, k << 20, noisy_costs(0.5, 0.3, seed)),
                    "lru": replay(LruPolicy(), trace, sizes, k << 20, noisy_costs(0.5, 0.3, seed)),
                    "lfu": lfu_hits(trace, k), "gdsf-L": gdsf_inflation_hits(trace, k),
                    "A0": oracle_hits(trace, k, known)}
            for name, value in hits.items():
                ratios[name].append(value / best)
        results["traces"][spec] = {name: {"mean": statistics.fmean(v), "min": min(v), "max": max(v)}
                                   for name, v in ratios.items()}
    return results


def simulation_table(results: dict[str, Any]) -> str:
    traces = list(results["traces"])
    lines = [f"hits / Belady's hits, mean (min) over {results['seeds']} seeds; {results['models']} models, "
             f"{results['requests']} requests, {results['k']} resident",
             "policy   " + "".join(f"{spec:>16}" for spec in traces)]
    for name in SIMULATED:
        cells = [results["traces"][spec][name] for spec in traces]
        lines.append(f"{name:<9}" + "".join(f"{c['mean']:>9.3f} ({c['min']:.3f})" for c in cells))
    lines.append("gdsf: naiad's default; lru: naiad's --sagemaker-eviction-policy=lru; lfu: whole-history counts; "
                 "gdsf-L: classic GDSF (inflation L); A0: knows the true probabilities (the online bound)")
    return "\n".join(lines)


# --- offline checks -------------------------------------------------------------------------------------------------

def brute_force_best(trace: list[int], k: int) -> int:
    """The most hits any demand-loading cache of ``k`` can get: every eviction choice tried."""
    best = 0

    def walk(i: int, cache: frozenset[int], hits: int) -> None:
        nonlocal best
        if hits + len(trace) - i <= best:
            return
        if i == len(trace):
            best = hits
            return
        item = trace[i]
        if item in cache:
            walk(i + 1, cache, hits + 1)
        elif len(cache) < k:
            walk(i + 1, cache | {item}, hits)
        else:
            for victim in cache:
                walk(i + 1, (cache - {victim}) | {item}, hits)

    walk(0, frozenset(), 0)
    return best


def self_check() -> None:
    # The trace: seeded, in range, Zipf-shaped.
    trace = zipf_trace(40, 20_000, 1.1, 7)
    assert trace == zipf_trace(40, 20_000, 1.1, 7) and trace != zipf_trace(40, 20_000, 1.1, 8)
    assert len(trace) == 20_000 and all(0 <= m < 40 for m in trace)
    counts = [c for _, c in Counter(trace).most_common()]
    weights = np.arange(1, 41, dtype=np.float64) ** -1.1
    expected = weights / weights.sum() * len(trace)
    assert abs(counts[0] - expected[0]) < 0.1 * expected[0], (counts[0], expected[0])
    assert abs(counts[9] - expected[9]) < 0.25 * expected[9], (counts[9], expected[9])
    assert sorted(set(trace)) == list(range(40))
    # Belady's MIN is optimal (exhaustive search on small traces) and never below LRU / LFU.
    rng = random.Random(1)
    for _ in range(300):
        small = [rng.randrange(5) for _ in range(rng.randrange(1, 12))]
        for k in (1, 2, 3):
            best = belady_hits(small, k)
            assert best == brute_force_best(small, k), (small, k, best)
            assert lru_hits(small, k) <= best and lfu_hits(small, k) <= best
    assert lru_hits([0, 1, 2, 0, 1, 2], 2) == 0 and belady_hits([0, 1, 2, 0, 1, 2], 2) == 2
    assert lru_hits([0, 1, 0, 2, 0, 1], 2) == 2 and lfu_hits([0, 0, 1, 2, 1, 2], 2) == 1
    assert belady_hits([3, 3, 3], 1) == 2 and lru_hits([], 3) == 0
    long = zipf_trace(40, 2_000, 1.1, 0)
    assert lru_hits(long, 40) == belady_hits(long, 40) == len(long) - len(set(long))
    # naiad's policies replayed: never above the optimum, LRU's object is LRU; A0 and classic GDSF neither.
    for _ in range(200):
        small = [rng.randrange(6) for _ in range(rng.randrange(1, 40))]
        for k in (1, 2, 3, 4):
            best = belady_hits(small, k)
            assert replay(LruPolicy(), small, [1] * 6, k, lambda _: 1.0) == lru_hits(small, k)
            assert replay(GdsfPolicy(), small, [1] * 6, k, noisy_costs(1.0, 0.3, k)) <= best
            assert oracle_hits(small, k, [(0, [1 / 6] * 6)]) <= best and gdsf_inflation_hits(small, k) <= best
    # Sizes count: a budget of 3 holds the two small models or the big one.
    assert replay(LruPolicy(), [0, 1, 2, 0, 1], [1, 1, 3], 3, lambda _: 1.0) == 0
    assert replay(LruPolicy(), [0, 1, 0, 1], [1, 1, 3], 3, lambda _: 1.0) == 2
    # The shifted trace: its first half is the Zipf trace, its second half favours other models.
    shifted = shift_trace(40, 2_000, 1.4, 3)
    assert shifted[:1000] == zipf_trace(40, 1000, 1.4, 3)
    assert Counter(shifted[:1000]).most_common(1)[0][0] != Counter(shifted[1000:]).most_common(1)[0][0]
    first, second = phases(40, 2_000, 1.4, 3, True)
    assert second[0] == 1000 and max(first[1]) == max(second[1]) and first[1] != second[1]
    assert abs(sum(first[1]) - 1) < 1e-9 and parse_trace("shift1.1") == ("shift", 1.1)
    simulated = simulate(Args(**{**asdict(_fake_args()), "models": 12, "requests": 300, "fit": 4, "seeds": 2,
                                 "traces": ["zipf1.1", "shift1.1"]}))
    for ratios in simulated["traces"].values():
        assert all(0 < r["min"] <= r["mean"] <= 1 for r in ratios.values()), ratios
    print(simulation_table(simulated))
    # Percentiles and metrics parsing.
    assert percentile([1, 2, 3, 4, 5], 50) == 3 and percentile([], 99) is None
    assert abs(percentile(list(range(101)), 99) - 99) < 1e-9
    page = ('# HELP sagemaker_invocations_total Invocations\n# TYPE sagemaker_invocations_total counter\n'
            'sagemaker_invocations_total 12.0\nsagemaker_model_memory_bytes{model="model_01.tar.gz"} 6.5e+07\n'
            'sagemaker_model_loading_time_us_sum 3e6\nsagemaker_model_loading_time_us_count 2.0\n')
    values = parse_metrics(page)
    assert values["sagemaker_invocations_total"] == 12
    assert values['sagemaker_model_memory_bytes{model="model_01.tar.gz"}'] == 65e6
    assert mean_delta_ms(values, {}, "sagemaker_model_loading_time_us") == 1500
    assert mean_delta_ms(values, values, "sagemaker_model_loading_time_us") is None
    # An archive: the layout, the weights, and a model.py that runs.
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / target(3)
        head = build_archive(3, 0.01, 5, path)
        with tarfile.open(path) as tar:
            names = sorted(tar.getnames())
            assert names == ["model_03", "model_03/1", "model_03/1/model.py", "model_03/1/weights.npy",
                             "model_03/config.pbtxt"], names
            tar.extractall(tmp, filter="data")
        weights = np.load(Path(tmp) / "model_03" / "1" / "weights.npy")
        assert weights.dtype == np.float32 and weights.nbytes == int(0.01 * (1 << 20)) // 4 * 4
        assert head == [float(x) for x in weights[:4]] and weights.std() > 0.2  # random, not zeros
        assert 'name: "model_03"' in (Path(tmp) / "model_03" / "config.pbtxt").read_text()
        _check_model(Path(tmp) / "model_03", head)
        heads = build_archives(Path(tmp) / "set", 2, 0.01, 5, lambda _: None)
        again = build_archives(Path(tmp) / "set", 3, 0.01, 5, lambda _: None)
        assert heads[1] == again[1] and len(again) == 3 and heads[0] != heads[1]
    # The report renders from a result of the same shape a run produces.
    results = _fake_results()
    text = table(results)
    for needle in ("failed requests", "vs Belady", "cold load model_00.tar.gz", "all loaded p50 / p99",
                   "all loaded, 1 client"):
        assert needle in text, needle
    json.dumps(results)
    record = Record(0, 1, 0.0, 0.5, "ModelError 424: boom")
    assert errors_summary([record, Record(1, 1, 0, 0.1)])["failed"] == 1
    print("the report, rendered from made-up figures:\n" + text)
    print(matrix_table([{"trace": "zipf1.1", "policy": "gdsf", "limited": results["limited"],
                         "optimal": {**results["optimal"], "ratio_gdsf_offline": 0.9}}]))
    print("self-check: ok")


def _check_model(folder: Path, head: list[float]) -> None:
    """Run the archived model.py with naiad's pb_utils (the project root's triton_python_backend_utils)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_model", folder / "1" / "model.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    model = module.TritonPythonModel()
    model.initialize({"model_repository": str(folder), "model_version": "1", "model_config": "{}"})
    import triton_python_backend_utils as pb_utils

    class Request:
        def get_input_tensor_by_name(self, name: str) -> Any:
            return pb_utils.Tensor(name, np.asarray(INPUT, np.float32)) if name == "INPUT0" else None

    responses = model.execute([Request()])
    out = pb_utils.get_output_tensor_by_name(responses[0], "OUTPUT0").as_numpy()
    assert np.allclose(out, np.asarray(INPUT, np.float32) + np.asarray(head, np.float32))


def _fake_args() -> Args:
    return parse_args([])[1]


def _fake_results() -> dict[str, Any]:
    lat = latency_summary([0.002, 0.003, 0.004])
    trace = zipf_trace(10, 200, 1.1, 0)
    return {
        "config": {"threads": 8, "fit": 8.0},
        "footprint": {"worker_pss_bytes": 64 << 20},
        "cold_load": [{"model": "model_00.tar.gz", "first_invoke_ms": 900.0, "downloading_ms": 300.0,
                       "loading_ms": 500.0, "loading_wait_ms": 850.0}],
        "all_loaded": {"failed": 0, "loaded_models": 40, "latency": lat, "in_flight": 7.9, "latency_serial": lat},
        "limited": {"requests": 200, "duration_s": 12.0, "failed": 0, "hit_ratio": 0.5, "hit_ratio_loads": 0.55,
                    "hit_ratio_timing": 0.51, "miss_threshold_ms": 450.0, "cache_hits": 100, "cache_misses": 100,
                    "loads": 90, "evictions": 82, "max_loaded_models": 8,
                    "memory": {"limit_bytes": 512 << 20, "max_models_bytes": 500 << 20, "slack_bytes": 12 << 20,
                               "max_tree_bytes": 600 << 20, "base_tree_bytes": 100 << 20, "samples": 10,
                               "base_server_bytes": 90 << 20, "max_server_bytes": 110 << 20,
                               "sample_period_ms": 51.0, "max_workers_bytes": 490 << 20,
                               "workers_slack_bytes": 22 << 20, "max_metric_used_bytes": 480 << 20,
                               "metric_slack_bytes": 32 << 20},
                    "latency_hits": lat, "hits_in_flight": 0.02, "latency_misses": latency_summary([0.9, 1.2]),
                    "latency_all": lat},
        "optimal": {"k": 8, "by_k": offline(trace, [8]), "ratio_fetch": 0.75, "ratio_strict": 0.7,
                    "ratio_lru_offline": 0.74, "ratio_lfu_offline": 0.8},
    }


# --- command line ---------------------------------------------------------------------------------------------------

def parse_args(argv: list[str] | None = None) -> tuple[argparse.Namespace, Args]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--self-check", action="store_true", help="run the offline checks and exit")
    parser.add_argument("--models", type=int, default=40)
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--weights-mb", type=float, default=30.0, help="each model's weights (MiB of float32)")
    parser.add_argument("--zipf-s", type=float, default=1.1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--fit", type=float,
                        help="the memory limit in loaded models: this many times one model's worker PSS "
                             "(default 8; --simulate: 11, the issue's 600 MB over ~55 MB models)")
    parser.add_argument("--cold-samples", type=int, default=3, help="models whose first invoke is timed alone")
    parser.add_argument("--sample-interval", type=float, default=0.05, help="process tree memory, seconds")
    parser.add_argument("--metrics-interval", type=float, default=0.5, help="/metrics scrapes, seconds")
    parser.add_argument("--server-cpu", type=int, default=1)
    parser.add_argument("--load-cpu", type=int, default=0)
    parser.add_argument("--no-pin", action="store_true", help="run without taskset / CPU affinity")
    parser.add_argument("--data", choices=("s3", "folder"), default="s3",
                        help="archives on the loopback S3 server (default) or in a local folder")
    parser.add_argument("--skip-all-loaded", action="store_true",
                        help="only the cold loads and the footprint before the limited run")
    parser.add_argument("--serial-requests", type=int, default=500,
                        help="requests of the trace replayed again from one client on the all-loaded endpoint")
    parser.add_argument("--work-dir", type=Path, default=Path(tempfile.gettempdir()) / "naiad-sagemaker-mme")
    parser.add_argument("--traces", default="",
                        help="comma-separated traces for the limited runs / --simulate: zipf<s> (e.g. zipf1.1) or "
                             "shift<s> (the ranks dealt again halfway); default: zipf<--zipf-s>, or with "
                             "--simulate zipf0.8,zipf1.1,zipf1.4,shift1.1")
    parser.add_argument("--policies", default="gdsf",
                        help="comma-separated --sagemaker-eviction-policy values: one limited run per trace each")
    parser.add_argument("--simulate", action="store_true",
                        help="no server: drive naiad's policy objects offline over the traces against Belady, LFU, "
                             "classic GDSF and the A0 bound; --fit is then the number of models resident")
    parser.add_argument("--seeds", type=int, default=10, help="--simulate: seeds per trace")
    parser.add_argument("--out", type=Path, help="write the results as JSON here")
    ns = parser.parse_args(argv)
    args = Args(models=ns.models, requests=ns.requests, threads=ns.threads, weights_mb=ns.weights_mb,
                zipf_s=ns.zipf_s, seed=ns.seed, fit=ns.fit if ns.fit is not None else 11.0 if ns.simulate else 8.0,
                cold_samples=max(1, ns.cold_samples),
                sample_interval=ns.sample_interval, metrics_interval=ns.metrics_interval,
                server_cpu=None if ns.no_pin else ns.server_cpu, load_cpu=None if ns.no_pin else ns.load_cpu,
                work_dir=ns.work_dir, out=ns.out, data=ns.data, skip_all_loaded=ns.skip_all_loaded,
                serial_requests=ns.serial_requests, policies=ns.policies.split(","), seeds=ns.seeds,
                traces=(ns.traces or ("zipf0.8,zipf1.1,zipf1.4,shift1.1" if ns.simulate else f"zipf{ns.zipf_s:g}")
                        ).split(","))
    try:
        for spec in args.traces:
            parse_trace(spec)
    except ValueError as exc:
        parser.error(str(exc))
    if not set(args.policies) <= set(POLICIES):
        parser.error(f"--policies: expected some of {', '.join(POLICIES)}, got {ns.policies}")
    return ns, args


def main(argv: list[str] | None = None) -> int:
    ns, args = parse_args(argv)
    if ns.self_check:
        self_check()
        return 0
    if ns.simulate:
        simulated = simulate(args)
        print(simulation_table(simulated))
        if args.out is not None:
            args.out.write_text(json.dumps(simulated, indent=1))
        return 0
    args.work_dir.mkdir(parents=True, exist_ok=True)
    results = run(args)
    print(table(results))
    print(matrix_table(results["runs"]))
    if args.out is not None:
        args.out.write_text(json.dumps(results, indent=1))
        say(f"results written to {args.out}")
    failed = results["limited"]["failed"] + (results.get("all_loaded") or {}).get("failed", 0)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
