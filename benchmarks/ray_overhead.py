#!/usr/bin/env python3
"""What Ray Serve costs per request: `naiad serve` against `naiad ray serve` (the same models, the same request),
and the throughput of Ray Serve at 1 and 2 model replicas.

Runs, one after the other, each loaded by wrk (pinned to `--wrk-cpu`) with a KServe v2 JSON add_sub request:

* naiad serve: one process (pinned to `--server-cpu`), the example repository's add_sub under two names;
* Ray Serve's floor: an ASGI ingress making one handle call to an echo replica, no naiad code (the same hops);
* Ray Serve, 1 replica: a local Ray instance (`num_cpus` = the machine's), `naiad.ray` with one model replica;
* Ray Serve, 2 replicas: the same with two replicas, the requests alternating between the two models so that
  each replica serves its own (model-aware routing).

The Ray instance has the settings `naiad ray serve` gives the Ray it starts (`--ray-settings naiad`, the default:
direct ingress, so clients reach the ingress replica's own port, and Ray's throughput settings everywhere) or
Ray's defaults (`--ray-settings plain`: clients go through Ray's HTTP proxy).

At 1 connection the time per request (1 / req/s, wrk's own time included) is the latency a client sees; the
difference between Ray and naiad serve is the per-request overhead: the ingress replica (and, with plain settings,
Ray's HTTP proxy before it) and the hop to the model replica (the request and the encoded reply as bytes). At more
connections, req/s is the throughput. Ray's processes are not pinned (there are many); on a small machine the
2-replica figure mostly shows whether the ingress, not the replicas, is the bottleneck.

    flock /tmp/naiad-bench.lock python3 benchmarks/ray_overhead.py --duration 5

Stdlib + ray[serve]; external tools: wrk, taskset.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples" / "model_repository"
BODY = json.dumps({"inputs": [{"name": "INPUT0", "shape": [4], "datatype": "FP32", "data": [1, 2, 3, 4]},
                              {"name": "INPUT1", "shape": [4], "datatype": "FP32", "data": [1, 1, 1, 1]}]})
NAMES = ["m0", "m1"]
LUA = """
wrk.method = "POST"
wrk.body = '%s'
wrk.headers["Content-Type"] = "application/json"
local paths = {%s}
local i = 0
request = function()
  i = i %% #paths + 1
  return wrk.format(nil, paths[i])
end
"""


def free_port() -> int:
    from naiad.core.free_ports import free_port as pick  # NAIAD_PORT_RANGE confines it

    return pick()


def free_range(count: int) -> int:
    """The first of ``count`` consecutive free ports."""
    import socket

    while True:
        base = free_port()
        try:
            for port in range(base, base + count):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue


def answering(ports: list[int], timeout: float = 120) -> int:
    """The port (of the direct-ingress range, or the proxy's) where the application just deployed answers."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for port in ports:
            with contextlib.suppress(Exception):  # not this one, or not up yet
                request = urllib.request.Request(f"http://127.0.0.1:{port}/v2/models/{NAMES[0]}/infer", BODY.encode())
                urllib.request.urlopen(request, timeout=30).read()
                return port
        time.sleep(0.5)
    raise SystemExit(f"nothing answered on ports {ports}")


def repository(root: Path) -> Path:
    for name in NAMES:
        shutil.copytree(EXAMPLES / "add_sub", root / name, ignore=shutil.ignore_patterns("__pycache__"))
        config = root / name / "config.pbtxt"
        config.write_text(config.read_text().replace('name: "add_sub"', f'name: "{name}"'))
    return root


def wait_ready(port: int, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            for name in NAMES:
                request = urllib.request.Request(f"http://127.0.0.1:{port}/v2/models/{name}/infer", BODY.encode())
                urllib.request.urlopen(request, timeout=30).read()
            return
        except Exception:  # noqa: BLE001 - not up yet
            time.sleep(0.5)
    raise SystemExit(f"nothing answered on port {port}")


def wrk(port: int, names: list[str], connections: int, duration: float, cpu: str, script_dir: Path) -> float:
    script = script_dir / "body.lua"
    script.write_text(LUA % (BODY, ", ".join(f'"/v2/models/{n}/infer"' for n in names)))
    out = subprocess.run(["taskset", "-c", cpu, "wrk", "-t1", f"-c{connections}", f"-d{duration:g}s", "-s",
                          str(script), f"http://127.0.0.1:{port}"], capture_output=True, text=True, check=True).stdout
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    if errors:
        raise SystemExit(f"wrk saw {errors.group(1)} failed requests:\n{out}")
    return float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))


def measure(label: str, port: int, names: list[str], args: argparse.Namespace, scratch: Path) -> dict:
    wrk(port, names, 1, 1, args.wrk_cpu, scratch)  # warm-up
    row = {"setup": label}
    for connections in args.connections:
        row[connections] = wrk(port, names, connections, args.duration, args.wrk_cpu, scratch)
    return row


