"""One local Ray instance (2 CPUs, no dashboard) for the whole directory; each test deploys its application."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from tests.server import free_port

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

APP = "naiad"


@dataclass
class Cluster:
    address: str  # the GCS address a driver (naiad ray serve --address) joins
    port: int  # Serve's HTTP proxy
    metrics_port: int  # Ray's metrics export (Prometheus text)
    grpc_port: int  # Serve's gRPC proxy, serving naiad's KServe v2 gRPC service (naiad.ray.rpc)

    @property
    def url(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def grpc_url(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"


@pytest.fixture(scope="package")
def cluster() -> Iterator[Cluster]:
    ray = pytest.importorskip("ray")
    serve = pytest.importorskip("ray.serve")
    metrics_port = free_port()
    context = ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, namespace="naiad-tests",
                       configure_logging=False, _metrics_export_port=metrics_port,
                       _system_config={"metrics_report_interval_ms": 1000})  # replicas' metrics within a second
    from naiad.ray.rpc import SERVICER

    port, grpc_port = free_port(), free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port},
                grpc_options={"port": grpc_port, "grpc_servicer_functions": [SERVICER]})
    try:
        yield Cluster(context.address_info["gcs_address"], port, metrics_port, grpc_port)
    finally:
        serve.shutdown()
        # Not ray.shutdown(): other threads of this process (Ray's own) keep reaching its core worker, and one that
        # does after the shutdown ends the process with exit code 1 (Ray's QuickExit, "The core worker has already
        # been shutdown"; CI's pytest stopped there 3 times with no summary). Ray stays up until pytest ends, and
        # tests/conftest.py ends the process then, with pytest's own status, after killing Ray's processes.
        RAY_LEFT_RUNNING.append(True)


RAY_LEFT_RUNNING: list[bool] = []


def running_replicas(deployment: str, app: str = APP) -> int:
    from ray import serve

    status = serve.status().applications.get(app)
    if status is None or deployment not in status.deployments:
        return 0
    return status.deployments[deployment].replica_states.get("RUNNING", 0)


def wait_for(condition, timeout: float, what: str, step: float = 0.25) -> None:  # noqa: ANN001
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(step)
    raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
