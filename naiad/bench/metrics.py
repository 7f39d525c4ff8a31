"""--collect-metrics: the server's Prometheus page scraped every --metrics-interval during a window, merged as
perf_analyzer merges it (GPU utilization and power averaged, memory used maxed, total memory first seen), plus
the CPU gauges Triton and naiad publish (nv_cpu_utilization averaged, nv_cpu_memory_used_bytes maxed)."""

from __future__ import annotations

import http.client
import re
import threading
import time

GPU_AVERAGED = ("nv_gpu_utilization", "nv_gpu_power_usage")
GPU_MAXED = ("nv_gpu_memory_used_bytes",)
GPU_FIRST = ("nv_gpu_memory_total_bytes",)
CPU_AVERAGED = ("nv_cpu_utilization",)
CPU_MAXED = ("nv_cpu_memory_used_bytes", "nv_cpu_memory_total_bytes")

_LINE = re.compile(r'^(\w+)(?:\{([^}]*)\})?\s+([-+0-9.eE]+|NaN|Nan)\s*$')
_UUID = re.compile(r'gpu_uuid="([^"]*)"')

Sample = dict[str, dict[str, float]]   # metric -> {gpu uuid or "": value}


def scrape_once(url: str, timeout: float = 5.0) -> Sample:
    url = url.split("://", 1)[-1]
    hostport, _, path = url.partition("/")
    host, _, port = hostport.rpartition(":")
    conn = http.client.HTTPConnection(host or hostport, int(port) if host else 8002, timeout=timeout)
    try:
        conn.request("GET", "/" + (path or "metrics"))
        text = conn.getresponse().read().decode(errors="replace")
    finally:
        conn.close()
    wanted = set(GPU_AVERAGED + GPU_MAXED + GPU_FIRST + CPU_AVERAGED + CPU_MAXED)
    sample: Sample = {}
    for line in text.splitlines():
        match = _LINE.match(line)
        if not match or match.group(1) not in wanted:
            continue
        uuid = _UUID.search(match.group(2) or "")
        sample.setdefault(match.group(1), {})[uuid.group(1) if uuid else ""] = float(match.group(3))
    return sample


def merge(samples: list[Sample]) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for name in GPU_AVERAGED + CPU_AVERAGED:
        values: dict[str, list[float]] = {}
        for sample in samples:
            for key, value in sample.get(name, {}).items():
                values.setdefault(key, []).append(value)
        if values:
            out[name] = {k: sum(v) / len(v) for k, v in values.items()}
    for name in GPU_MAXED + CPU_MAXED:
        maxed: dict[str, float] = {}
        for sample in samples:
            for key, value in sample.get(name, {}).items():
                maxed[key] = max(maxed.get(key, value), value)
        if maxed:
            out[name] = maxed
    for name in GPU_FIRST:
        for sample in samples:
            if name in sample:
                out[name] = dict(sample[name])
                break
    return out


class Poller:
    """A thread scraping every interval; take() returns the merge of the samples since the last take()."""

    def __init__(self, url: str, interval_ms: int) -> None:
        self.url = url
        self.interval = interval_ms / 1000
        self.samples: list[Sample] = []
        self.error: str | None = None
        self.lock = threading.Lock()
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, name="naiad-bench-metrics", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stopped.is_set():
            started = time.monotonic()
            try:
                sample = scrape_once(self.url)
                with self.lock:
                    self.samples.append(sample)
            except OSError as exc:
                self.error = f"failed to query metrics from {self.url}: {exc}"
            self.stopped.wait(max(0.0, self.interval - (time.monotonic() - started)))

    def take(self) -> dict[str, dict[str, float]]:
        with self.lock:
            samples, self.samples = self.samples, []
        if not samples:
            try:
                samples = [scrape_once(self.url)]
            except OSError as exc:
                self.error = f"failed to query metrics from {self.url}: {exc}"
                return {}
        return merge(samples)

    def stop(self) -> None:
        self.stopped.set()
        self.thread.join(2)
