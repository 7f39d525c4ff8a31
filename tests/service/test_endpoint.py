"""Both ends of the front-end channel (``endpoint.ChannelEnd``), over a real socket pair: a tensor crosses inline
when the arena can't grow, a message too large for a datagram crosses in parts when it can't be parked, and an arena
a burst grew goes back to its idle size at idle."""

from __future__ import annotations

import asyncio
import socket

import numpy as np
import pytest

from naiad.backends.python import shm
from naiad.core.errors import InferError
from naiad.service import endpoint, wire
from naiad.service.endpoint import ChannelEnd


class End(ChannelEnd):
    def __init__(self, sock: socket.socket) -> None:
        self._open(sock)
        self.got: list[tuple] = []

    def _on_readable(self) -> None:
        while True:
            messages = self._receive()
            if messages is None:
                return
            self.got += [m for m in messages if m[0] != wire.BEAT]

    def _channel_lost(self) -> None:
        raise AssertionError("the channel closed")


async def _pair() -> tuple[End, End]:
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    left, right = End(a), End(b)
    loop = asyncio.get_running_loop()
    left.attach(loop)
    right.attach(loop)
    return left, right


def _close(*ends: End) -> None:
    for end in ends:
        end._stop_sweeping()
        end.channel.close()


async def _until(end: End, count: int) -> list[tuple]:
    for _ in range(500):
        if len(end.got) >= count:
            return end.got
        await asyncio.sleep(0.01)
    raise AssertionError(f"{len(end.got)} of {count} messages came")


def test_tensors_cross_inline_and_in_parts_when_shared_memory_runs_short(monkeypatch: pytest.MonkeyPatch) -> None:
    def short(self: shm.Arena, nbytes: int) -> tuple:
        raise InferError("failed to allocate shared memory (test)")

    async def run() -> None:
        left, right = await _pair()
        monkeypatch.setattr(shm.Arena, "alloc", short)  # every block and every parked message refused
        big = np.arange(300_000, dtype=np.float32)  # 1.2 MB: inline, so the message is ~20 datagrams
        small = np.arange(10, dtype=np.int64)
        left.send((wire.RESULT, 1, left.records({"BIG": big, "SMALL": small})))
        left.send((wire.RESULT, 2, left.records({"SMALL": small})))  # in the same datagram batch as the first
        first, second = await _until(right, 2)
        arrays = dict(right.channel.unpack(False, *record) for record in first[2])
        assert np.array_equal(arrays["BIG"], big) and np.array_equal(arrays["SMALL"], small)
        assert second[1] == 2 and not right._parts  # in order, and nothing left half-assembled
        _close(left, right)

    asyncio.run(run())


def test_an_arena_a_burst_grew_goes_back_at_idle(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(endpoint, "SWEEP_SECONDS", 0.05)

    async def run() -> None:
        left, right = await _pair()
        big = np.ones(4_000_000, dtype=np.float32)  # 16 MB: the ring reaches past KEEP_BYTES
        left.send((wire.RESULT, 1, left.records({"BIG": big})))
        (message,) = await _until(right, 1)
        arrays = dict(right.channel.unpack(False, *record) for record in message[2])
        grown = left.channel.arena.current
        assert grown.limit > endpoint.KEEP_BYTES and list(right.channel.segments.maps) == [grown.id]
        del arrays, message  # the receiver lets go of the block
        right.got.clear()
        for _ in range(100):
            await asyncio.sleep(0.02)
            if grown.id not in right.channel.segments.maps:
                break
        fresh = left.channel.arena.current
        # A fresh segment (sparse: nothing reserved yet) in its place; the grown one unmapped on both sides.
        assert fresh is not grown and fresh.limit == 0 and grown.fd == -1
        assert list(right.channel.segments.maps) == [fresh.id]
        _close(left, right)

    asyncio.run(run())
