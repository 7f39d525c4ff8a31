"""The front end's face over a channel, against a host played here: at most MAX_IN_FLIGHT requests reach the host,
the rest wait (a slow host pushes back instead of growing memory), and a request withdrawn while waiting never
goes."""

from __future__ import annotations

import asyncio
import socket

import numpy as np
import pytest

from naiad.backends.python.shm import Arena
from naiad.backends.python.transport import Channel
from naiad.core.model_view import ModelView
from naiad.core.request import InferRequest
from naiad.service import remote, wire

VIEW = ModelView("m", "1", "python", False, False, {}, [], [], {})


async def _received(host: Channel, count: int) -> list[tuple]:
    got: list[tuple] = []
    for _ in range(100):
        got += [m for m in host.receive() if m[0] in (wire.INFER, wire.CANCEL)]
        if len(got) >= count:
            break
        await asyncio.sleep(0.01)
    return got


def test_requests_over_the_bound_wait_and_a_withdrawn_one_never_goes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(remote, "MAX_IN_FLIGHT", 2)

    async def run() -> None:
        front, back = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        service = remote.RemoteService(front, lambda: None)
        service.attach(asyncio.get_running_loop())
        host = Channel(back, Arena())
        futures = [service.infer(InferRequest("m", "", str(i), {"X": np.full(4, i, np.float32)}), VIEW)
                   for i in range(5)]
        first = await _received(host, 2)
        assert [m[4] for m in first] == ["0", "1"]  # request ids: only two reached the host
        await asyncio.sleep(0.05)
        assert not [m for m in host.receive() if m[0] == wire.INFER]
        futures[2].cancel()  # the client of a waiting request goes away
        await asyncio.sleep(0.01)
        host.send((wire.RESULT, first[0][1], "m", "1", "0", [], {}, None, True))
        (third,) = await _received(host, 1)
        assert third[4] == "3"  # the withdrawn one was skipped, and no CANCEL was sent for it
        assert futures[0].done() and futures[0].result().id == "0"
        assert service.in_flight == 3  # 1, 3 at the host; 4 waiting
        service.close()
        host.close()

    asyncio.run(run())
