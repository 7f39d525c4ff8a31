#!/usr/bin/env python3
"""Side-by-side HTTP benchmark of the `add_sub` model: naiad vs NVIDIA Triton 2.51 (vs MLServer 1.7.1).

Each server is started alone, pinned to one CPU core, checked for readiness and for a correct answer,
warmed up, then loaded with wrk (pinned to another core) at each connection level. The servers never run
at the same time, so they never compete for the core. See docs/benchmarks/http.md.

Stdlib only; external tools: wrk, taskset, /work/shared/peers/{triton,mlserver}.sh.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

from interpreter import describe_command  # a sibling script (this folder is not a package)

BENCH_DIR = Path(__file__).resolve().parent
PROJECT_DIR = BENCH_DIR.parent
LUA_SCRIPT = BENCH_DIR / "wrk_infer.lua"
MLSERVER_MODEL_DIR = BENCH_DIR / "mlserver_add_sub"
PEERS_DIR = Path(os.environ.get("NAIAD_PEERS_SCRIPTS", "/work/shared/peers"))
DEFAULT_REPO = PROJECT_DIR / "examples" / "model_repository"
MODEL = "add_sub"
INFER_PATH = f"/v2/models/{MODEL}/infer"
KNOWN_PEERS = ("triton", "mlserver")


@dataclass
class Server:
    """How to launch one server under test; `argv` is built once free ports are known."""

    name: str
    argv: list[str]
    http_port: int
    cwd: Path
    env: dict[str, str] = field(default_factory=dict)
    stop_timeout: float = 10.0  # grace period after SIGTERM before SIGKILL of the process group


@dataclass
class Result:
    server: str
    connections: int
    requests: int
    duration_s: float
    rps: float
    p50_ms: float
    p90_ms: float
    p99_ms: float
    mean_ms: float
    errors: int
    cpu_us_per_request: float | None = None  # CPU time of the server and its children (stubs, workers)
    ratio_vs_triton: float | None = None


# ---------------------------------------------------------------------------------------------
# Request body: read from the Lua script so wrk and the correctness check use the very same bytes.
# ---------------------------------------------------------------------------------------------

def load_body(lua_path: Path) -> bytes:
    """Concatenate the single-quoted string literals of the `wrk.body = ...` statement."""
    text = lua_path.read_text()
    match = re.search(r"^wrk\.body\s*=(.*?)(?:\n\s*\n)", text, re.S | re.M)
    if not match:
        raise SystemExit(f"cannot find `wrk.body = ...` in {lua_path}")
    body = "".join(re.findall(r"'([^']*)'", match.group(1)))
    json.loads(body)  # fail early if the Lua edit broke the JSON
    return body.encode()


def expected_outputs(body: bytes) -> dict[str, list[float]]:
    """add_sub semantics: OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 - INPUT1 (derived from the body)."""
    inputs = {i["name"]: i["data"] for i in json.loads(body)["inputs"]}
    a, b = inputs["INPUT0"], inputs["INPUT1"]
    return {"OUTPUT0": [x + y for x, y in zip(a, b)], "OUTPUT1": [x - y for x, y in zip(a, b)]}


# ---------------------------------------------------------------------------------------------
# Process management
# ---------------------------------------------------------------------------------------------

def free_port() -> int:
    """Ask the kernel for an unused port so runs never collide with a dev server on 8000."""
    from naiad.core.free_ports import free_port as pick  # NAIAD_PORT_RANGE confines it

    return pick()


def server_env(extra: dict[str, str]) -> dict[str, str]:
    """Our environment minus the interpreter dir a pyenv shim prepends to PATH.

    When this script runs under a pyenv shim, PATH starts with ~/.pyenv/versions/X/bin. Triton's python
    backend stub embeds Debian's libpython and locates its prefix by finding `python3` on PATH; with that
    entry first it picks pyenv's stdlib/site-packages and fails with "No module named 'numpy'".
    """
    env = {**os.environ, **extra}
    root = env.get("PYENV_ROOT")
    if root:
        versions = os.path.join(root, "versions") + os.sep
        env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep)
                                      if not p.startswith(versions))
    return env


def start(server: Server, cpu: int, log_path: Path) -> subprocess.Popen:
    """Launch pinned to `cpu`; children (Triton python stubs, MLServer workers) inherit the affinity.

    start_new_session puts the server in its own process group so stop() can reach its children too.
    """
    argv = ["taskset", "-c", str(cpu), *server.argv]
    log = open(log_path, "wb")
    env = server_env(server.env)
    return subprocess.Popen(argv, cwd=server.cwd, env=env, stdout=log, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, start_new_session=True)


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False


def stop(proc: subprocess.Popen, timeout: float = 10.0) -> None:
    """Graceful first, so servers clean up their shared memory / semaphores; SIGKILL only as a last resort.

    Signals go to the leader so it shuts its own workers down. The follow-up SIGINT is what makes uvicorn
    (MLServer) force-quit when it hangs in "Waiting for background tasks to complete" after a loaded run;
    uvicorn only force-exits on SIGINT once shutdown has begun.
    """
    for sig in (signal.SIGTERM, signal.SIGINT):
        if proc.poll() is not None:
            break
        proc.send_signal(sig)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pass
    # Give children (Triton python stubs, MLServer's worker and multiprocessing resource tracker) a moment
    # to finish their own cleanup, then make sure nothing of the group outlives the run.
    deadline = time.monotonic() + 2.0
    while group_alive(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def http(method: str, url: str, body: bytes | None = None, timeout: float = 5.0) -> tuple[int, bytes]:
    req = urllib.request.Request(url, data=body, method=method,
                                 headers={"Content-Type": "application/json"} if body else {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def wait_ready(base: str, proc: subprocess.Popen, timeout: float) -> None:
    """Poll GET /v2/health/ready; bail out early if the server process died."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with code {proc.returncode} before becoming ready")
        try:
            if http("GET", base + "/v2/health/ready", timeout=2)[0] == 200:
                return
        except (OSError, urllib.error.URLError):
            pass
        time.sleep(0.25)
    raise RuntimeError(f"not ready after {timeout:.0f}s")


