"""The metrics endpoint: ``GET /metrics`` on its own port, served on the server's loop.

Scrapes run on the event loop, the only place ``ModelStats`` changes, so a page is one consistent
snapshot. The HTTP/1.1 connection handling is the HTTP front end's; only the routing is ours.
"""

from __future__ import annotations

import asyncio
import logging

from prometheus_client import (
    GC_COLLECTOR,
    PLATFORM_COLLECTOR,
    PROCESS_COLLECTOR,
    REGISTRY,
)

from naiad.frontends.http.protocol import HttpProtocol
from naiad.frontends.metrics.collector import CpuCollector, ModelCollector
from naiad.frontends.metrics.exposition import CONTENT_TYPE, render
from naiad.frontends.metrics.options import MetricsOptions
from naiad.frontends.replies import Reply
from naiad.sagemaker.counters import SageMakerCollector
from naiad.service import Service

log = logging.getLogger("naiad.metrics")


class _MetricsRouter:
    def handle(self, method: bytes, path: str, headers: dict[bytes, bytes], body: bytes | bytearray) -> Reply:
        if path != "/metrics":
            return Reply(404, b'{"error":"Not Found"}')
        if method != b"GET":
            return Reply(405, b'{"error":"Method Not Allowed"}')
        return Reply(200, render(), CONTENT_TYPE)


class MetricsService:
    def __init__(self, service: Service, options: MetricsOptions) -> None:
        self.options = options
        self.models = ModelCollector(service, options)
        self.cpu = CpuCollector() if options.cpu else None
        self.sagemaker = SageMakerCollector(service.sagemaker_metrics) if service.sagemaker else None
        self._server: asyncio.base_events.Server | None = None
        self._sampler: asyncio.Task | None = None

    async def start(self) -> None:
        # Triton's page has only its own families: drop the Python process/GC/platform ones.
        for collector in (PROCESS_COLLECTOR, PLATFORM_COLLECTOR, GC_COLLECTOR):
            try:
                REGISTRY.unregister(collector)
            except KeyError:
                pass
        REGISTRY.register(self.models)
        if self.sagemaker is not None:
            REGISTRY.register(self.sagemaker)
        if self.cpu is not None:
            REGISTRY.register(self.cpu)
            self._sampler = asyncio.ensure_future(self._sample(self.cpu))
        loop = asyncio.get_running_loop()
        router = _MetricsRouter()
        self._server = await loop.create_server(lambda: HttpProtocol(router, 64 * 1024),  # type: ignore[arg-type]
                                                self.options.address, self.options.port, reuse_address=True)
        log.info("Started Metrics Service at %s:%d", self.options.address, self.options.port)

    async def _sample(self, cpu: CpuCollector) -> None:
        interval = max(self.options.interval_ms, 1.0) / 1000.0
        while True:
            await asyncio.sleep(interval)
            cpu.sample()

    def stop(self) -> None:
        if self._sampler is not None:
            self._sampler.cancel()
        if self._server is not None:
            self._server.close()
        for collector in (self.models, self.cpu, self.sagemaker):
            if collector is not None:
                try:
                    REGISTRY.unregister(collector)
                except KeyError:
                    pass
