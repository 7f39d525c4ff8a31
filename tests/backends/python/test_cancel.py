"""Cancellation inside a worker process that holds pipelined executions (the Python backend's default
pipeline depth): an execution whose requests were all cancelled before it started is answered CANCELLED without
running, its shared-memory inputs freed; one with only some cancelled runs, the model seeing ``is_cancelled()``
for those. Driven through the backend directly, as a scheduler drives it."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import numpy as np

from naiad.backends.base import Execution, VersionContext
from naiad.backends.python.backend import PythonBackend
from naiad.config.loader import load_config
from naiad.config.normalize import fill_defaults
from naiad.config.render import config_to_dict
from naiad.core.errors import Code
from naiad.core.request import InferRequest
from tests.backends.python import models as m

# Logs the first value of each request it runs; a request whose value is 0 takes 0.5 s.
WAITS = """
import os, time
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        self.log = os.path.join(args["model_repository"], "executed")

    def execute(self, requests):
        out = []
        for r in requests:
            value = int(pb_utils.get_input_tensor_by_name(r, "IN").as_numpy()[0])
            with open(self.log, "a") as f:
                f.write(f"{value}\\n")
            if value == 0:
                time.sleep(0.5)
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("CANCELLED", np.array([r.is_cancelled()]))]))
        return out
"""


def _load(repo: Path) -> object:
    config = m.io_config("waits", [("IN", "TYPE_INT32", "[ -1 ]")], [("CANCELLED", "TYPE_BOOL", "[ 1 ]")])
    m.write(repo, "waits", config, WAITS)
    folder = repo / "waits"
    config, _ = load_config(folder, "")
    fill_defaults(config, "waits")
    ctx = VersionContext("waits", 1, config, json.dumps(config_to_dict(config)), folder, folder / "1", {})
    return PythonBackend().load(ctx)


def _request(value: int, size: int = 1) -> InferRequest:
    data = np.full(size, value, dtype=np.int32)
    return InferRequest("waits", inputs={"IN": data})


def _executed(repo: Path) -> list[int]:
    log = repo / "waits" / "executed"
    return [int(line) for line in log.read_text().split()] if log.exists() else []


def test_a_worker_drops_pipelined_executions_cancelled_before_they_start(tmp_path: Path) -> None:
    async def scenario() -> tuple[list[Execution], object]:
        loaded = _load(tmp_path)
        try:
            slots = loaded.instances  # type: ignore[attr-defined]
            assert len(slots) > 2, "the default pipeline depth puts several slots on the one process"
            loop = asyncio.get_running_loop()
            futures = [loop.create_future() for _ in range(3)]
            running = _request(0)
            slots[0].submit([running], futures[0].set_result)
            for _ in range(500):  # until the slow one runs
                await asyncio.sleep(0.01)
                if _executed(tmp_path):
                    break
            partly, gone = [_request(1), _request(2)], _request(3, size=8192)  # 32 KB: a shared-memory block
            slots[1].submit(partly, futures[1].set_result)
            slots[2].submit([gone], futures[2].set_result)
            await asyncio.sleep(0)  # they leave for the worker at the end of this turn
            for request in (partly[1], gone):  # what ModelVersion does when a client goes away
                request.cancelled = True
                loaded.cancel(request)  # type: ignore[attr-defined]
            executions = list(await asyncio.wait_for(asyncio.gather(*futures), 20))
            arena = loaded.processes[0].ch.arena  # type: ignore[attr-defined]
            return executions, arena.current.drained()
        finally:
            loaded.unload()  # type: ignore[attr-defined]

    (ran, partly, dropped), inputs_freed = asyncio.run(scenario())
    assert _executed(tmp_path) == [0, 1, 2]  # 3 never ran
    assert not ran.failed and ran.responses[0].outputs["CANCELLED"].tolist() == [False]
    assert not partly.failed
    assert [r.outputs["CANCELLED"].tolist() for r in partly.responses] == [[False], [True]]
    assert dropped.failed == "CANCELED"
    assert dropped.responses[0].error is not None and dropped.responses[0].error.code is Code.CANCELLED
    assert inputs_freed, "the dropped execution's input block was never freed"
