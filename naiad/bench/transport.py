"""The load generator's connections: a bare HTTP/1.1 keep-alive client on asyncio (prepared request bytes out,
just enough parsing in to find the status and the end of the body) and gRPC calls on raw bytes through grpc.aio
(streaming, and unary with --grpc-client grpcio; unary calls default to the lean client in h2client.py).
Measured here, the bare HTTP client is several times faster per core than tritonclient's, which matters: the
generator must never be the bottleneck. Imported by worker processes, so it stays free of numpy and naiad."""

from __future__ import annotations

import asyncio
import time
from typing import Any

# (ok, receive_ns, responses, error message)
Outcome = tuple[bool, int, int, str | None]


class HttpConnection(asyncio.Protocol):
    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.waiter: asyncio.Future[Outcome] | None = None
        self.first_ns = 0
        self.need = -1
        self.header_end = 0
        self.status = 0
        self.closing = False
        self.lost = False
        self.sent_ns = 0   # when the last request was handed to the socket ("Client Send" ends there)

    @classmethod
    async def open(cls, host: str, port: int) -> "HttpConnection":
        loop = asyncio.get_running_loop()
        _, protocol = await loop.create_connection(lambda: cls(loop), host, port)
        return protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result((False, 0, 0, f"connection lost: {exc or 'closed by the server'}"))
            self.waiter = None

    def data_received(self, data: bytes) -> None:
        if not self.buffer:
            self.first_ns = time.monotonic_ns()
        self.buffer += data
        if self.need < 0:
            end = self.buffer.find(b"\r\n\r\n")
            if end < 0:
                return
            head = bytes(self.buffer[:end]).lower()
            self.status = int(head[9:12])
            at = head.find(b"\r\ncontent-length:")
            if at < 0:
                # No length: not a response this client can frame (naiad and Triton always send one).
                self._finish(False, "response without Content-Length")
                return
            stop = head.find(b"\r\n", at + 2)
            length = int(head[at + 17: stop if stop > 0 else len(head)])
            self.closing = b"\r\nconnection: close" in head
            self.header_end = end + 4
            self.need = self.header_end + length
        if len(self.buffer) >= self.need:
            ok = self.status == 200
            error = None
            if not ok:
                error = f"HTTP {self.status}: {bytes(self.buffer[self.header_end:self.need])[:300].decode(errors='replace')}"
            self._finish(ok, error)

    def _finish(self, ok: bool, error: str | None) -> None:
        receive_ns = time.monotonic_ns() - self.first_ns
        if self.need >= 0:
            del self.buffer[: self.need]
        else:
            self.buffer.clear()
        self.need = -1
        waiter, self.waiter = self.waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result((ok, receive_ns, 1, error))

    def call(self, request: bytes) -> asyncio.Future[Outcome]:
        waiter = self.loop.create_future()
        if self.lost or self.transport is None:
            waiter.set_result((False, 0, 0, "connection closed"))
            return waiter
        self.waiter = waiter
        self.transport.write(request)
        self.sent_ns = time.monotonic_ns()
        return waiter

    @property
    def usable(self) -> bool:
        return not (self.lost or self.closing)

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


class GrpcChannel:
    """Raw-bytes unary calls (or one bidirectional stream per caller) on a shared grpc.aio channel."""

    def __init__(self, target: str, method: str, streaming: bool = False, decoupled: bool = False,
                 compression: str = "none") -> None:
        import grpc

        self.grpc = grpc
        # A local subchannel pool: otherwise channels to one target share a single TCP connection.
        self.channel = grpc.aio.insecure_channel(target, options=[
            ("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1),
            ("grpc.use_local_subchannel_pool", 1)], compression={
                "gzip": grpc.Compression.Gzip, "deflate": grpc.Compression.Deflate}.get(compression))
        self.streaming = streaming
        self.decoupled = decoupled
        if streaming:
            self.stream_method = self.channel.stream_stream(
                "/inference.GRPCInferenceService/ModelStreamInfer")
        else:
            self.method = self.channel.unary_unary(method)

    async def call(self, request: bytes) -> Outcome:
        try:
            await self.method(request)
        except self.grpc.aio.AioRpcError as exc:
            return False, 0, 0, f"{exc.code().name}: {exc.details()}"
        return True, 0, 1, None

    def open_stream(self) -> "GrpcStream":
        return GrpcStream(self.stream_method(), self.decoupled)

    async def close(self) -> None:
        await self.channel.close()


class GrpcStream:
    """ModelStreamInfer for one caller at a time: a request, then its responses up to the final one."""

    def __init__(self, call: Any, decoupled: bool) -> None:
        from tritonclient.grpc import service_pb2

        self.parse = service_pb2.ModelStreamInferResponse.FromString
        self.stream = call
        self.decoupled = decoupled
        self.usable = True
        self.sent_ns = 0

    async def call(self, request: bytes) -> Outcome:
        try:
            return await self._call(request)
        except Exception as exc:  # noqa: BLE001 - a broken stream: reported, and the caller opens another
            self.usable = False
            details = exc.details() if hasattr(exc, "details") else str(exc)
            return False, 0, 0, f"stream failed: {details}"

    async def _call(self, request: bytes) -> Outcome:
        await self.stream.write(request)
        self.sent_ns = time.monotonic_ns()
        responses = 0
        while True:
            raw = await self.stream.read()
            if raw is None or raw is self._eof():
                self.usable = False
                return False, 0, responses, "stream closed by the server"
            message = self.parse(raw)
            if message.error_message:
                return False, 0, responses, message.error_message
            params = message.infer_response.parameters
            final = params["triton_final_response"].bool_param if "triton_final_response" in params else True
            if message.infer_response.outputs or not final:
                responses += 1
            if not self.decoupled or final:
                return True, 0, max(responses, 1) if not self.decoupled else responses, None

    @staticmethod
    def _eof() -> Any:
        import grpc

        return grpc.aio.EOF

    async def close(self) -> None:
        await self.stream.done_writing()
