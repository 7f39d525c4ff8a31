"""Triton's GPU families (names, HELP texts, the gpu_uuid label) on a live server's metrics page, read from
simulated GPUs that the test changes while the server runs; none of them on a host without GPUs, or with
--allow-gpu-metrics=false."""

from __future__ import annotations

import http.client
import time
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from naiad.core.devices import Nvml
from tests import simulated_gpus
from tests.server import EXAMPLES, RunningServer

# Triton 2.51's texts (metrics.cc).
HELP = {
    "nv_gpu_utilization": "GPU utilization rate [0.0 - 1.0)",
    "nv_gpu_memory_total_bytes": "GPU total memory, in bytes",
    "nv_gpu_memory_used_bytes": "GPU used memory, in bytes",
    "nv_gpu_power_usage": "GPU power usage in watts",
    "nv_gpu_power_limit": "GPU power management limit in watts",
    "nv_energy_consumption": "GPU energy consumption in joules since the Triton Server started",
}
GIB = 1 << 30
DEVICES = [
    {"uuid": "GPU-11111111-aaaa", "name": "Simulated H100", "memory_total": 80 * GIB, "memory_used": 2 * GIB,
     "utilization": 0.25, "power_usage": 120.5, "power_limit": 700.0, "energy": 5000.0},
    {"uuid": "GPU-22222222-bbbb", "name": "Simulated H100", "memory_total": 80 * GIB, "memory_used": 0,
     "utilization": 0.0, "power_usage": 70.0, "power_limit": 700.0, "energy": 100.0},
]


def scrape(server: RunningServer) -> tuple[str, dict[str, Any]]:
    conn = http.client.HTTPConnection("127.0.0.1", server.metrics_port, timeout=10)
    try:
        conn.request("GET", "/metrics")
        text = conn.getresponse().read().decode()
    finally:
        conn.close()
    return text, {f.name: f for f in text_string_to_metric_families(text)}


def by_gpu(family: Any) -> dict[str, float]:
    return {s.labels["gpu_uuid"]: s.value for s in family.samples}


def test_gpu_families_follow_the_devices(tmp_path: Path) -> None:
    devices = tmp_path / "gpus.json"
    simulated_gpus.write(devices, DEVICES)
    server = RunningServer([EXAMPLES], "--metrics-interval-ms=100", env={simulated_gpus.ENV: str(devices)})
    try:
        text, families = scrape(server)
        for name, help in HELP.items():
            assert f"# HELP {name} {help}\n" in text
            assert families[name].type == ("counter" if name == "nv_energy_consumption" else "gauge")
            assert all(set(s.labels) == {"gpu_uuid"} for s in families[name].samples)
        assert by_gpu(families["nv_gpu_memory_total_bytes"]) == {d["uuid"]: d["memory_total"] for d in DEVICES}
        assert by_gpu(families["nv_gpu_memory_used_bytes"]) == {"GPU-11111111-aaaa": 2 * GIB, "GPU-22222222-bbbb": 0}
        assert by_gpu(families["nv_gpu_utilization"]) == {"GPU-11111111-aaaa": 0.25, "GPU-22222222-bbbb": 0.0}
        assert by_gpu(families["nv_gpu_power_usage"])["GPU-11111111-aaaa"] == 120.5
        assert by_gpu(families["nv_gpu_power_limit"])["GPU-22222222-bbbb"] == 700.0
        # Joules since the server started: nothing yet, whatever the device counted before.
        assert by_gpu(families["nv_energy_consumption"]) == {"GPU-11111111-aaaa": 0.0, "GPU-22222222-bbbb": 0.0}

        # The device changes; the next samples (every 100 ms) show it.
        simulated_gpus.update(devices, 0, memory_used=30 * GIB, utilization=0.9, energy=5750.0)
        deadline = time.monotonic() + 10
        while True:
            _, families = scrape(server)
            if by_gpu(families["nv_gpu_memory_used_bytes"])["GPU-11111111-aaaa"] == 30 * GIB:
                break
            assert time.monotonic() < deadline, "the GPU figures were not sampled again"
            time.sleep(0.05)
        assert by_gpu(families["nv_gpu_utilization"])["GPU-11111111-aaaa"] == 0.9
        assert by_gpu(families["nv_energy_consumption"]) == {"GPU-11111111-aaaa": 750.0, "GPU-22222222-bbbb": 0.0}
        assert "nv_cpu_utilization" in families  # beside the CPU's
    finally:
        server.stop()


def test_no_gpu_families_without_a_gpu_or_when_turned_off(tmp_path: Path) -> None:
    devices = tmp_path / "gpus.json"
    simulated_gpus.write(devices, DEVICES)
    cases: list[tuple[tuple[str, ...], dict[str, str]]] = [(("--allow-gpu-metrics=false",),
                                                            {simulated_gpus.ENV: str(devices)})]
    if Nvml.open() is None:  # this host has no GPU of its own
        cases.append(((), {}))
    for extra, env in cases:
        server = RunningServer([EXAMPLES], *extra, env=env)
        try:
            text, families = scrape(server)
            assert "nv_cpu_utilization" in families and "nv_inference_count" in families
            assert not [name for name in families if name.startswith(("nv_gpu", "nv_energy"))], extra
            assert "gpu_uuid" not in text
        finally:
            server.stop()
