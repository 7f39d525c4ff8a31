"""The model host's end of a front end's channel, against a front end played here over a real channel and a real
face (repository, scheduler, Python worker): a unary request is answered once, a cancelled one never, a refused
one at once, and a shutdown past its exit timeout answers what is left."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import numpy as np

from naiad.backends.python.shm import Arena
from naiad.backends.python.transport import Channel
from naiad.server import Server, ServerOptions
from naiad.service import wire
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
    front.send((wire.INFER, id_, "slow", "", f"r{id_}", [record], None, {}, 0, 0, 0, 0, None, 0, 0))


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
        server = Server(ServerOptions(model_repositories=[tmp_path]))
        await server._load_models()
        service = server.service
        service.live = service.accepting = True
        host_end, front_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        link = Link(service, host_end, lambda _: None, lambda: None, lambda _: None, lambda: [link])
        link.attach(asyncio.get_running_loop())
        front = Channel(front_end, Arena())
        try:
            # 1 runs; 2 waits behind it and its client goes away; 3 waits and is answered after 1.
            _infer(front, 1, 0.3)
            _infer(front, 2, 0.0)
            _infer(front, 3, 0.0)
            await asyncio.sleep(0.1)
            front.send((wire.CANCEL, 2))
            got = await _results(front, 2)
            assert sorted(got) == [1, 3]
            assert got[1][5][0][0] == "OUTPUT0" and got[1][7] is None and got[1][8] is True
            stats = service.model_statistics("slow")["model_stats"][0]["inference_stats"]
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
        finally:
            link.close()
            front.close()
            server.repository.unload_all()

    asyncio.run(run())