def verify(base: str, body: bytes) -> None:
    """One request before timing: a fast server that answers wrong (or 4xx) must not get a number."""
    status, raw = http("POST", base + INFER_PATH, body)
    if status != 200:
        raise RuntimeError(f"infer returned HTTP {status}: {raw[:300]!r}")
    got = {o["name"]: o["data"] for o in json.loads(raw)["outputs"]}
    for name, want in expected_outputs(body).items():
        data = got.get(name)
        if data is None or len(data) != len(want) or any(abs(x - y) > 1e-5 for x, y in zip(data, want)):
            raise RuntimeError(f"{name}: expected {want}, got {data}")


# ---------------------------------------------------------------------------------------------
# Load generation
# ---------------------------------------------------------------------------------------------

def run_wrk(url: str, connections: int, duration: int, cpu: int) -> dict:
    """One wrk run; the Lua done() hook prints a `WRK_JSON {...}` line we parse (latencies in us)."""
    argv = ["taskset", "-c", str(cpu), "wrk", "-t1", f"-c{connections}", f"-d{duration}s",
            "--timeout", "10s", "-s", str(LUA_SCRIPT), url]
    out = subprocess.run(argv, capture_output=True, text=True, check=True, timeout=duration + 60).stdout
    for line in out.splitlines():
        if line.startswith("WRK_JSON "):
            return json.loads(line[len("WRK_JSON "):])
    raise RuntimeError(f"no WRK_JSON line in wrk output:\n{out}")


def to_result(server: str, connections: int, raw: dict) -> Result:
    lat = raw["latency_us"]
    secs = raw["duration_us"] / 1e6
    return Result(server=server, connections=connections, requests=raw["requests"],
                  duration_s=round(secs, 3), rps=round(raw["requests"] / secs, 1),
                  p50_ms=lat["p50"] / 1000, p90_ms=lat["p90"] / 1000, p99_ms=lat["p99"] / 1000,
                  mean_ms=round(lat["mean"] / 1000, 3), errors=sum(raw["errors"].values()))


def tree_cpu_seconds(pid: int) -> float:
    """User + system CPU time of ``pid`` and all its descendants, from /proc. Less sensitive than req/s to
    what else runs on the box: time the server waits for the core doesn't count."""
    total, stack = 0, [pid]
    while stack:
        p = stack.pop()
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])  # utime, stime (clock ticks)
            for task in os.listdir(f"/proc/{p}/task"):
                stack += [int(c) for c in Path(f"/proc/{p}/task/{task}/children").read_text().split()]
        except (FileNotFoundError, ProcessLookupError):
            continue
    return total / os.sysconf("SC_CLK_TCK")