def floor_application():  # noqa: ANN201 - a ray.serve Application
    """Ray Serve's own floor for the same shape: an ASGI ingress that makes one handle call to an echo replica
    (no naiad code at all). What naiad adds on Ray is the difference to this."""
    from ray import serve

    @serve.deployment(logging_config={"enable_access_log": False}, ray_actor_options={"num_cpus": 0.5})
    class Echo:
        async def __call__(self, body: bytes) -> bytes:
            return body

    class Ingress:
        def __init__(self, echo) -> None:  # noqa: ANN001
            self.echo = echo

        def __serve_build_asgi_app__(self):  # noqa: ANN204
            return _EchoAsgi(self.echo)

    ingress = serve.deployment(serve.ingress()(Ingress), logging_config={"enable_access_log": False},
                               ray_actor_options={"num_cpus": 0})
    return ingress.bind(Echo.bind())


class _EchoAsgi:
    def __init__(self, echo) -> None:  # noqa: ANN001
        self.echo = echo

    async def __call__(self, scope, receive, send) -> None:  # noqa: ANN001
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                done = message["type"] + ".complete"
                await send({"type": done})
                if message["type"] == "lifespan.shutdown":
                    return
        if scope["type"] != "http":
            return
        body = (await receive()).get("body", b"")
        answer = await self.echo.remote(body)
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-length", b"%d" % len(answer))]})
        await send({"type": "http.response.body", "body": answer})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--duration", type=float, default=5)
    parser.add_argument("--connections", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--server-cpu", default="1")
    parser.add_argument("--wrk-cpu", default="0")
    parser.add_argument("--ray-settings", choices=("naiad", "plain"), default="naiad")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as scratch_name:
        scratch = Path(scratch_name)
        repo = repository(scratch / "repo")
        port = free_port()
        server = subprocess.Popen(["taskset", "-c", args.server_cpu, sys.executable, "-m", "naiad", "serve",
                                   "--model-repository", str(repo), "--http-port", str(port), "--allow-grpc=false",
                                   "--allow-metrics=false"], cwd=ROOT, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL)
        try:
            wait_ready(port)
            rows.append(measure("naiad serve", port, NAMES, args, scratch))
        finally:
            server.terminate()
            server.wait(30)

        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        # This tree's naiad, in this process and Ray's (which inherit the environment)
        sys.path.insert(0, str(ROOT))
        os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
        from naiad.ray.options import RayServeOptions
        from naiad.ray.tuning import ray_environment

        for key in [k for k in os.environ if k.startswith("RAY_SERVE_")]:
            del os.environ[key]  # only the chosen settings
        naiad_settings = args.ray_settings == "naiad"
        port = proxy_port = free_port()
        ports = [port]
        if naiad_settings:  # each application's one ingress replica serves a port of this range itself
            base = free_range(3)
            ports = [base, base + 1, base + 2]
            os.environ.update(ray_environment(RayServeOptions(model_repositories=["."], http_port=base,
                                                              ingress_replicas=len(ports))))
        import ray  # after the settings: Ray Serve reads them on import, in this process too
        from ray import serve

        from naiad.ray.application import build

        ray.init(include_dashboard=False, log_to_driver=False, configure_logging=False)
        serve.start(http_options={"host": "127.0.0.1", "port": proxy_port})
        try:
            serve.run(floor_application(), name="floor", route_prefix="/")
            port = answering(ports)
            rows.append(measure("Ray Serve floor (echo)", port, NAMES, args, scratch))
            serve.delete("floor")
            for replicas in (1, 2):
                options = RayServeOptions(model_repositories=[str(repo)], min_replicas=replicas,
                                          max_replicas=replicas, max_models_per_replica=2, replica_num_cpus=0.5,
                                          throughput_optimized=naiad_settings, direct_ingress=naiad_settings)
                serve.run(build(options), name="naiad", route_prefix="/")
                port = answering(ports)
                wait_ready(port)
                rows.append(measure(f"Ray Serve, {replicas} replica{'s' * (replicas > 1)}", port, NAMES, args,
                                    scratch))
                serve.delete("naiad")
        finally:
            serve.shutdown()
            ray.shutdown()

    print(f"add_sub FP32[4], KServe v2 JSON, wrk {args.duration:g} s per run, Ray settings: {args.ray_settings}; "
          "req/s by connections")
    print(f"{'setup':<24}" + "".join(f"{c:>10}" for c in args.connections) + f"{'ms/request @1':>16}")
    for row in rows:
        one = row.get(1)
        print(f"{row['setup']:<24}" + "".join(f"{row[c]:>10.0f}" for c in args.connections)
              + (f"{1000 / one:>16.2f}" if one else ""))
    if 1 in args.connections:
        base, floor = 1000 / rows[0][1], 1000 / rows[1][1]
        for row in rows[2:]:
            print(f"overhead per request over naiad serve, {row['setup']}: {1000 / row[1] - base:.2f} ms "
                  f"(Ray Serve's own floor: {floor - base:.2f} ms; naiad's part on Ray: {1000 / row[1] - floor:.2f} ms)")


if __name__ == "__main__":
    main()
