#!/usr/bin/env python3
"""Side-by-side benchmark of SageMaker's single-model endpoint route: naiad vs NVIDIA Triton 2.51.

Both servers run in SageMaker mode (``--allow-sagemaker=true``, ``SAGEMAKER_TRITON_DEFAULT_MODEL_NAME=add_sub``,
explicit model control, gRPC and metrics off) serving the same ``add_sub`` python model. Each is started
alone, pinned to one core, and loaded with wrk from the other core on these routes:

  v2      POST /v2/models/add_sub/infer on the HTTP port, KServe v2 JSON (the reference: naiad's own route)
  json    POST /invocations, the same KServe v2 JSON body
  binary  POST /invocations, application/vnd.sagemaker-triton.binary+json;json-header-size=N, FP32 inputs and
          outputs as binary tensors (what tritonclient's generate_request_body makes for SageMaker)
  mme     POST /models/<key>/invoke after POST /models (multi-model endpoint; opt-in: it writes a copy of the
          model under /opt/ml/models, the only models root Triton 2.51 accepts)

The HTTP port is only opened when the v2 route is measured (``--allow-http=false`` otherwise, as SageMaker runs
Triton). Method, pinning, wrk's JSON summary and the CPU accounting are those of http_add_sub.py, whose helpers
this script imports. See docs/benchmarks/sagemaker-invocations.md.

Stdlib only; external tools: wrk, taskset, /work/shared/peers/triton.sh; py-spy for --profile-dir.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import struct
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))
from http_add_sub import (  # noqa: E402
    DEFAULT_REPO,
    LUA_SCRIPT,
    PEERS_DIR,
    PROJECT_DIR,
    Result,
    Server,
    expected_outputs,
    free_port,
    load_body,
    parse_int_list,
    start,
    stop,
    to_result,
    tree_cpu_seconds,
)

MODEL = "add_sub"
ROUTES = ("v2", "json", "binary", "mme")
DEFAULT_ROUTES = ("v2", "json", "binary")
SERVERS = ("naiad", "triton")
BINARY_JSON = "application/vnd.sagemaker-triton.binary+json;json-header-size="
SAGEMAKER_ENV = {"SAGEMAKER_TRITON_DEFAULT_MODEL_NAME": MODEL}
MODELS_ROOT = Path("/opt/ml/models")  # Triton 2.51 hard-codes it in its MME url check
MME_KEY = f"naiadbench{os.getpid()}"


@dataclass
class Route:
    """One way of asking for the same inference: where to send it and the exact bytes wrk sends."""

    name: str
    port_kind: str  # "http" or "sagemaker"
    path: str
    lua: Path  # wrk script: method, headers, body and the WRK_JSON done() hook
    body: bytes
    content_type: str


@dataclass
class Target:
    """A server under test and the SageMaker port it was given (Server.http_port is the HTTP port)."""

    server: Server
    sagemaker_port: int
    mme_dir: Path | None = None

    def url(self, route: Route) -> str:
        port = self.server.http_port if route.port_kind == "http" else self.sagemaker_port
        return f"http://127.0.0.1:{port}{route.path}"


@dataclass
class Row(Result):
    route: str = ""
    ratio_vs_v2: float | None = None  # this route's req/s over the same server's v2 route, same connections
    # CPU seconds of the server's process tree per wall second: ~1.0 when it had its core to itself and kept
    # it busy; well below 1.0 at c=64 means something else took the core and req/s understates the server.
    core_share: float | None = None


# ---------------------------------------------------------------------------------------------
# Request bodies and the wrk scripts that send them
# ---------------------------------------------------------------------------------------------

def binary_body(json_body: bytes) -> tuple[bytes, int]:
    """The JSON body's inputs as binary+json: a JSON header with binary_data_size, then little-endian FP32.

    Outputs are asked for as binary too, so the reply is binary+json, as tritonclient's SageMaker examples do.
    """
    inputs = json.loads(json_body)["inputs"]
    header = {
        "inputs": [{"name": i["name"], "shape": i["shape"], "datatype": "FP32",
                    "parameters": {"binary_data_size": 4 * len(i["data"])}} for i in inputs],
        "outputs": [{"name": name, "parameters": {"binary_data": True}} for name in ("OUTPUT0", "OUTPUT1")],
    }
    head = json.dumps(header, separators=(",", ":")).encode()
    tensors = b"".join(struct.pack(f"<{len(i['data'])}f", *i["data"]) for i in inputs)
    return head + tensors, len(head)


def lua_string(data: bytes) -> str:
    """A Lua string literal for arbitrary bytes: printable ASCII as is, everything else as a 3-digit \\ddd."""
    out = []
    for b in data:
        ch = chr(b)
        out.append(ch if 0x20 <= b < 0x7f and ch not in '"\\' else f"\\{b:03d}")
    return '"' + "".join(out) + '"'


def lua_unstring(literal: str) -> bytes:
    """Inverse of lua_string, to check that the generated script carries exactly our bytes."""
    inner = literal[1:-1]
    return re.sub(r"\\(\d{3})", lambda m: chr(int(m.group(1))), inner).encode("latin-1")


def done_hook() -> str:
    """wrk_infer.lua's done() hook (the WRK_JSON line http_add_sub.run_wrk's parsing expects)."""
    match = re.search(r"^done = function.*\Z", LUA_SCRIPT.read_text(), re.S | re.M)
    if not match:
        raise SystemExit(f"cannot find the done() hook in {LUA_SCRIPT}")
    return match.group(0)


def write_lua(path: Path, body: bytes, content_type: str) -> Path:
    literal = lua_string(body)
    assert lua_unstring(literal) == body
    path.write_text(
        "-- generated by sagemaker_invocations.py\n"
        'wrk.method = "POST"\n'
        f'wrk.headers["Content-Type"] = "{content_type}"\n'
        f"wrk.body = {literal}\n\n" + done_hook())
    return path


def make_routes(names: list[str], workdir: Path) -> list[Route]:
    json_body = load_body(LUA_SCRIPT)  # the exact bytes wrk_infer.lua sends
    bin_body, header_size = binary_body(json_body)
    bin_type = f"{BINARY_JSON}{header_size}"
    made = {
        "v2": Route("v2", "http", f"/v2/models/{MODEL}/infer", LUA_SCRIPT, json_body, "application/json"),
        "json": Route("json", "sagemaker", "/invocations", LUA_SCRIPT, json_body, "application/json"),
        "binary": Route("binary", "sagemaker", "/invocations", write_lua(workdir / "binary.lua", bin_body, bin_type),
                        bin_body, bin_type),
        "mme": Route("mme", "sagemaker", f"/models/{MME_KEY}/invoke", LUA_SCRIPT, json_body, "application/json"),
    }
    return [made[n] for n in names]


# ---------------------------------------------------------------------------------------------
# Talking to a server
# ---------------------------------------------------------------------------------------------

def post(url: str, body: bytes, content_type: str, timeout: float = 10.0) -> tuple[int, dict[str, str], bytes]:
    req = urllib.request.Request(url, data=body, method="POST", headers={"Content-Type": content_type})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, dict(resp.headers), resp.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


def wait_ping(base: str, proc: subprocess.Popen, timeout: float) -> None:
    """Poll SageMaker's GET /ping (200 once the default model is ready); bail out if the server died."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with code {proc.returncode} before /ping answered 200")
        try:
            with urllib.request.urlopen(base + "/ping", timeout=2) as resp:
                if resp.status == 200:
                    return
        except (OSError, urllib.error.URLError):
            pass
        time.sleep(0.25)
    raise RuntimeError(f"/ping not 200 after {timeout:.0f}s")