def bench_server(server: Server, args: argparse.Namespace, body: bytes, workdir: Path,
                 log: Callable[[str], None]) -> list[Result]:
    """Start -> ready -> verify -> warmup -> each connection level -> stop. Always stops the server."""
    base = f"http://127.0.0.1:{server.http_port}"
    log_path = workdir / f"{server.name}.log"
    log(f"[{server.name}] starting: {shlex.join(server.argv)}  (log: {log_path})")
    proc = start(server, args.server_cpu, log_path)
    try:
        t0 = time.monotonic()
        wait_ready(base, proc, args.ready_timeout)
        log(f"[{server.name}] ready after {time.monotonic() - t0:.1f}s")
        verify(base, body)
        log(f"[{server.name}] response verified")
        if args.warmup > 0:
            run_wrk(base + INFER_PATH, max(args.connections), args.warmup, args.wrk_cpu)
        results = []
        for conns in args.connections:
            cpu0 = tree_cpu_seconds(proc.pid)
            res = to_result(server.name, conns, run_wrk(base + INFER_PATH, conns, args.duration, args.wrk_cpu))
            if res.requests:
                res.cpu_us_per_request = round((tree_cpu_seconds(proc.pid) - cpu0) * 1e6 / res.requests, 1)
            log(f"[{server.name}] c={conns:<4} {res.rps:>10.1f} req/s  p50 {res.p50_ms:.2f} ms"
                f"  p99 {res.p99_ms:.2f} ms  errors {res.errors}")
            results.append(res)
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with code {proc.returncode} during the run")
        return results
    except Exception:
        tail = log_path.read_bytes()[-2000:].decode(errors="replace") if log_path.exists() else ""
        log(f"[{server.name}] --- last lines of its log ---\n{tail}")
        raise
    finally:
        t0 = time.monotonic()
        stop(proc, server.stop_timeout)
        log(f"[{server.name}] stopped in {time.monotonic() - t0:.1f}s")


# ---------------------------------------------------------------------------------------------
# Server definitions
# ---------------------------------------------------------------------------------------------

def naiad_server(args: argparse.Namespace) -> Server:
    port = free_port()
    argv = [*shlex.split(args.naiad_cmd), "--model-repository", str(args.repo), "--http-port", str(port),
            "--grpc-port", str(free_port()), "--metrics-port", str(free_port())]
    # Run from the project root so `python -m naiad` works without installing the package.
    return Server("naiad", argv, port, PROJECT_DIR)


def triton_server(args: argparse.Namespace, workdir: Path) -> Server:
    http_port, grpc_port, metrics_port = free_port(), free_port(), free_port()
    argv = [str(PEERS_DIR / "triton.sh"), "run", str(args.repo), str(http_port), str(grpc_port), str(metrics_port)]
    # Neutral cwd: the project root has its own triton_python_backend_utils.py, which the stub would import.
    # Generous stop grace: a SIGKILLed Triton leaves its python-backend shared memory in /dev/shm.
    return Server("triton", argv, http_port, workdir, stop_timeout=20.0)


def mlserver_server(args: argparse.Namespace, workdir: Path) -> Server:
    """MLServer needs its own layout: settings.json + <model>/model-settings.json + the MLModel class."""
    root = workdir / "mlserver_repo"
    shutil.copytree(MLSERVER_MODEL_DIR, root / MODEL, ignore=shutil.ignore_patterns("__pycache__"))
    http_port = free_port()
    settings = {
        "http_port": http_port, "grpc_port": free_port(), "metrics_port": free_port(),
        # debug=true (MLServer's default) turns on per-request access logs; Triton and naiad don't log
        # each request, so leave it off to compare serving paths rather than logging.
        "debug": False,
        # parallel_workers=1 (the default) runs inference in one worker process, like Triton's stub.
    }
    (root / "settings.json").write_text(json.dumps(settings, indent=2))
    # Short grace per signal: after a loaded run uvicorn waits for background tasks indefinitely,
    # and the follow-up SIGINT is what makes it quit (see stop()).
    return Server("mlserver", [str(PEERS_DIR / "mlserver.sh"), "run", str(root)], http_port, workdir,
                  stop_timeout=3.0)


# ---------------------------------------------------------------------------------------------
# Reporting
# ---------------------------------------------------------------------------------------------

def add_ratios(results: list[Result]) -> None:
    triton = {r.connections: r.rps for r in results if r.server == "triton"}
    for r in results:
        base = triton.get(r.connections)
        r.ratio_vs_triton = round(r.rps / base, 3) if base else None


def table(results: list[Result]) -> str:
    head = (f"{'server':<10} {'conns':>5} {'req/s':>10} {'p50 ms':>8} {'p99 ms':>8} {'errors':>6} {'vs triton':>9}"
            f" {'cpu us/req':>10}")
    lines = [head, "-" * len(head)]
    order = ["naiad", *KNOWN_PEERS]  # naiad first, then the reference it is compared against
    for r in sorted(results, key=lambda r: (r.connections, order.index(r.server))):
        ratio = f"{r.ratio_vs_triton:.2f}x" if r.ratio_vs_triton is not None else "-"
        cpu = f"{r.cpu_us_per_request:.1f}" if r.cpu_us_per_request is not None else "-"
        lines.append(f"{r.server:<10} {r.connections:>5} {r.rps:>10.1f} {r.p50_ms:>8.2f} {r.p99_ms:>8.2f}"
                     f" {r.errors:>6} {ratio:>9} {cpu:>10}")
    return "\n".join(lines)


