#!/usr/bin/env python3
"""CPU time per request in each of Ray Serve's processes: its HTTP/gRPC proxy, naiad's ingress and the model
replica (psutil's user+system time of each actor's process over N sequential add_sub requests on one connection),
under one of Ray Serve's configurations.

    python3 benchmarks/ray_hop_cpu.py 500                      # HTTP and gRPC, naiad ray serve's defaults
    python3 benchmarks/ray_hop_cpu.py 500 grpc --config before # gRPC, Ray's defaults (naiad before tuning)

Configurations: the Ray instance's environment variables, and whether naiad's replicas get its throughput settings
(naiad.ray.tuning.REPLICA_ENV in their runtime_env, `--throughput-optimized`):
    before    Ray's defaults, no replica settings (naiad before them): client -> proxy -> ingress -> model replica
    joined    Ray's defaults, naiad's replica settings (`naiad ray serve --address ...` on a cluster started plainly)
    fast      RAY_SERVE_THROUGHPUT_OPTIMIZED=1 without direct ingress, everywhere (the proxy too)
    direct    RAY_SERVE_ENABLE_DIRECT_INGRESS=1 alone: client -> ingress -> model replica
    direct+fast  RAY_SERVE_THROUGHPUT_OPTIMIZED=1 (which turns direct ingress on)
    naiad     `naiad ray serve`'s default for the Ray it starts: direct ingress and the replica settings

Run from the repository root; stdlib + psutil + ray[serve] + tritonclient[grpc].
"""
import argparse, http.client, json, os, sys, time
sys.path.insert(0, os.getcwd())
from tests.server import EXAMPLES, free_port

CONFIGS = {  # name: (Ray's environment, naiad's replica settings); None: naiad.ray.tuning's
    "before": ({}, False),
    "joined": ({}, True),
    "fast": ({"RAY_SERVE_THROUGHPUT_OPTIMIZED": "1", "RAY_SERVE_ENABLE_DIRECT_INGRESS": "0"}, False),
    "direct": ({"RAY_SERVE_ENABLE_DIRECT_INGRESS": "1"}, False),
    "direct+fast": ({"RAY_SERVE_THROUGHPUT_OPTIMIZED": "1"}, False),
    "naiad": (None, True),
}
parser = argparse.ArgumentParser()
parser.add_argument("n", type=int, nargs="?", default=500)
parser.add_argument("protocol", nargs="?", choices=("http", "grpc", "both"), default="both")
parser.add_argument("--config", choices=CONFIGS, default="naiad")
parser.add_argument("--rounds", type=int, default=3)
args = parser.parse_args()

for key in [k for k in os.environ if k.startswith("RAY_SERVE_")]:
    del os.environ[key]  # only the configuration's own settings
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
port, grpc_port = free_port(), free_port()
env, replica_settings = CONFIGS[args.config]
direct_port = direct_grpc_port = 0
if env is None:
    from naiad.ray.options import RayServeOptions as _Options
    from naiad.ray.tuning import ray_environment
    direct_port, direct_grpc_port = free_port(), free_port()
    env = ray_environment(_Options(model_repositories=["."], http_port=direct_port, grpc_port=direct_grpc_port))
os.environ.update(env)
DIRECT = os.environ.get("RAY_SERVE_ENABLE_DIRECT_INGRESS") == "1" or (
    os.environ.get("RAY_SERVE_THROUGHPUT_OPTIMIZED") == "1" and os.environ.get("RAY_SERVE_ENABLE_DIRECT_INGRESS") != "0")
if DIRECT and "RAY_SERVE_DIRECT_INGRESS_MIN_HTTP_PORT" not in env:
    # the one ingress replica takes the one port of each range
    direct_port, direct_grpc_port = free_port(), free_port()
    os.environ.update({"RAY_SERVE_DIRECT_INGRESS_MIN_HTTP_PORT": str(direct_port),
                       "RAY_SERVE_DIRECT_INGRESS_MAX_HTTP_PORT": str(direct_port + 1),
                       "RAY_SERVE_DIRECT_INGRESS_MIN_GRPC_PORT": str(direct_grpc_port),
                       "RAY_SERVE_DIRECT_INGRESS_MAX_GRPC_PORT": str(direct_grpc_port + 1),
                       "RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S": "0"})