def decode_outputs(headers: dict[str, str], raw: bytes) -> dict[str, list[float]]:
    """Outputs of a JSON or binary+json reply (FP32 binary tensors follow the header in output order)."""
    content_type = next((v for k, v in headers.items() if k.lower() == "content-type"), "")
    if not content_type.startswith(BINARY_JSON):
        return {o["name"]: o["data"] for o in json.loads(raw)["outputs"]}
    size = int(content_type[len(BINARY_JSON):])
    outputs, offset, got = json.loads(raw[:size])["outputs"], size, {}
    for o in outputs:
        n = o["parameters"]["binary_data_size"]
        got[o["name"]] = list(struct.unpack(f"<{n // 4}f", raw[offset:offset + n]))
        offset += n
    return got


def verify(url: str, route: Route) -> None:
    """One request with wrk's exact bytes before timing: a wrong answer (or a 4xx) gets no number."""
    status, headers, raw = post(url, route.body, route.content_type)
    if status != 200:
        raise RuntimeError(f"{route.name}: HTTP {status}: {raw[:300]!r}")
    got = decode_outputs(headers, raw)
    for name, want in expected_outputs(load_body(LUA_SCRIPT)).items():
        data = got.get(name)
        if data is None or len(data) != len(want) or any(abs(x - y) > 1e-5 for x, y in zip(data, want)):
            raise RuntimeError(f"{route.name}: {name}: expected {want}, got {data}")


