"""A tritonserver command line as production deployments write it, GPU and C++ flags included, runs naiad
unchanged: it serves HTTP, gRPC over mutual TLS and metrics, writes the log and trace files it was told to, and
enforces the restricted APIs."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.frontends.grpc.certs import make_certs
from tests.server import EXAMPLES, RunningServer


def _inputs(module: object) -> list:
    inputs = []
    for name in ("INPUT0", "INPUT1"):
        tensor = module.InferInput(name, [4], "FP32")  # type: ignore[attr-defined]
        tensor.set_data_from_numpy(np.full(4, 2, dtype=np.float32))
        inputs.append(tensor)
    return inputs


def test_a_production_tritonserver_command_line_serves(tmp_path: Path) -> None:
    certs = make_certs(tmp_path)
    log_file, trace_file = tmp_path / "triton.log", tmp_path / "trace.json"
    server = RunningServer(
        [EXAMPLES],
        "--model-control-mode=explicit", "--load-model=*", "--exit-on-error=true", "--strict-readiness=true",
        "--strict-model-config=false", "--exit-timeout-secs=10", "--id=triton", "--model-load-thread-count=2",
        "--model-load-retry-count=1", "--backend-directory=/opt/tritonserver/backends",
        "--repoagent-directory=/opt/tritonserver/repoagents", "--model-namespacing=false",
        "--pinned-memory-pool-byte-size=268435456", "--cuda-memory-pool-byte-size=0:67108864",
        "--min-supported-compute-capability=6.0", "--buffer-manager-thread-count=0", "--http-thread-count=8",
        "--log-verbose=0", "--log-info=true", "--log-warning=true", "--log-error=true", "--log-format=ISO8601",
        f"--log-file={log_file}",
        f"--trace-config=triton,file={trace_file}", "--trace-config=level=TIMESTAMPS", "--trace-config=rate=1",
        "--trace-config=count=-1", "--trace-config=triton,log-frequency=0",
        "--allow-metrics=true", "--allow-gpu-metrics=false", "--allow-cpu-metrics=true", "--metrics-interval-ms=2000",
        "--metrics-config=summary_latencies=true",
        "--grpc-use-ssl=true", "--grpc-use-ssl-mutual=true", f"--grpc-server-cert={certs.server_cert}",
        f"--grpc-server-key={certs.server_key}", f"--grpc-root-cert={certs.ca}",
        "--grpc-infer-response-compression-level=low", "--grpc-keepalive-time=7200000",
        "--http-header-forward-pattern=^x-request-", "--grpc-header-forward-pattern=^x-request-",
        "--http-restricted-api=model-repository:admin-key=secret",
        "--grpc-restricted-protocol=model-repository:admin-key=secret",
        "--backend-config=python,shm-default-byte-size=1048576", "--cache-config=local,size=1048576",
        "--rate-limit=off")
    try:
        with httpclient.InferenceServerClient(server.url) as client:
            assert client.is_server_ready()
            result = client.infer("add_sub", _inputs(httpclient), request_id="over-http")
            assert result.as_numpy("OUTPUT0").tolist() == [4.0] * 4
            status, _, body = server.request("POST", "/v2/repository/index")
            assert (status, json.loads(body)) == (403, {"error": "This API is restricted, expecting header "
                                                                 "'admin-key'"})
        with grpcclient.InferenceServerClient(server.grpc_url, ssl=True, root_certificates=str(certs.ca),
                                              private_key=str(certs.client_key),
                                              certificate_chain=str(certs.client_cert)) as client:
            result = client.infer("add_sub", _inputs(grpcclient), request_id="over-grpc")
            assert result.as_numpy("OUTPUT1").tolist() == [0.0] * 4
        status, _, metrics = server.request("GET", "/metrics", port=server.metrics_port)
        assert status == 200 and b'nv_inference_request_success{model="add_sub",version="1"} 2' in metrics
    finally:
        assert server.stop() == 0
    assert "Started GRPCInferenceService" in log_file.read_text()
    traced = [e["request_id"] for e in json.loads(trace_file.read_text()) if "request_id" in e]
    assert traced == ["over-http", "over-grpc"]
