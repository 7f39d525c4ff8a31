"""One load-generator process: keeps its share of the concurrency (closed loop: each slot sends its next
request when the previous one answers) or of the request rate (open loop, on a constant or Poisson schedule),
and records every request's start and end. The parent swaps the records out at window boundaries.

Timestamps are CLOCK_MONOTONIC, which is one clock for every process on the machine, so the parent can cut
windows across workers."""

from __future__ import annotations

import asyncio
import os
import random
import time
from array import array
from multiprocessing.connection import Connection
from typing import Any

from naiad.bench.h2client import H2GrpcConnection
from naiad.bench.transport import GrpcChannel, GrpcStream, HttpConnection, Outcome

# A request sent this much later than its schedule counts as delayed (perf_analyzer's "delayed" requests).
DELAY_TOLERANCE_NS = 1_000_000


class Worker:
    def __init__(self, conn: Connection, spec: dict[str, Any]) -> None:
        self.conn = conn
        self.spec = spec
        self.bodies: list[bytes] = spec["bodies"]
        self.protocol = spec["protocol"]
        self.loop = asyncio.get_running_loop()
        self.done = self.loop.create_future()
        self._reset()
        self.slots: list[dict[str, Any]] = []
        self.scheduler: asyncio.Task[None] | None = None
        self.in_flight = 0
        self.idle_pool: list[Any] = []
        self.next_body = spec.get("index", 0)
        self.channels: list[GrpcChannel] = []
        self.lean: dict[int, H2GrpcConnection] = {}
        self.lean_lock = asyncio.Lock()
        self.stopping = False
        self.error: str | None = None

    def _reset(self) -> None:
        self.starts = array("q")
        self.ends = array("q")
        self.delayed = array("b")
        self.responses = array("i")
        self.completed = 0
        self.errors = 0
        self.sent = 0
        self.request_ns = 0
        self.send_ns = 0
        self.receive_ns = 0

    # --- connections -------------------------------------------------------------------------------------

    async def _connect(self) -> Any:
        if self.protocol == "http":
            return await HttpConnection.open(self.spec["host"], self.spec["port"])
        if not self.spec.get("streaming") and self.spec.get("grpc_client", "lean") == "lean":
            return await self._lean()
        if not self.channels:
            count = max(1, int(self.spec.get("grpc_channels", 1)))
            self.channels = [GrpcChannel(self.spec["target"], self.spec["method"], self.spec.get("streaming", False),
                                         self.spec.get("decoupled", False), self.spec.get("compression", "none"))
                             for _ in range(count)]
        channel = self.channels[self.sent % len(self.channels)]
        return channel.open_stream() if self.spec.get("streaming") else channel

    async def _lean(self) -> H2GrpcConnection:
        """Unary gRPC on the lean client: the worker's connections, shared by its callers as HTTP/2 streams."""
        count = max(1, int(self.spec.get("grpc_channels", 1)))
        index = self.sent % count
        async with self.lean_lock:
            current = self.lean.get(index)
            if current is None or not current.usable:
                if current is not None:
                    current.close()
                host, _, port = self.spec["target"].rpartition(":")
                current = await H2GrpcConnection.open(host, int(port), self.spec["method"])
                self.lean[index] = current
        return current

    async def _close(self, connection: Any) -> None:
        if isinstance(connection, HttpConnection):
            connection.close()
        elif isinstance(connection, GrpcStream):
            try:
                await connection.close()
            except Exception:  # noqa: BLE001 - the stream may already be gone
                pass

    # --- one request ---------------------------------------------------------------------------------------

    def _record(self, start: int, outcome: Outcome, delayed: bool, sent: int) -> None:
        end = time.monotonic_ns()
        ok, receive_ns, responses, error = outcome
        if ok:
            if sent > start:   # connections that see their write (not grpcio's) time it: "Client Send"
                self.send_ns += sent - start
            self.starts.append(start)
            self.ends.append(end)
            self.delayed.append(1 if delayed else 0)
            self.responses.append(responses)
            self.completed += 1
            self.request_ns += end - start
            self.receive_ns += receive_ns
        else:
            self.errors += 1
            if self.error is None:
                self.error = error

    def _body(self) -> bytes:
        body = self.bodies[self.next_body % len(self.bodies)]
        self.next_body += 1
        return body

    async def _slot(self, state: dict[str, Any]) -> None:
        connection = None
        try:
            while not state["stop"] and not self.stopping:
                if connection is None or not getattr(connection, "usable", True):
                    if connection is not None:
                        await self._close(connection)
                    connection = await self._connect()
                body = self._body()
                self.sent += 1
                self.in_flight += 1
                start = time.monotonic_ns()
                outcome = await connection.call(body)
                self.in_flight -= 1
                self._record(start, outcome, False, getattr(connection, "sent_ns", 0))
        except (OSError, ConnectionError) as exc:
            self.errors += 1
            self.error = self.error or f"connection failed: {exc}"
            await asyncio.sleep(0.05)   # the server is away: do not spin
            if not state["stop"] and not self.stopping:
                state["task"] = self.loop.create_task(self._slot(state))
                return
        finally:
            if connection is not None and (state["stop"] or self.stopping):
                await self._close(connection)

    def set_concurrency(self, count: int) -> None:
        self._stop_scheduler()
        live = [s for s in self.slots if not s["stop"]]
        while len(live) < count:
            state: dict[str, Any] = {"stop": False}
            state["task"] = self.loop.create_task(self._slot(state))
            live.append(state)
            self.slots.append(state)
        for state in live[count:]:
            state["stop"] = True    # finishes its request in flight, then leaves
        self.slots = [s for s in self.slots if not (s["stop"] and s["task"].done())]

    # --- request rate --------------------------------------------------------------------------------------

    def _stop_scheduler(self) -> None:
        if self.scheduler is not None:
            self.scheduler.cancel()
            self.scheduler = None

    def set_rate(self, rate: float, offset_s: float, distribution: str, seed: int) -> None:
        for state in self.slots:
            state["stop"] = True
        self._stop_scheduler()
        if rate > 0:
            self.scheduler = self.loop.create_task(self._schedule(rate, offset_s, distribution, seed))

    def set_intervals(self, offset_ns: int, gaps_ns: list[int]) -> None:
        for state in self.slots:
            state["stop"] = True
        self._stop_scheduler()
        self.scheduler = self.loop.create_task(self._intervals(offset_ns, gaps_ns))

    async def _intervals(self, offset_ns: int, gaps_ns: list[int]) -> None:
        """--request-intervals: this worker's share of the schedule, repeated."""
        due = time.monotonic_ns() + offset_ns
        index = 0
        while not self.stopping:
            now = time.monotonic_ns()
            if due > now:
                await asyncio.sleep((due - now) / 1e9)
                now = time.monotonic_ns()
            self.loop.create_task(self._one(now - due > DELAY_TOLERANCE_NS))
            due += gaps_ns[index]
            index = (index + 1) % len(gaps_ns)

    async def _schedule(self, rate: float, offset_s: float, distribution: str, seed: int) -> None:
        rng = random.Random(seed)
        interval_ns = int(1e9 / rate)
        due = time.monotonic_ns() + int(offset_s * 1e9)
        while not self.stopping:
            now = time.monotonic_ns()
            if due > now:
                await asyncio.sleep((due - now) / 1e9)
                now = time.monotonic_ns()
            self.loop.create_task(self._one(now - due > DELAY_TOLERANCE_NS))
            due += interval_ns if distribution == "constant" else int(rng.expovariate(rate) * 1e9)

    async def _one(self, delayed: bool) -> None:
        connection = None
        try:
            connection = self.idle_pool.pop() if self.idle_pool else await self._connect()
            self.sent += 1
            self.in_flight += 1
            start = time.monotonic_ns()
            outcome = await connection.call(self._body())
            self.in_flight -= 1
            self._record(start, outcome, delayed, getattr(connection, "sent_ns", 0))
        except (OSError, ConnectionError) as exc:
            self.errors += 1
            self.error = self.error or f"connection failed: {exc}"
            connection = None
        if connection is not None:
            if not getattr(connection, "usable", True):
                await self._close(connection)
            elif connection not in self.idle_pool:   # a shared gRPC connection is pooled once
                self.idle_pool.append(connection)

    # --- control -------------------------------------------------------------------------------------------

    def _swap(self) -> dict[str, Any]:
        out = {"starts": self.starts.tobytes(), "ends": self.ends.tobytes(), "delayed": self.delayed.tobytes(),
               "responses": self.responses.tobytes(), "completed": self.completed, "errors": self.errors,
               "sent": self.sent, "request_ns": self.request_ns, "send_ns": self.send_ns,
               "receive_ns": self.receive_ns,
               "error": self.error, "in_flight": self.in_flight}
        self._reset()
        self.error = None
        return out

    def _send(self, message: Any) -> None:
        """The event loop made the socket non-blocking for its reader; a report of many records must still go
        out whole, so it is written in blocking mode."""
        fd = self.conn.fileno()
        os.set_blocking(fd, True)
        try:
            self.conn.send(message)
        finally:
            os.set_blocking(fd, False)

    def on_command(self) -> None:
        while not self.stopping and self.conn.poll():
            try:
                command, *args = self.conn.recv()
            except EOFError:
                self.loop.create_task(self.stop())
                return
            if command == "concurrency":
                self.set_concurrency(int(args[0]))
            elif command == "rate":
                self.set_rate(*args)
            elif command == "intervals":
                self.set_intervals(*args)
            elif command == "swap":
                self._send(self._swap())
            elif command == "stop":
                self.loop.create_task(self.stop())

    async def stop(self) -> None:
        """Stop sending, let every request in flight answer (so counts match the server's), report, leave."""
        self.stopping = True
        self._stop_scheduler()
        deadline = time.monotonic() + 30
        while self.in_flight and time.monotonic() < deadline:
            await asyncio.sleep(0.002)
        for state in self.slots:
            state["stop"] = True
        for connection in self.idle_pool:
            await self._close(connection)
        try:
            self._send(self._swap())
        except OSError:
            pass   # the parent is gone: nobody to report to
        for channel in self.channels:
            await channel.close()
        for lean in self.lean.values():
            lean.close()
        if not self.done.done():
            self.done.set_result(None)

    async def run(self) -> None:
        self.loop.add_reader(self.conn.fileno(), self.on_command)
        self.conn.send(("ready", os.getpid()))
        await self.done
        self.loop.remove_reader(self.conn.fileno())


def child(fd: int) -> None:
    """Entry point of a worker interpreter: the parent's end of the socket pair sends (spec, cpu) first."""
    conn = Connection(fd)
    spec, cpu = conn.recv()
    main(conn, spec, cpu)


def main(conn: Connection, spec: dict[str, Any], cpu: int | None = None) -> None:
    if cpu is not None:
        try:
            os.sched_setaffinity(0, {cpu})
        except (AttributeError, OSError):
            pass

    async def run() -> None:
        await Worker(conn, spec).run()

    try:
        import uvloop

        uvloop.run(run())
    except ImportError:
        asyncio.run(run())
