"""A benchmark session against one model: inputs prepared once, workers started once, then any number of load
levels profiled as perf_analyzer profiles them (consecutive windows until the last three are stable or
--max-trials is reached), with the server's /stats taken at every window edge."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from naiad.bench import inputs as inputs_mod
from naiad.bench.control import Control, ModelInfo, stats_delta
from naiad.bench.load import Generator, Records
from naiad.bench.stats import STABILITY_WINDOW, PerfStatus, is_stable, merge, rates, summarize_latency

Progress = Callable[[dict[str, Any]], None]


@dataclass
class Settings:
    measurement_interval_ms: int = 5000
    measurement_mode: str = "time_windows"      # or "count_windows"
    measurement_request_count: int = 50
    request_count: int = 0                        # perf_analyzer's --request-count: one window of exactly this
    stability_percentage: float = 10.0
    max_trials: int = 10
    percentile: int = -1
    latency_threshold_ms: int = 0                 # 0: no limit
    async_mode: bool = False
    distribution: str = "constant"
    verbose: bool = False
    collect_metrics: bool = False
    metrics_url: str = ""
    metrics_interval_ms: int = 1000
    keep_requests: bool = False                   # every request's timestamps kept (--profile-export-file)


@dataclass
class Options:
    """How requests are made (beyond api.Target)."""

    streaming: bool = False
    shared_memory: str = "none"                   # "none" | "system"
    output_shm_size: int = 100 * 1024
    string_length: int = 128
    string_data: str | None = None
    headers: dict[str, str] = field(default_factory=dict)
    grpc_channels: int = 1                        # gRPC connections per worker process (streams multiplex)
    grpc_client: str = "lean"                     # unary gRPC: "lean" (HTTP/2 spoken directly) or "grpcio"
    cpus: list[int] | None = None
    compression: str = "none"                     # gRPC request compression: "gzip" | "deflate" (via grpcio)
    intervals_us: list[int] | None = None         # --request-intervals: the schedule instead of a rate


def split_url(url: str, default_port: int) -> tuple[str, int]:
    url = url.split("://", 1)[-1].rstrip("/")
    host, _, port = url.rpartition(":")
    if not host:
        return url, default_port
    return host, int(port)


class Session:
    def __init__(self, target: Any, settings: Settings | None = None, options: Options | None = None,
                 processes: int | None = None, progress: Progress | None = None) -> None:
        self.target = target
        self.settings = settings or Settings()
        self.options = options or Options()
        self.progress = progress
        self.protocol = target.protocol.lower()
        if self.protocol not in ("http", "grpc"):
            raise ValueError("Failed to parse -i (protocol). The value should be either HTTP or gRPC.")
        if self.options.streaming and self.protocol != "grpc":
            raise ValueError("Streaming is only allowed with gRPC protocol and Triton C API.")
        self.control = Control(target.url, self.protocol, self.options.headers)
        self.shm_regions: list[tuple[str, Any]] = []
        self.generator: Generator | None = None
        try:
            self.model: ModelInfo = self.control.model(target.model, target.version)
            if self.model.sequence:
                raise inputs_mod.InputError(
                    f"'{self.model.name}' uses the sequence batcher: naiad bench does not send sequences (start, "
                    "correlation id, end) yet; measure it with perf_analyzer (--sequence-length and the other "
                    "sequence flags are accepted for scripts, for models without sequence_batching)")
            self.include_server_stats = "statistics" in self.control.extensions()
            tensors = inputs_mod.build_inputs(
                self.model, batch_size=target.batch_size, input_data=target.input_data, shapes=target.shapes,
                string_length=self.options.string_length, string_data=self.options.string_data)
            self.spec = self._spec(tensors)
            self.generator = Generator(self.spec, processes, self.options.cpus)
        except BaseException:
            self.close()
            raise
        self.completed_total = 0
        self.errors_total = 0
        self.first_error: str | None = None
        self._pending = Records()
        self._poller: Any = None

    # --- setup ---------------------------------------------------------------------------------------------

    def _shared_memory(self, requests: list[list[inputs_mod.Tensor]]) -> dict[str, tuple[str, int, int]]:
        """One system shared-memory region holding every input (first data entry) and every output, registered
        with the server: requests then carry only region references, as perf_analyzer's --shared-memory."""
        import os

        import tritonclient.utils.shared_memory as shm

        layout: dict[str, tuple[str, int, int]] = {}
        blobs: list[bytes] = []
        offset = 0
        name = f"naiad_bench_{os.getpid()}"
        for tensor in requests[0]:
            layout[tensor.name] = (name, offset, len(tensor.data))
            blobs.append(tensor.data)
            offset += len(tensor.data)
        for out in self.model.outputs:
            if out.datatype == "BYTES" or any(d < 0 for d in out.shape):
                size = self.options.output_shm_size * max(1, self.target.batch_size)
            else:
                from naiad.core.datatypes import WIRE_TO_NUMPY

                count = 1
                for d in out.shape:
                    count *= d
                size = count * WIRE_TO_NUMPY[out.datatype].itemsize * (self.target.batch_size
                                                                        if self.model.max_batch_size else 1)
            layout[out.name] = (name, offset, size)
            offset += size
        handle = shm.create_shared_memory_region(name, f"/{name}", max(offset, 1))
        self.shm_regions.append((name, handle))
        position = 0
        import numpy as np

        for blob in blobs:
            shm.set_shared_memory_region(handle, [np.frombuffer(blob, dtype=np.uint8)], offset=position)
            position += len(blob)
        self.control.register_shm(name, f"/{name}", max(offset, 1))
        return layout

    def _spec(self, requests: list[list[inputs_mod.Tensor]]) -> dict[str, Any]:
        layout = self._shared_memory(requests) if self.options.shared_memory == "system" else None
        if layout is not None:
            requests = requests[:1]
        if self.protocol == "http":
            host, port = split_url(self.target.url, 8000)
            bodies = [inputs_mod.http_request(f"{host}:{port}", self.model, t, headers=self.options.headers,
                                              shm=layout) for t in requests]
            return {"protocol": "http", "host": host, "port": port, "bodies": bodies}
        host, port = split_url(self.target.url, 8001)
        bodies = [inputs_mod.grpc_request(self.model, t, streaming=self.options.streaming, shm=layout)
                  for t in requests]
        return {"protocol": "grpc", "target": f"{host}:{port}", "bodies": bodies,
                "method": "/inference.GRPCInferenceService/ModelInfer", "streaming": self.options.streaming,
                "decoupled": self.model.decoupled, "grpc_channels": max(1, self.options.grpc_channels),
                "compression": self.options.compression,
                # the lean client sends uncompressed messages only: compression goes through grpcio's
                "grpc_client": "aio" if self.options.grpc_client == "grpcio" or self.options.compression != "none"
                else "lean"}

    # --- measuring -----------------------------------------------------------------------------------------

    def _server_stats(self) -> dict[str, dict[str, int]]:
        if not self.include_server_stats:
            return {}
        if self.model.composing:
            return self.control.all_stats()
        return self.control.stats(self.model.name, self.model.version)

    def _collect(self, records: Records) -> None:
        self.completed_total += records.completed
        self.errors_total += records.errors
        self.first_error = self.first_error or records.error
        self._pending.extend(records)

    def _window(self, start_ns: int,
                start_stats: dict[str, dict[str, int]]) -> tuple[PerfStatus, int, dict[str, dict[str, int]]]:
        s = self.settings
        assert self.generator is not None
        if s.measurement_mode == "count_windows" or s.request_count:
            wanted = s.request_count or s.measurement_request_count
            while True:
                time.sleep(0.1)
                self._collect(self.generator.swap())
                if sum(1 for e in self._pending.ends if e >= start_ns) >= wanted:
                    break
        else:
            # perf_analyzer sleeps 1.2 x the measurement interval per window.
            end_at = time.monotonic() + s.measurement_interval_ms * 1.2 / 1000
            while True:
                left = end_at - time.monotonic()
                if left <= 0:
                    break
                time.sleep(min(left, 0.25))
        end_ns = time.monotonic_ns()
        end_stats = self._server_stats()
        self._collect(self.generator.swap())
        status = self._summarize(start_ns, end_ns, start_stats, end_stats)
        return status, end_ns, end_stats

    def _summarize(self, start_ns: int, end_ns: int, start_stats: dict[str, dict[str, int]],
                   end_stats: dict[str, dict[str, int]]) -> PerfStatus:
        p = self._pending
        keep = Records()
        status = PerfStatus(concurrency=self.generator.concurrency if self.generator else 0,
                            request_rate=self.generator.rate if self.generator else 0.0,
                            batch_size=max(1, self.target.batch_size))
        latencies = []
        kept = status.requests if self.settings.keep_requests else None
        for start, end, delayed, responses in zip(p.starts, p.ends, p.delayed, p.responses):
            if end > end_ns:
                keep.starts.append(start)
                keep.ends.append(end)
                keep.delayed.append(delayed)
                keep.responses.append(responses)
            elif end >= start_ns:
                latencies.append(end - start)
                if kept is not None:
                    kept.append((start, end))
                status.client.delayed_request_count += delayed
                status.client.response_count += responses
        latencies.sort()
        status.windows = [start_ns, end_ns]
        client = status.client
        client.latencies = latencies
        client.request_count = len(latencies)
        client.duration_ns = end_ns - start_ns
        client.completed_count = p.completed
        client.errors = p.errors
        if p.completed:
            client.avg_request_time_ns = p.request_ns // p.completed
            client.avg_send_time_ns = p.send_ns // p.completed
            client.avg_receive_time_ns = p.receive_ns // p.completed
        status.send_request_rate = p.sent / (client.duration_ns / 1e9) if client.duration_ns else 0.0
        self._pending = keep
        rates(status)
        summarize_latency(status, self.settings.percentile)
        if self.include_server_stats:
            status.server = stats_delta(start_stats.get(self.model.name), end_stats.get(self.model.name))
            for name in self.model.composing:
                status.composing[name] = stats_delta(start_stats.get(name), end_stats.get(name))
        if self.settings.collect_metrics:
            status.metrics = self._metrics()
        return status

    def _metrics(self) -> dict[str, dict[str, float]]:
        if self._poller is None:
            from naiad.bench.metrics import Poller

            url = self.settings.metrics_url or f"{split_url(self.target.url, 8000)[0]}:8002/metrics"
            self._poller = Poller(url, self.settings.metrics_interval_ms)
        return self._poller.take()

    def set_load(self, concurrency: int | None = None, request_rate: float | None = None) -> None:
        assert self.generator is not None
        if request_rate and self.options.intervals_us:
            self.generator.set_intervals(self.options.intervals_us)
        elif request_rate:
            self.generator.set_rate(request_rate, self.settings.distribution)
        else:
            self.generator.set_concurrency(int(concurrency or 1))

    def profile(self, concurrency: int | None = None, request_rate: float | None = None,
                label: str = "", warmup: int = 0) -> PerfStatus:
        """perf_analyzer's ProfileHelper for one load level."""
        s = self.settings
        self.set_load(concurrency, request_rate)
        if warmup:
            done = 0
            while done < warmup:   # --warmup-request-count: answered before the first window opens
                time.sleep(0.05)
                records = self.generator.swap()  # type: ignore[union-attr]
                self._collect(records)
                done += records.completed
                if records.errors and not records.completed:
                    break
        self._pending = Records()
        threshold = s.stability_percentage / 100
        throughputs: list[float] = []
        latencies: list[float] = []
        recent: list[PerfStatus] = []
        recent_all: list[PerfStatus] = []   # every window, for the profile export
        start_ns = time.monotonic_ns()
        start_stats = self._server_stats()
        self._collect(self.generator.swap())  # type: ignore[union-attr]
        self._pending = Records()
        if s.collect_metrics:
            self._metrics()   # starts the poller; drops samples from before this level
        stable = False
        for trial in range(s.max_trials):
            status, start_ns, start_stats = self._window(start_ns, start_stats)
            recent.append(status)
            recent_all.append(status)
            recent = recent[-STABILITY_WINDOW:]
            ok = status.error is None
            throughputs.append(status.client.infer_per_sec if ok else 0.0)
            latencies.append(float(status.stabilizing_latency_ns) if ok else float("inf"))
            if self.progress is not None:
                self.progress({"label": label, "pass": trial + 1, "max_trials": s.max_trials, "status": status})
            if s.request_count:
                stable = True
                break
            stable = is_stable(throughputs, latencies, threshold)
            if stable:
                break
            if s.latency_threshold_ms and len(latencies) >= STABILITY_WINDOW and not all(
                    x < s.latency_threshold_ms * 1e6 for x in latencies[-STABILITY_WINDOW:]):
                break
        if not stable and s.async_mode and is_stable(throughputs, latencies, threshold, check_latency=False):
            stable = True   # perf_analyzer: "Request latency is not stabilizing", reported anyway in async mode
        errors = [st.error for st in recent if st.error]
        usable = [st for st in recent if not st.error] or recent
        merged = merge(usable, s.percentile) if usable and not errors else (recent[-1] if recent else PerfStatus())
        merged.concurrency = int(concurrency or 0)
        merged.request_rate = float(request_rate or 0.0)
        merged.stable = stable and not errors
        if not merged.stable and not errors:
            merged.note = _instability(throughputs, latencies, s.stability_percentage)
        if s.keep_requests:
            merged.requests = [r for st in recent_all for r in st.requests]
            merged.windows = sorted({t for st in recent_all for t in st.windows})
        if errors and merged.error is None:
            merged.error = errors[0]
        if s.collect_metrics:
            from naiad.bench.metrics import merge as merge_metrics

            merged.metrics = merge_metrics([st.metrics for st in recent if st.metrics])
        return merged

    def stop(self) -> Records:
        """Stop the load; every request in flight is waited for and counted."""
        if self.generator is None:
            return Records()
        records = self.generator.stop()
        self._collect(records)
        return records

    def close(self) -> None:
        if self.generator is not None and not self.generator.closed:
            try:
                self.stop()
            finally:
                self.generator.close()
        for name, handle in self.shm_regions:
            try:
                self.control.unregister_shm(name)
            except Exception:  # noqa: BLE001 - the server may be gone already
                pass
            import tritonclient.utils.shared_memory as shm

            shm.destroy_shared_memory_region(handle)
        self.shm_regions = []
        if getattr(self, "_poller", None) is not None:
            self._poller.stop()
        self.control.close()

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _instability(throughputs: list[float], latencies: list[float], percentage: float) -> str:
    """Why the last windows were not stable, in figures."""
    ips, lat = throughputs[-STABILITY_WINDOW:], [x for x in latencies[-STABILITY_WINDOW:] if x != float("inf")]
    parts = [f"not stable after {len(throughputs)} window(s)"]
    if ips and min(ips) > 0:
        parts.append(f"throughput {min(ips):.1f}-{max(ips):.1f} infer/sec ({(max(ips) / min(ips) - 1) * 100:.0f} %)")
    if lat and min(lat) > 0:
        parts.append(f"latency {min(lat) / 1000:.0f}-{max(lat) / 1000:.0f} usec "
                     f"({(max(lat) / min(lat) - 1) * 100:.0f} %)")
    return ", ".join(parts) + f" over the last {STABILITY_WINDOW} windows; -s allows {percentage:g} %"


