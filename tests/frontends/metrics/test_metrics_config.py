"""``--metrics-config``: latency counters can be dropped, and summaries over the last minute added, with Triton's
family names and quantile labels."""

from __future__ import annotations

import urllib.request

import numpy as np
import tritonclient.http as httpclient

from tests.server import EXAMPLES, RunningServer


def _scrape(server: RunningServer) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=10) as page:
        return page.read().decode()


def _infer(server: RunningServer, n: int) -> None:
    inputs = [httpclient.InferInput("INPUT0", [4], "FP32"), httpclient.InferInput("INPUT1", [4], "FP32")]
    for tensor in inputs:
        tensor.set_data_from_numpy(np.ones(4, np.float32))
    with httpclient.InferenceServerClient(server.url) as client:
        for _ in range(n):
            client.infer("add_sub", inputs)


def test_summaries_replace_counters_when_configured() -> None:
    server = RunningServer([EXAMPLES], "--metrics-config", "summary_latencies=true",
                           "--metrics-config", "counter_latencies=false",
                           "--metrics-config", "summary_quantiles=0.5:0.05,0.99:0.001")
    try:
        _infer(server, 5)
        page = _scrape(server)
        assert "nv_inference_request_duration_us" not in page
        assert 'nv_inference_request_success{model="add_sub",version="1"} 5\n' in page
        assert "# TYPE nv_inference_queue_summary_us summary" in page
        assert 'nv_inference_request_summary_us_count{model="add_sub",version="1"} 5\n' in page
        for family in ("request", "queue", "compute_input", "compute_infer", "compute_output"):
            line = next(line for line in page.splitlines()
                        if line.startswith(f'nv_inference_{family}_summary_us{{model="add_sub",quantile="0.99"'))
            assert float(line.split()[-1]) >= 0
        assert 'quantile="0.9"' not in page  # only the configured quantiles
    finally:
        server.stop()


def test_defaults_are_counters_only() -> None:
    server = RunningServer([EXAMPLES])
    try:
        _infer(server, 1)
        page = _scrape(server)
        assert 'nv_inference_request_duration_us{model="add_sub",version="1"}' in page
        assert "_summary_us" not in page
    finally:
        server.stop()