def load_mme(target: Target, repo: Path) -> None:
    """Copy add_sub to /opt/ml/models/<key>/model (config.pbtxt at its top: one model) and POST /models."""
    folder = MODELS_ROOT / f"{MME_KEY}_{target.server.name}"
    shutil.rmtree(folder, ignore_errors=True)
    shutil.copytree(repo / MODEL, folder / "model", ignore=shutil.ignore_patterns("__pycache__"))
    target.mme_dir = folder
    doc = json.dumps({"model_name": MME_KEY, "url": str(folder / "model")}).encode()
    status, _, raw = post(f"http://127.0.0.1:{target.sagemaker_port}/models", doc, "application/json", timeout=120)
    if status != 200:
        raise RuntimeError(f"POST /models answered {status}: {raw[:300]!r}")


# ---------------------------------------------------------------------------------------------
# Load generation (http_add_sub.run_wrk with a script of our choosing)
# ---------------------------------------------------------------------------------------------

def run_wrk(url: str, lua: Path, connections: int, duration: int, cpu: int) -> dict:
    argv = ["taskset", "-c", str(cpu), "wrk", "-t1", f"-c{connections}", f"-d{duration}s",
            "--timeout", "10s", "-s", str(lua), url]
    out = subprocess.run(argv, capture_output=True, text=True, check=True, timeout=duration + 60).stdout
    for line in out.splitlines():
        if line.startswith("WRK_JSON "):
            return json.loads(line[len("WRK_JSON "):])
    raise RuntimeError(f"no WRK_JSON line in wrk output:\n{out}")


