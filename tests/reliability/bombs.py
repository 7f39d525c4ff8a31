"""Decompression bombs and what they cost a server: compressed bodies built without compressing gigabytes, the server
process's peak memory, and a gRPC client that sends a message already compressed (grpc's own clients only send what
they compress themselves)."""

from __future__ import annotations

import asyncio
import functools
import struct
import zlib
from typing import Any

import psutil

from naiad.bench.h2client import H2GrpcConnection
from naiad.frontends.http2.frames import DATA, END_HEADERS, END_STREAM, HEADERS, frame

MIB = 1 << 20


@functools.lru_cache(maxsize=4)
def bomb(encoding: str, mib: int) -> bytes:
    """``mib`` MiB of zeros as a ``gzip`` or ``deflate`` (zlib format) stream of about ``mib`` KiB.

    One MiB is compressed and ended with a full flush, which resets the compressor: every further MiB would compress
    to the same bytes, so the block is repeated instead of compressing the rest."""
    chunk = bytes(MIB)
    block = (packer := zlib.compressobj(9, zlib.DEFLATED, -15)).compress(chunk) + packer.flush(zlib.Z_FULL_FLUSH)
    raw = block * mib + zlib.compressobj(9, zlib.DEFLATED, -15).flush()  # an empty final block ends the stream
    if encoding == "gzip":
        crc = 0
        for _ in range(mib):
            crc = zlib.crc32(chunk, crc)
        return b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x02\xff" + raw + struct.pack("<II", crc, (mib * MIB) & 0xFFFFFFFF)
    adler = 1
    for _ in range(mib):
        adler = zlib.adler32(chunk, adler)
    return b"\x78\xda" + raw + struct.pack(">I", adler)


class Memory:
    """A process's resident memory: now, and its peak since ``reset_peak`` (Linux's VmHWM, which a process's owner
    can reset through /proc/<pid>/clear_refs)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.process = psutil.Process(pid)

    def rss(self) -> int:
        return self.process.memory_info().rss

    def reset_peak(self) -> None:
        try:
            with open(f"/proc/{self.pid}/clear_refs", "w") as f:
                f.write("5")
        except OSError:
            pass  # an older kernel: the peak then counts from the start, which only makes a bound stricter

    def peak(self) -> int:
        with open(f"/proc/{self.pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
        raise RuntimeError("no VmHWM")


class CompressedGrpc(H2GrpcConnection):
    """The bench's HTTP/2 gRPC client (flow control honoured both ways), sending every message as already compressed
    with ``encoding``; ``call`` answers (ok, latency, 1, "grpc-status N: message")."""

    def __init__(self, loop: asyncio.AbstractEventLoop, authority: str, path: str, encoding: str) -> None:
        super().__init__(loop, authority, path)
        self.block = self.encoder_block(authority, path, encoding)
        self.first_block = self.block

    @staticmethod
    def encoder_block(authority: str, path: str, encoding: str) -> bytes:
        from hpack import Encoder

        return Encoder().encode([(":method", "POST"), (":scheme", "http"), (":path", path), (":authority", authority),
                                 ("content-type", "application/grpc"), ("te", "trailers"),
                                 ("grpc-encoding", encoding)], huffman=False)

    @classmethod
    async def connect(cls, host: str, port: int, path: str, encoding: str) -> "CompressedGrpc":
        loop = asyncio.get_running_loop()
        _, protocol = await loop.create_connection(lambda: cls(loop, f"{host}:{port}", path, encoding), host, port)
        return protocol

    async def send(self, message: bytes, compressed: bool = True) -> Any:
        """One call whose message is ``message``, marked compressed (flag 1) or not (flag 0)."""
        assert self.transport is not None
        stream = self.next_stream
        self.next_stream += 2
        waiter: asyncio.Future = self.loop.create_future()
        self.waiters[stream] = waiter
        self.transport.write(frame(HEADERS, END_HEADERS, stream, self.block))
        self.stream_windows[stream] = self.stream_initial
        body = (b"\1" if compressed else b"\0") + len(message).to_bytes(4, "big") + message
        if len(body) <= min(self.send_window, self.stream_initial, self.max_frame):
            self.send_window -= len(body)
            self.transport.write(frame(DATA, END_STREAM, stream, body))
        else:
            await self._send_data(stream, body)
        return await waiter
