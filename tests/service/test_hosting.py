"""The model host's end of a front end's channel, against a front end played here over a real channel and a real
face (repository, scheduler, Python worker): a unary request is answered once, a cancelled one never, a refused
one at once, and a shutdown past its exit timeout answers what is left."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import numpy as np
import psutil
import pytest

from naiad.backends.python.shm import Arena
from naiad.backends.python.transport import Channel
from naiad.server import Server, ServerOptions
from naiad.service import hosting, wire
from naiad.service.face import Service
from naiad.service.hosting import Link
from tests.models import write_model

SLOW = """
    name: "slow"
    backend: "python"
    input [{ name: "INPUT0", data_type: TYPE_FP32, dims: [ -1 ] }]
    output [{ name: "OUTPUT0", data_type: TYPE_FP32, dims: [ -1 ] }]
    instance_group [{ kind: KIND_CPU, count: 1 }]
"""

SLOW_PY = """
    import time
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def execute(self, requests):
            time.sleep(float(requests[0].inputs()[0].as_numpy()[0]))
            return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", r.inputs()[0].as_numpy())])
                    for r in requests]
"""


def _infer(front: Channel, id_: int, seconds: float, name: str = "INPUT0") -> None:
    record = front.pack(name, np.array([seconds, 1.0], np.float32))
    front.send(tuple(wire.Request(wire.INFER, id_, "slow", "", f"r{id_}", [record], None, {}, 0, 0, 0, 0, None)))


@contextlib.asynccontextmanager
async def _hosted(repo: Path) -> AsyncIterator[tuple[Service, Link, Channel]]:
    """The models of ``repo`` behind a host's link, and the front end's end of its channel."""
    server = Server(ServerOptions(model_repositories=[repo]))
    await server._load_models()
    service = server.service
    service.live = service.accepting = True
    host_end, front_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    link = Link(service, host_end, lambda _: None, lambda: None, lambda _: None, lambda: [link])
    link.attach(asyncio.get_running_loop())
    front = Channel(front_end, Arena())
    try:
        yield service, link, front
    finally:
        link.close()
        front.close()
        server.repository.unload_all()


async def _results(front: Channel, count: int, within: float = 10.0) -> dict[int, tuple]:
    got: dict[int, tuple] = {}
    deadline = asyncio.get_running_loop().time() + within
    while len(got) < count and asyncio.get_running_loop().time() < deadline:
        got.update((m[1], m) for m in front.receive() if m[0] == wire.RESULT)
        await asyncio.sleep(0.01)
    return got


def test_answered_once_cancelled_never_refused_at_once_and_cut_at_shutdown(tmp_path: Path) -> None:
    write_model(tmp_path, "slow", SLOW, SLOW_PY)

    async def run() -> None:
        async with _hosted(tmp_path) as (service, link, front):
            # 1 runs; 2 waits behind it and its client goes away; 3 waits and is answered after 1.
            _infer(front, 1, 0.3)
            _infer(front, 2, 0.0)
            _infer(front, 3, 0.0)
            await asyncio.sleep(0.1)
            front.send((wire.CANCEL, 2))
            got = await _results(front, 2)
            assert sorted(got) == [1, 3]
            assert got[1][5][0][0] == "OUTPUT0" and got[1][7] is None and got[1][8] is True
            stats = (await service.model_statistics("slow"))["model_stats"][0]["inference_stats"]
            assert stats["success"]["count"] == 2 and stats["fail"]["count"] == 1  # 2: cancelled unrun
            await asyncio.sleep(0.1)
            assert not await _results(front, 1, 0.2)  # nothing more: no answer for the cancelled request
            assert not link.requests and service.in_flight == 0

            # A request the model's signature refuses is answered at once, with Triton's error.
            _infer(front, 4, 0.0, name="WRONG")
            (refused,) = (await _results(front, 1)).values()
            assert refused[7][1] == "INVALID_ARG" and "unexpected inference input 'WRONG'" in refused[7][2]
            assert not link.requests

            # A shutdown past its exit timeout answers what is left in flight, through the link.
            _infer(front, 5, 0.5)
            _infer(front, 6, 0.0)
            await asyncio.sleep(0.1)
            assert service.cut("shutting down") == 2
            got = await _results(front, 2, 0.2)
            assert sorted(got) == [5, 6]
            assert all(m[7] == ("InferError", "UNAVAILABLE", "shutting down") for m in got.values())
            assert not link.requests and service.in_flight == 0

    asyncio.run(run())


RESHAPED = """
    name: "reshaped"
    platform: "onnxruntime_onnx"
    max_batch_size: 4
    version_policy: { all {} }
    input [{ name: "INPUT0", data_type: TYPE_FP32, dims: [ 4 ], reshape { shape: [ 2, 2 ] } }]
    output [{ name: "OUTPUT0", data_type: TYPE_FP32, dims: [ 4 ], reshape { shape: [ 2, 2 ] } }]
