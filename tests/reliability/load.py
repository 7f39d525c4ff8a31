"""A small closed-loop load generator over HTTP (threads, one kept-alive connection each) that records every
request's model, status, error and latency. Used by the live reliability tests and benchmarks/reliability."""

from __future__ import annotations

import http.client
import json
import threading
import time
from dataclasses import dataclass, field
from typing import Callable


@dataclass
class Result:
    model: str
    started: float  # monotonic seconds
    seconds: float
    status: int | None  # None: no answer before the client's timeout (or the connection broke)
    error: str | None = None
    output: list | None = None


def fp32_body(values: list[float], shape: list[int] | None = None) -> bytes:
    return json.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": shape or [len(values)],
                                   "data": values}]}).encode()


def infer_once(conn: http.client.HTTPConnection, model: str, body: bytes) -> tuple[int, dict]:
    conn.request("POST", f"/v2/models/{model}/infer", body, {"Content-Type": "application/json"})
    response = conn.getresponse()
    return response.status, json.loads(response.read() or b"{}")


@dataclass
class Load:
    """``clients`` threads, each sending to ``models[i % len(models)]`` until ``stop()``."""

    port: int
    models: list[str]
    clients: int
    timeout: float = 10.0
    body: Callable[[int], bytes] = lambda n: fp32_body([float(n % 7), 1.0])
    results: list[Result] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._loop, args=(i,), daemon=True) for i in range(self.clients)]

    def start(self) -> "Load":
        for thread in self._threads:
            thread.start()
        return self

    def stop(self) -> list[Result]:
        self._stop.set()
        for thread in self._threads:
            thread.join(self.timeout + 5)
        return self.results

    def _loop(self, index: int) -> None:
        model = self.models[index % len(self.models)]
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=self.timeout)
        n = 0
        while not self._stop.is_set():
            n += 1
            started = time.monotonic()
            try:
                status, doc = infer_once(conn, model, self.body(n))
                result = Result(model, started, time.monotonic() - started, status, doc.get("error"),
                                doc.get("outputs"))
            except (OSError, http.client.HTTPException, ValueError) as exc:
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=self.timeout)
                result = Result(model, started, time.monotonic() - started, None, repr(exc))
            with self._lock:
                self.results.append(result)
        conn.close()


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]
