#!/usr/bin/env python3
"""CPU time per request in each of Ray Serve's processes: its HTTP proxy, naiad's ingress and the model replica
(psutil's user+system time of each actor's process over N sequential add_sub JSON requests on one connection).

    python3 benchmarks/ray_hop_cpu.py 500          # HTTP
    python3 benchmarks/ray_hop_cpu.py 500 grpc     # KServe v2 gRPC (ModelInfer on one channel) through Ray's gRPC proxy

Run from the repository root; stdlib + psutil + ray[serve].
"""
import http.client, json, os, sys, time
sys.path.insert(0, os.getcwd())
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
import psutil, ray
from ray import serve
from naiad.ray.application import build
from naiad.ray.options import RayServeOptions
from tests.server import EXAMPLES, free_port
N = int(sys.argv[1]) if len(sys.argv) > 1 else 600
GRPC = "grpc" in sys.argv[2:]
ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
port, grpc_port = free_port(), free_port()
serve.start(http_options={"host": "127.0.0.1", "port": port},
            grpc_options={"port": grpc_port, "grpc_servicer_functions": ["naiad.ray.rpc.add_inference_service"]})
serve.run(build(RayServeOptions(model_repositories=[str(EXAMPLES)], replica_num_cpus=0.5)), name="naiad", route_prefix="/")
body = json.dumps({"inputs": [{"name": "INPUT0", "shape": [4], "datatype": "FP32", "data": [1, 2, 3, 4]},
                              {"name": "INPUT1", "shape": [4], "datatype": "FP32", "data": [1, 1, 1, 1]}]}).encode()
c = http.client.HTTPConnection("127.0.0.1", port)
def go(n):
    for _ in range(n):
        c.request("POST", "/v2/models/add_sub/infer", body, {"Content-Type": "application/json"}); r = c.getresponse(); r.read(); assert r.status == 200
if GRPC:
    import grpc, numpy as np
    from tritonclient.grpc import service_pb2 as pb, service_pb2_grpc
    stub = service_pb2_grpc.GRPCInferenceServiceStub(grpc.insecure_channel(f"127.0.0.1:{grpc_port}"))
    message = pb.ModelInferRequest(model_name="add_sub")
    for name, values in (("INPUT0", [1, 2, 3, 4]), ("INPUT1", [1, 1, 1, 1])):
        message.inputs.add(name=name, datatype="FP32", shape=[4])
        message.raw_input_contents.append(np.array(values, np.float32).tobytes())
    def go(n):
        for _ in range(n):
            stub.ModelInfer(message, timeout=30)
go(100)
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
for rnd in range(3):
    a = cpu(); t = time.perf_counter(); go(N); el = time.perf_counter() - t; b = cpu()
    print(f"round {rnd}: {el / N * 1e3:.2f} ms/request wall; CPU ms/request: " + ", ".join(f"{k} {(b[k]-a[k])/N*1e3:.2f}" for k in sorted(a)), flush=True)
serve.shutdown(); ray.shutdown()