def ceiling(url: str, protocol: str = "http", concurrency: int = 16, seconds: float = 1.0,
            processes: int | None = None, cpus: list[int] | None = None) -> float:
    """The generator's own ceiling: requests/s it reaches against the server's cheapest route (GET
    /v2/health/live, or gRPC ServerLive), with the same processes and connections as a measurement."""
    protocol = protocol.lower()
    if protocol == "http":
        host, port = split_url(url, 8000)
        spec: dict[str, Any] = {"protocol": "http", "host": host, "port": port,
                                "bodies": [inputs_mod.http_get(f"{host}:{port}", "/v2/health/live")]}
    else:
        host, port = split_url(url, 8001)
        spec = {"protocol": "grpc", "target": f"{host}:{port}", "bodies": [b""],
                "method": "/inference.GRPCInferenceService/ServerLive", "grpc_channels": 1}
    generator = Generator(spec, processes, cpus)
    try:
        generator.set_concurrency(concurrency)
        time.sleep(min(0.3, seconds / 3))
        generator.swap()
        start = time.monotonic_ns()
        time.sleep(seconds)
        end = time.monotonic_ns()
        records = generator.swap()
        done = sum(1 for e in records.ends if e <= end)
        return done / ((end - start) / 1e9)
    finally:
        generator.stop()
