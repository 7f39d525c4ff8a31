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

from naiad.core.devices import devices
from naiad.frontends.http.protocol import HttpProtocol
from naiad.frontends.metrics.collector import CpuCollector, GpuCollector, ModelCollector
from naiad.frontends.metrics.exposition import CONTENT_TYPE, render
from naiad.frontends.metrics.options import MetricsOptions
from naiad.frontends.replies import Reply
from naiad.sagemaker.counters import SageMakerCollector
from naiad.service import Face

log = logging.getLogger("naiad.metrics")


class _MetricsRouter:
    def handle(self, method: bytes, path: str, headers: dict[bytes, bytes], body: bytes | bytearray) -> Reply:
        if path != "/metrics":
            return Reply(404, b'{"error":"Not Found"}')
        if method != b"GET":
            return Reply(405, b'{"error":"Method Not Allowed"}')
        return Reply(200, render(), CONTENT_TYPE)


class MetricsService:
    def __init__(self, service: Face, options: MetricsOptions) -> None:
        self.options = options
        self.models = ModelCollector(service, options)
        self.cpu = CpuCollector() if options.cpu else None
        gpus = devices() if options.gpu else None
        self.gpu = GpuCollector(gpus) if gpus is not None and gpus.count() else None
        self.sagemaker = SageMakerCollector(service.sagemaker_metrics) if service.sagemaker else None
        self._server: asyncio.base_events.Server | None = None
        self._sampler: asyncio.Task | None = None
        self._gpu_sampler: asyncio.Task | None = None

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
        if self.gpu is not None:
            self.gpu.sample()  # the first scrape has figures
            REGISTRY.register(self.gpu)
            self._gpu_sampler = asyncio.ensure_future(self._sample_gpus(self.gpu))
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

    async def _sample_gpus(self, gpu: GpuCollector) -> None:
        interval = max(self.options.interval_ms, 1.0) / 1000.0
        while True:
            await asyncio.sleep(interval)
            try:
                await asyncio.to_thread(gpu.sample)  # NVML calls block; the loop serves meanwhile
            except Exception:
                log.exception("sampling the GPUs failed")

    def stop(self) -> None:
        for sampler in (self._sampler, self._gpu_sampler):
            if sampler is not None:
                sampler.cancel()
        if self._server is not None:
            self._server.close()
        for collector in (self.models, self.cpu, self.gpu, self.sagemaker):
            if collector is not None:
                try:
                    REGISTRY.unregister(collector)
                except KeyError:
                    pass
