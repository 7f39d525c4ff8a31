"""The front end's face over a channel, against a host played here: at most MAX_IN_FLIGHT requests reach the host,
the rest wait (a slow host pushes back instead of growing memory), and a request withdrawn while waiting never
goes."""

from __future__ import annotations

import asyncio
import socket
import threading

import numpy as np
import pytest

from naiad.backends.python.shm import Arena
from naiad.backends.python.transport import Channel
from naiad.config.loader import parse_config_text
from naiad.core.model_view import ModelView
from naiad.core.request import InferRequest
from naiad.service import remote, wire
from naiad.service.precheck import Precheck

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


CONFIG = """
    name: "m"
    max_batch_size: 4
    input [{ name: "A", data_type: TYPE_FP32, dims: [ 4 ], reshape { shape: [ 2, 2 ] } },
           { name: "B", data_type: TYPE_INT32, dims: [ 2 ] }]
    output [{ name: "OUT", data_type: TYPE_FP32, dims: [ 4 ] }]
"""


def test_requests_are_checked_before_they_go_and_sent_as_they_came_when_they_fail() -> None:
    async def run() -> None:
        front, back = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        service = remote.RemoteService(front, lambda: None)
        service.attach(asyncio.get_running_loop())
        host = Channel(back, Arena(), blocking=True)
        back.settimeout(10)  # (a front end that asks nothing leaves the host's thread waiting no longer)
        config = parse_config_text(CONFIG).SerializeToString()

        async def view(number: int) -> Precheck:
            """The front end asks for the view (a call it awaits, its loop free meanwhile); the host answers it from
            another thread."""
            def answer() -> None:
                (call,) = host.receive(wait=True)
                assert call[0] == wire.CALL and call[2:] == ("model", ("m", ""))
                host.send((wire.REPLY, call[1], True, tuple(wire.View(tuple(VIEW)[:-1], number, config))))
            assert service.view("m", "") is None  # not known here: ask
            thread = threading.Thread(target=answer)
            thread.start()
            got = await service.model("m", "")
            thread.join()
            assert got[:-1] == VIEW[:-1] and isinstance(got.handle, Precheck)
            return got.handle

        try:
            assert (await view(5)).number == 5
            kept = service.view("m", "")
            assert kept is not None and kept.handle.number == 5  # kept: no second call

            a = np.arange(12, dtype=np.float32).reshape(3, 4)
            service.infer(InferRequest("m", "", "ok", {"A": a, "B": np.zeros((3, 2), np.int32)}), kept)
            # B's datatype is wrong; A, checked first, passed (and was reshaped in the check's own copy).
            service.infer(InferRequest("m", "", "bad", {"B": np.zeros((1, 2), np.float32),
                                                          "A": np.zeros((1, 4), np.float32)}), kept)
            service.infer(InferRequest("m", "", "no view", {"A": a}), VIEW)  # a view without a signature
            await asyncio.sleep(0)
            sent = {r.request_id: r for r in map(wire.Request._make, await asyncio.to_thread(host.receive, True))}
            assert (sent["ok"].checked, sent["ok"].batch_size) == (5, 3)
            assert sent["ok"].undo == ("", (("A", (3, 4)),))  # for the host, should another version serve it
            assert dict(host.unpack(False, *t)[:2] for t in sent["ok"].inputs)["A"].shape == (3, 2, 2)
            for unchecked in (sent["bad"], sent["no view"]):
                assert (unchecked.checked, unchecked.batch_size) == (0, 0)
            assert [(name, array.shape) for name, array in (host.unpack(False, *t) for t in sent["bad"].inputs)] \
                == [("B", (1, 2)), ("A", (1, 4))]

            # The repository changed: the view goes, and with it the number it came with.
            host.send((wire.INVALIDATE,))
            await asyncio.sleep(0.1)
            assert (await view(6)).number == 6
        finally:
            service.close()
            host.close()

    asyncio.run(run())


def _state(server_ready: bool, model_ready: bool) -> tuple:
    return tuple(wire.State(wire.STATE, True, server_ready, None, {"m": {"": model_ready, "1": model_ready}}, "naiad",
                            "none", False, ""))


def test_health_reads_the_state_the_host_sent_before_it_answers() -> None:
    """The host sends every front end a changed state before it answers the change through any of them: a query
    read in the same turn of the loop as that state (not yet read) answers from it, whichever way it points."""
    async def run() -> None:
        front, back = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        service = remote.RemoteService(front, lambda: None)
        service.attach(asyncio.get_running_loop())
        host = Channel(back, Arena())
        host.send(_state(True, True))
        await asyncio.sleep(0.05)
        assert service.is_ready() and service.model_ready("m") and service.model_ready("m", "1")
        for server_ready, model_ready in [(True, False), (False, False), (True, True)]:
            host.send(_state(server_ready, model_ready))  # (and this loop gets no turn before the queries)
            assert service.model_ready("m") is model_ready and service.model_ready("m", "1") is model_ready
            assert service.is_ready() is server_ready
        assert not service.model_ready("unknown")
        service.close()
        host.close()

    asyncio.run(run())