elif DIRECT:
    direct_port = int(env["RAY_SERVE_DIRECT_INGRESS_MIN_HTTP_PORT"])
    direct_grpc_port = int(env["RAY_SERVE_DIRECT_INGRESS_MIN_GRPC_PORT"])

import psutil, ray
from ray import serve
from naiad.ray.application import build
from naiad.ray.options import RayServeOptions

ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
serve.start(http_options={"host": "127.0.0.1", "port": port},
            grpc_options={"port": grpc_port, "grpc_servicer_functions": ["naiad.ray.rpc.add_inference_service"]})
serve.run(build(RayServeOptions(model_repositories=[str(EXAMPLES)], replica_num_cpus=0.5,
                                throughput_optimized=replica_settings)), name="naiad", route_prefix="/")
# the clients' doors: the proxy's ports, or the ingress replica's own under direct ingress
http_door, grpc_door = (direct_port, direct_grpc_port) if DIRECT else (port, grpc_port)
deadline = time.monotonic() + 60
while True:
    try:
        c = http.client.HTTPConnection("127.0.0.1", http_door, timeout=30)
        c.request("GET", "/v2/health/ready"); r = c.getresponse(); r.read()
        if r.status == 200: break
    except OSError:
        pass
    if time.monotonic() > deadline: raise SystemExit(f"nothing answers on port {http_door}")
    time.sleep(0.5)

body = json.dumps({"inputs": [{"name": "INPUT0", "shape": [4], "datatype": "FP32", "data": [1, 2, 3, 4]},
                              {"name": "INPUT1", "shape": [4], "datatype": "FP32", "data": [1, 1, 1, 1]}]}).encode()
def http_go(n):
    for _ in range(n):
        c.request("POST", "/v2/models/add_sub/infer", body, {"Content-Type": "application/json"}); r = c.getresponse(); r.read(); assert r.status == 200, r.status
import grpc, numpy as np
from tritonclient.grpc import service_pb2 as pb, service_pb2_grpc
stub = service_pb2_grpc.GRPCInferenceServiceStub(grpc.insecure_channel(f"127.0.0.1:{grpc_door}"))
message = pb.ModelInferRequest(model_name="add_sub")
for name, values in (("INPUT0", [1, 2, 3, 4]), ("INPUT1", [1, 1, 1, 1])):
    message.inputs.add(name=name, datatype="FP32", shape=[4])
    message.raw_input_contents.append(np.array(values, np.float32).tobytes())
def grpc_go(n):
    for _ in range(n):
        stub.ModelInfer(message, timeout=30)

def procs():
    out = {}
    for p in psutil.process_iter(["cmdline"]):
        cmd = " ".join(p.info["cmdline"] or ())
        for key in ("ProxyActor", "NaiadIngress", "NaiadModels"):
            if key in cmd: out[key] = p
    return out
ps = procs()
def cpu():
    return {k: sum(p.cpu_times()[:2]) for k, p in ps.items()}
for protocol, go in (("http", http_go), ("grpc", grpc_go)):
    if args.protocol not in (protocol, "both"): continue
    go(100)
    for rnd in range(args.rounds):
        a = cpu(); t = time.perf_counter(); go(args.n); el = time.perf_counter() - t; b = cpu()
        total = sum(b[k] - a[k] for k in a) / args.n * 1e3
        print(f"{args.config} {protocol} round {rnd}: {el / args.n * 1e3:.2f} ms/request wall; CPU ms/request: "
              + ", ".join(f"{k} {(b[k]-a[k])/args.n*1e3:.2f}" for k in sorted(a)) + f", total {total:.2f}", flush=True)
ray.shutdown()