def parse_int_list(text: str) -> list[int]:
    return [int(x) for x in text.replace(",", " ").split()]


def parse_peers(text: str) -> list[str]:
    peers = [p for p in text.replace(",", " ").split() if p and p != "none"]
    unknown = set(peers) - set(KNOWN_PEERS)
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown peers {sorted(unknown)}; choose from {KNOWN_PEERS}")
    return peers


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repo", type=Path, default=DEFAULT_REPO, help="Triton model repository holding add_sub")
    p.add_argument("--duration", type=int, default=10, help="seconds per server per connection level")
    p.add_argument("--warmup", type=int, default=3, help="warmup seconds per server (0 disables)")
    p.add_argument("--connections", type=parse_int_list, default=[1, 8, 64],
                   help="connection levels, e.g. '1,8,64' (default)")
    p.add_argument("--peers", type=parse_peers, default=list(KNOWN_PEERS),
                   help="comparison servers: 'triton,mlserver' (default), 'triton', or 'none'")
    p.add_argument("--naiad-cmd", default="python -m naiad serve",
                   help="command prefix; --model-repository/--http-port are appended")
    p.add_argument("--no-naiad", action="store_true", help="benchmark only the peers")
    p.add_argument("--server-cpu", type=int, default=1, help="core the server under test is pinned to")
    p.add_argument("--wrk-cpu", type=int, default=0, help="core wrk is pinned to")
    p.add_argument("--ready-timeout", type=float, default=120.0, help="seconds to wait for /v2/health/ready")
    p.add_argument("--json-out", type=Path, help="also write results + settings as JSON here")
    p.add_argument("--keep-logs", action="store_true", help="keep the temp dir with server logs")
    args = p.parse_args(argv)
    args.repo = args.repo.resolve()
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    log = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731 - progress to stderr, table to stdout
    needs_repo = not args.no_naiad or "triton" in args.peers  # MLServer uses its own copy of the model
    if needs_repo and not (args.repo / MODEL / "config.pbtxt").exists():
        log(f"error: {args.repo}/{MODEL}/config.pbtxt not found (use --repo)")
        return 2
    for tool in ("wrk", "taskset"):
        if shutil.which(tool) is None:
            log(f"error: `{tool}` not found on PATH")
            return 2
    if not args.no_naiad:
        log(f"naiad runs on {describe_command(args.naiad_cmd)}")
    body = load_body(LUA_SCRIPT)
    workdir = Path(tempfile.mkdtemp(prefix="naiad-bench-"))

    # naiad first, then peers: order is fixed so repeated runs are comparable.
    builders: list[Callable[[], Server]] = []
    if not args.no_naiad:
        builders.append(lambda: naiad_server(args))
    if "triton" in args.peers:
        builders.append(lambda: triton_server(args, workdir))
    if "mlserver" in args.peers:
        builders.append(lambda: mlserver_server(args, workdir))

    results: list[Result] = []
    failures: dict[str, str] = {}
    for build in builders:
        server = build()
        try:
            results += bench_server(server, args, body, workdir, log)
        except Exception as e:  # one broken server should not cost the others' numbers
            failures[server.name] = f"{type(e).__name__}: {e}"
            log(f"[{server.name}] FAILED: {failures[server.name]}")

    add_ratios(results)
    print(f"\nadd_sub over HTTP/JSON, {args.duration}s per level, server on cpu {args.server_cpu},"
          f" wrk -t1 on cpu {args.wrk_cpu}\n")
    print(table(results))
    for name, why in failures.items():
        print(f"{name}: FAILED ({why})")

    if args.json_out:
        payload = {
            "benchmark": "http_add_sub", "model": MODEL, "repo": str(args.repo),
            "duration_s": args.duration, "warmup_s": args.warmup, "connections": args.connections,
            "server_cpu": args.server_cpu, "wrk_cpu": args.wrk_cpu, "naiad_cmd": args.naiad_cmd,
            "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "cpu_count": os.cpu_count(),
            "results": [asdict(r) for r in results], "failures": failures,
        }
        args.json_out.write_text(json.dumps(payload, indent=2) + "\n")
        log(f"wrote {args.json_out}")
    if args.keep_logs or failures:
        log(f"server logs kept in {workdir}")
    else:
        shutil.rmtree(workdir, ignore_errors=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