def profile(target: Target, route: Route, pid: int, args: argparse.Namespace, log: Callable[[str], None]) -> None:
    """py-spy on the server's main process while wrk loads one route (not a measured run: sampling slows it)."""
    out = args.profile_dir / f"{target.server.name}-{route.name}.txt"
    spy = subprocess.Popen(["py-spy", "record", "--pid", str(pid), "--duration", str(args.duration),
                            "--rate", "250", "--format", "raw", "--output", str(out), "--nonblocking"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    time.sleep(1.0)  # py-spy attaches before the load starts
    run_wrk(target.url(route), route.lua, max(args.connections), args.duration, args.wrk_cpu)
    _, err = spy.communicate(timeout=60)
    if spy.returncode != 0 or not out.exists():
        log(f"[{target.server.name}] py-spy failed: {err.decode(errors='replace')[-500:]}")
        return
    log(f"[{target.server.name}] profile of {route.name}: {out}\n{summarize_profile(out)}")


def summarize_profile(path: Path, top: int = 25) -> str:
    """Inclusive share of samples per function from py-spy's collapsed stacks (`frame;frame;... count`)."""
    inclusive: Counter[str] = Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        total += n
        for frame in set(stack.split(";")):
            inclusive[re.sub(r":\d+\)$", ")", frame)] += n  # per function, not per line
    lines = [f"  {n * 100 / total:5.1f}%  {frame}" for frame, n in inclusive.most_common(top)] if total else []
    return f"  {total} samples (inclusive %, top {top})\n" + "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# One server: start -> ready -> verify each route -> warmup each -> levels x routes -> stop
# ---------------------------------------------------------------------------------------------

def bench(target: Target, routes: list[Route], args: argparse.Namespace, workdir: Path,
          log: Callable[[str], None]) -> list[Row]:
    server = target.server
    log_path = workdir / f"{server.name}.log"
    log(f"[{server.name}] starting: {shlex.join(server.argv)}  (log: {log_path})")
    proc = start(server, args.server_cpu, log_path)
    try:
        t0 = time.monotonic()
        wait_ping(f"http://127.0.0.1:{target.sagemaker_port}", proc, args.ready_timeout)
        log(f"[{server.name}] /ping 200 after {time.monotonic() - t0:.1f}s")
        if any(r.name == "mme" for r in routes):
            load_mme(target, args.repo)
        for route in routes:
            verify(target.url(route), route)
        log(f"[{server.name}] responses verified: {', '.join(r.name for r in routes)}")
        if args.warmup > 0:
            for route in routes:
                run_wrk(target.url(route), route.lua, max(args.connections), args.warmup, args.wrk_cpu)
        rows = []
        # Routes interleaved within each level, so a slow drift of the box hits every route alike.
        for conns in args.connections:
            for route in routes:
                cpu0 = tree_cpu_seconds(proc.pid)
                res = to_result(server.name, conns, run_wrk(target.url(route), route.lua, conns, args.duration,
                                                            args.wrk_cpu))
                row = Row(**asdict(res), route=route.name)
                used = tree_cpu_seconds(proc.pid) - cpu0
                if res.requests:
                    row.cpu_us_per_request = round(used * 1e6 / res.requests, 1)
                if res.duration_s:
                    row.core_share = round(used / res.duration_s, 2)
                log(f"[{server.name}] {route.name:<6} c={conns:<4} {row.rps:>10.1f} req/s  p50 {row.p50_ms:.2f} ms"
                    f"  p99 {row.p99_ms:.2f} ms  errors {row.errors}  cpu {row.cpu_us_per_request} us/req"
                    f"  core {row.core_share}")
                rows.append(row)
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with code {proc.returncode} during the run")
        if args.profile_dir and server.name in args.profile:
            for route in routes:
                profile(target, route, proc.pid, args, log)
        return rows
    except Exception:
        tail = log_path.read_bytes()[-2000:].decode(errors="replace") if log_path.exists() else ""
        log(f"[{server.name}] --- last lines of its log ---\n{tail}")
        raise
    finally:
        t0 = time.monotonic()
        stop(proc, server.stop_timeout)
        log(f"[{server.name}] stopped in {time.monotonic() - t0:.1f}s")
        if target.mme_dir is not None:
            shutil.rmtree(target.mme_dir, ignore_errors=True)


def common_flags(sagemaker_port: int, http: bool) -> list[str]:
    """Triton's SageMaker command line, the same for both servers (naiad takes Triton's flags)."""
    return ["--allow-sagemaker=true", "--sagemaker-port", str(sagemaker_port), f"--allow-http={str(http).lower()}",
            "--allow-grpc=false", "--allow-metrics=false", "--model-control-mode=explicit", f"--load-model={MODEL}"]


def naiad_target(args: argparse.Namespace, http: bool) -> Target:
    port, sm_port = free_port(), free_port()
    argv = [*shlex.split(args.naiad_cmd), "--model-repository", str(args.repo), "--http-port", str(port),
            "--grpc-port", str(free_port()), "--metrics-port", str(free_port()), *common_flags(sm_port, http)]
    # Project root as cwd so `python -m naiad` works without installing the package.
    return Target(Server("naiad", argv, port, PROJECT_DIR, env=dict(SAGEMAKER_ENV)), sm_port)


def triton_target(args: argparse.Namespace, http: bool, workdir: Path) -> Target:
    port, sm_port = free_port(), free_port()
    argv = [str(PEERS_DIR / "triton.sh"), "run", str(args.repo), str(port), str(free_port()), str(free_port()),
            *common_flags(sm_port, http)]
    # Neutral cwd (naiad's triton_python_backend_utils.py would shadow the stub's); long grace so Triton
    # removes its python-backend shared memory.
    return Target(Server("triton", argv, port, workdir, env=dict(SAGEMAKER_ENV), stop_timeout=20.0), sm_port)


# ---------------------------------------------------------------------------------------------
# Reporting
# ---------------------------------------------------------------------------------------------

def add_ratios(rows: list[Row]) -> None:
    triton = {(r.route, r.connections): r.rps for r in rows if r.server == "triton"}
    v2 = {(r.server, r.connections): r.rps for r in rows if r.route == "v2"}
    for r in rows:
        base = triton.get((r.route, r.connections))
        r.ratio_vs_triton = round(r.rps / base, 3) if base else None
        ref = v2.get((r.server, r.connections))
        r.ratio_vs_v2 = round(r.rps / ref, 3) if ref and r.route != "v2" else None


def table(rows: list[Row]) -> str:
    head = (f"{'server':<7} {'route':<7} {'conns':>5} {'req/s':>9} {'p50 ms':>7} {'p99 ms':>7} {'errors':>6}"
            f" {'cpu us/req':>10} {'core':>5} {'vs triton':>9} {'vs v2':>6}")
    lines = [head, "-" * len(head)]

    def fmt(x: float | None, spec: str, suffix: str = "") -> str:
        return "-" if x is None else f"{x:{spec}}{suffix}"

    for r in sorted(rows, key=lambda r: (r.connections, ROUTES.index(r.route), SERVERS.index(r.server))):
        lines.append(f"{r.server:<7} {r.route:<7} {r.connections:>5} {r.rps:>9.1f} {r.p50_ms:>7.2f} {r.p99_ms:>7.2f}"
                     f" {r.errors:>6} {fmt(r.cpu_us_per_request, '.1f'):>10} {fmt(r.core_share, '.2f'):>5}"
                     f" {fmt(r.ratio_vs_triton, '.2f', 'x'):>9} {fmt(r.ratio_vs_v2, '.2f', 'x'):>6}")
    return "\n".join(lines)


def parse_names(allowed: tuple[str, ...]) -> Callable[[str], list[str]]:
    def parse(text: str) -> list[str]:
        names = [n for n in text.replace(",", " ").split() if n and n != "none"]
        unknown = set(names) - set(allowed)
        if unknown:
            raise argparse.ArgumentTypeError(f"unknown {sorted(unknown)}; choose from {allowed}")
        return [n for n in allowed if n in names]  # canonical order
    return parse


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repo", type=Path, default=DEFAULT_REPO, help="Triton model repository holding add_sub")
    p.add_argument("--duration", type=int, default=8, help="seconds per route per connection level")
    p.add_argument("--warmup", type=int, default=2, help="warmup seconds per route (0 disables)")
    p.add_argument("--connections", type=parse_int_list, default=[1, 8, 64], help="levels, e.g. '1,8,64' (default)")
    p.add_argument("--routes", type=parse_names(ROUTES), default=list(DEFAULT_ROUTES),
                   help=f"any of {','.join(ROUTES)} (default {','.join(DEFAULT_ROUTES)}); mme writes under "
                        f"{MODELS_ROOT}")
    p.add_argument("--servers", type=parse_names(SERVERS), default=list(SERVERS), help="naiad,triton (default)")
    p.add_argument("--quick", action="store_true", help="a ~1 minute smoke run: c=1,8, 3 s each, 1 s warmup")
    p.add_argument("--naiad-cmd", default="python -m naiad serve", help="command prefix; the flags are appended")
    p.add_argument("--server-cpu", type=int, default=1, help="core the server under test is pinned to")
    p.add_argument("--wrk-cpu", type=int, default=0, help="core wrk is pinned to")
    p.add_argument("--ready-timeout", type=float, default=120.0, help="seconds to wait for /ping")
    p.add_argument("--profile-dir", type=Path,
                   help="after the measured levels, py-spy each route at the top level (not measured) into DIR")
    p.add_argument("--profile", type=parse_names(SERVERS), default=["naiad"],
                   help="servers to profile with --profile-dir (default naiad; Triton is C++, py-spy sees its stub "
                        "only if pointed at it)")
    p.add_argument("--json-out", type=Path, help="also write results + settings as JSON here")
    p.add_argument("--keep-logs", action="store_true", help="keep the temp dir with server logs")
    args = p.parse_args(argv)
    if args.quick:
        args.duration, args.warmup, args.connections = 3, 1, [1, 8]
    args.repo = args.repo.resolve()
    if args.profile_dir:
        args.profile_dir = args.profile_dir.resolve()
        args.profile_dir.mkdir(parents=True, exist_ok=True)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    log = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731 - progress to stderr, table to stdout
    if not (args.repo / MODEL / "config.pbtxt").exists():
        log(f"error: {args.repo}/{MODEL}/config.pbtxt not found (use --repo)")
        return 2
    for tool in ("wrk", "taskset", *(["py-spy"] if args.profile_dir else [])):
        if shutil.which(tool) is None:
            log(f"error: `{tool}` not found on PATH")
            return 2
    workdir = Path(tempfile.mkdtemp(prefix="naiad-bench-sm-"))
    routes = make_routes(args.routes, workdir)
    http = "v2" in args.routes
    builders = {"naiad": lambda: naiad_target(args, http), "triton": lambda: triton_target(args, http, workdir)}

    rows: list[Row] = []
    failures: dict[str, str] = {}
    for name in args.servers:  # naiad first, then Triton: a fixed order keeps repeated runs comparable
        target = builders[name]()
        try:
            rows += bench(target, routes, args, workdir, log)
        except Exception as e:  # one broken server should not cost the other's numbers
            failures[name] = f"{type(e).__name__}: {e}"
            log(f"[{name}] FAILED: {failures[name]}")

    add_ratios(rows)
    print(f"\nadd_sub in SageMaker mode ({', '.join(args.routes)}), {args.duration}s per level,"
          f" server on cpu {args.server_cpu}, wrk -t1 on cpu {args.wrk_cpu}\n")
    print(table(rows))
    for name, why in failures.items():
        print(f"{name}: FAILED ({why})")
    if args.json_out:
        payload = {
            "benchmark": "sagemaker_invocations", "model": MODEL, "repo": str(args.repo), "routes": args.routes,
            "duration_s": args.duration, "warmup_s": args.warmup, "connections": args.connections,
            "server_cpu": args.server_cpu, "wrk_cpu": args.wrk_cpu, "naiad_cmd": args.naiad_cmd,
            "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "cpu_count": os.cpu_count(),
            "results": [asdict(r) for r in rows], "failures": failures,
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