"""

SHAPE_ERROR = ("[request id: r{}] unexpected shape for input 'INPUT0' for model 'reshaped'. Expected [-1,4], got "
               "[3,2,2]. NOTE: Setting a non-zero max_batch_size")


async def _reply(front: Channel, id_: int) -> tuple:
    for _ in range(500):
        for message in front.receive():
            if message[0] == wire.REPLY and message[1] == id_:
                return message
        await asyncio.sleep(0.01)
    raise AssertionError("no reply")


def test_the_host_skips_its_check_only_for_the_version_the_front_end_checked_against(tmp_path: Path) -> None:
    from tests import onnx_graphs

    for version in (1, 2):
        onnx_graphs.write(tmp_path, "reshaped", onnx_graphs.identity("TYPE_FP32", ["batch", 2, 2]), RESHAPED, version)

    async def run() -> None:
        async with _hosted(tmp_path) as (service, link, front):
            # What a front end's check leaves: INPUT0 in its reshaped shape, the batch size set. The host's own check
            # refuses that shape, so an answer shows it trusted the front end's check, a refusal that it checked.
            record = front.pack("INPUT0", np.arange(12, dtype=np.float32).reshape(3, 2, 2))

            def infer(id_: int, version: str, checked: int, kind: int = wire.INFER, undo: tuple | None = None) -> None:
                front.send(tuple(wire.Request(kind, id_, "reshaped", version, f"r{id_}", [record], None, {}, 0, 0, 0, 0,
                                              None, checked, 3 if checked else 0, undo)))
            views = {}
            for id_, version in ((1, ""), (2, "1")):
                front.send((wire.CALL, id_, "model", ("reshaped", version)))
                _, _, ok, value = await _reply(front, id_)
                assert ok
                fields, number, config = wire.View(*value)
                assert fields[1] == (version or "2") and b"reshaped" in config
                views[version] = number
            assert views[""] != views["1"]

            infer(1, "", views[""])  # checked against version 2, which serves "": trusted
            infer(2, "1", views["1"])  # checked against version 1, which serves "1": trusted
            infer(3, "", views["1"])  # checked against 1, but "" is served by 2: checked again
            infer(4, "2", 0)  # unchecked
            infer(5, "2", 4242)  # a number the host never gave
            infer(6, "1", views["1"], wire.STREAM)  # a stream, trusted as a unary request
            # Checked against 1 and reshaped by that check, but "" is served by 2 (a reload with another config
            # would do the same): put back as the client sent it, [3,4], then checked by 2, which takes it.
            reshaped = ("", (("INPUT0", (3, 4)),))
            infer(8, "", views["1"], undo=reshaped)
            infer(9, "", views["1"], wire.STREAM, undo=reshaped)
            infer(10, "1", views["1"], undo=reshaped)  # 1 serves it: the check holds, nothing undone
            got = await _results(front, 9)
            for id_ in (1, 2, 6, 8, 9, 10):
                assert got[id_][7] is None, got[id_][7]
                (output,) = got[id_][5]
                assert front.unpack(False, *output)[1].shape == (3, 4)  # the output's reshape undone
            for id_ in (3, 4, 5):
                assert got[id_][7][1] == "INVALID_ARG" and got[id_][7][2].startswith(SHAPE_ERROR.format(id_))

            # The repository changed: the numbers given before stand for nothing.
            link.invalidate()
            assert any(m[0] == wire.INVALIDATE for m in await _messages(front))
            infer(7, "1", views["1"])
            ((_, _, _, _, _, _, _, error, _),) = (await _results(front, 1)).values()
            assert error[2].startswith(SHAPE_ERROR.format(7))

            stats = {s["version"]: s for s in (await service.model_statistics("reshaped"))["model_stats"]}
            # Trusted requests count as any other, with the batch size the front end's check set; refusals as before.
            assert stats["2"]["inference_stats"]["success"]["count"] == 3 and stats["2"]["inference_count"] == 9
            assert stats["1"]["inference_stats"]["success"]["count"] == 3 and stats["1"]["inference_count"] == 9
            assert stats["2"]["inference_stats"]["fail"]["count"] == 3
            assert stats["1"]["inference_stats"]["fail"]["count"] == 1

    asyncio.run(run())


async def _messages(front: Channel) -> list[tuple]:
    got: list[tuple] = []
    for _ in range(50):
        got += front.receive()
        if got:
            return got
        await asyncio.sleep(0.01)
    return got


def test_a_worker_that_dies_unasked_is_not_ready_through_the_front_end_before_the_next_beat(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No request and no beat tells the front end: the instance's own readiness changes do, as they happen."""
    write_model(tmp_path, "slow", SLOW, SLOW_PY)
    monkeypatch.setattr(hosting, "BEAT_SECONDS", 60.0)

    async def run() -> None:
        others = {p.pid for p in psutil.Process().children()}
        async with _hosted(tmp_path) as (service, link, front):
            (worker,) = {p.pid for p in psutil.Process().children()} - others
            seen: list[bool] = []

            async def watch(until: Callable[[], bool]) -> None:
                deadline = asyncio.get_running_loop().time() + 10
                while not until() and asyncio.get_running_loop().time() < deadline:
                    seen.extend(m[4]["slow"][""] for m in front.receive() if m[0] == wire.STATE)
                    await asyncio.sleep(0.005)

            await watch(lambda: bool(seen))  # the state the link sent when it came
            assert seen == [True]
            os.kill(worker, signal.SIGKILL)
            await watch(lambda: seen[-1] and len(seen) > 2)
            assert seen == [True, False, True]  # dead, then restarted: each heard as it happened
            assert worker not in {p.pid for p in psutil.Process().children()}

    asyncio.run(run())
