"""Open-loop overload of a slow model, with and without ``max_queue_size`` in its dynamic_batching.

The model executes one batch of up to 4 requests per ``--delay`` seconds (capacity 4 / delay requests/s); the load
offers ``--factor`` times that, at a fixed rate, for ``--seconds``, over ``--connections`` pipelined HTTP/1.1
connections. Reported per variant: answers by status (503s must say "Exceeds maximum queue size"), requests left
unanswered at the client's timeout, latency percentiles of served and of refused requests, and the server tree's
RSS before, at its peak and after; then whether the server is still healthy.

    timeout 600 python benchmarks/reliability/overload.py                       # 10x, 10 s, queue limit 16
    python benchmarks/reliability/overload.py --factor 20 --seconds 5 --queue 64
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests.reliability import http_oracle, procs  # noqa: E402
from tests.reliability.load import percentile  # noqa: E402
from tests.reliability.repo import write_echo_pid, write_slow  # noqa: E402
from tests.server import RunningServer  # noqa: E402

FULL = "Exceeds maximum queue size"


class Connection:
    """One pipelined connection: requests go out when scheduled, answers come back in order."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, results: list) -> None:
        self.reader = reader
        self.writer = writer
        self.sent: collections.deque[float] = collections.deque()
        self.results = results
        self.task = asyncio.ensure_future(self._read())

    def send(self, request: bytes) -> None:
        self.sent.append(time.monotonic())
        self.writer.write(request)

    async def _read(self) -> None:
        try:
            while True:
                head = await self.reader.readuntil(b"\r\n\r\n")
                status = int(head[9:12])
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":", 1)[1])
                body = await self.reader.readexactly(length) if length else b""
                started = self.sent.popleft()
                error = json.loads(body).get("error") if status != 200 and body else None
                self.results.append((status, time.monotonic() - started, error))
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            return


async def offer(port: int, model: str, rate: float, seconds: float, connections: int, timeout: float,
                pid: int) -> dict:
    results: list = []
    conns = []
    for _ in range(connections):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        conns.append(Connection(reader, writer, results))
    body = json.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 1], "data": [1.0]}]}).encode()
    request = (b"POST /v2/models/%s/infer HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s"
               % (model.encode(), len(body), body))
    rss = [procs.snapshot(pid).rss]
    total = int(rate * seconds)
    start = time.monotonic()
    for i in range(total):
        delay = start + i / rate - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        conns[i % connections].send(request)
        if i % max(int(rate / 2), 1) == 0:
            rss.append(procs.snapshot(pid).rss)
    offered_for = time.monotonic() - start
    deadline = time.monotonic() + timeout
    while len(results) < total and time.monotonic() < deadline:
        await asyncio.sleep(0.25)
        rss.append(procs.snapshot(pid).rss)
    for conn in conns:
        conn.task.cancel()
        conn.writer.close()
    await asyncio.sleep(0.5)  # the server notices the closed connections and drops what they still wait for
    # How soon a fresh request is served once the clients gave up: abandoned requests should not still run first.
    fresh_started = time.monotonic()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    fresh = Connection(reader, writer, [])
    fresh.send(request)
    try:
        while not fresh.results and time.monotonic() - fresh_started < timeout + 60:
            await asyncio.sleep(0.01)
    finally:
        fresh.task.cancel()
        writer.close()
    return {"results": results, "offered": total, "offered_for": offered_for, "rss": rss,
            "after": procs.snapshot(pid).rss, "fresh": (fresh.results[0][0] if fresh.results else None,
                                                        time.monotonic() - fresh_started)}


def summary(name: str, run: dict, capacity: float) -> None:
    results = run["results"]
    statuses = collections.Counter(s for s, _, _ in results)
    served = [t for s, t, _ in results if s == 200]
    refused = [t for s, t, _ in results if s == 503]
    wrong = [e for s, _, e in results if s == 503 and not (e or "").endswith(FULL)]
    others = {s: n for s, n in statuses.items() if s not in (200, 503)}
    lost = run["offered"] - len(results)
    ms = lambda values, q: percentile(values, q) * 1000  # noqa: E731
    print(f"\n== {name}: offered {run['offered']} requests in {run['offered_for']:.1f} s "
          f"({run['offered'] / run['offered_for']:.0f}/s against a capacity of {capacity:.0f}/s)")
    print(f"   200: {statuses[200]}   503: {statuses[503]} ({len(wrong)} without '{FULL}')   other: {others or 0}   "
          f"unanswered at the client's timeout: {lost}")
    if served:
        print(f"   served  latency ms: p50 {ms(served, .5):8.1f}  p90 {ms(served, .9):8.1f}  p99 {ms(served, .99):8.1f}"
              f"  max {max(served) * 1000:8.1f}")
    if refused:
        print(f"   refused latency ms: p50 {ms(refused, .5):8.1f}  p90 {ms(refused, .9):8.1f}  "
              f"p99 {ms(refused, .99):8.1f}  max {max(refused) * 1000:8.1f}")
    mib = 2**20
    print(f"   a fresh request once the clients left: {run['fresh'][0]} after {run['fresh'][1] * 1000:.0f} ms")
    print(f"   server tree RSS MiB: before {run['rss'][0] / mib:.1f}  peak {max(run['rss']) / mib:.1f}  "
          f"after {run['after'] / mib:.1f}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--delay", type=float, default=0.1, help="seconds per execution (batches of up to 4)")
    parser.add_argument("--factor", type=float, default=10.0, help="offered load / capacity")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--queue", type=int, default=16, help="max_queue_size of the limited variant")
    parser.add_argument("--connections", type=int, default=512,
                        help="pipelined: many, so a refusal rarely waits behind a served request")
    parser.add_argument("--timeout", type=float, default=30.0, help="how long the client waits after the last send")
    parser.add_argument("--variants", default="limited,unlimited")
    args = parser.parse_args()
    capacity = 4 / args.delay
    failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        write_slow(Path(tmp), "limited", args.delay, max_queue_size=args.queue)
        write_slow(Path(tmp), "unlimited", args.delay)
        write_echo_pid(Path(tmp), "echo")
        for variant in args.variants.split(","):
            server = RunningServer([Path(tmp)])
            try:
                run = asyncio.run(offer(server.http_port, variant, capacity * args.factor, args.seconds,
                                        args.connections, args.timeout, server.proc.pid))
                label = f"{variant}" + (f" (max_queue_size {args.queue})" if variant == "limited" else "")
                summary(label, run, capacity)
                problem = http_oracle.healthy("127.0.0.1", server.http_port)
                print(f"   healthy after: {'yes' if problem is None else problem}")
                failed += problem is not None or server.proc.poll() is not None
            finally:
                server.stop()
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
