"""Shutdown: SIGTERM lets in-flight requests finish, refuses new ones, then calls every finalize()."""

from __future__ import annotations

import json
import signal
import threading
import time
from pathlib import Path

from tests.models import write_model
from tests.server import RunningServer

SLOW_PY = """
    import asyncio, os
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def initialize(self, args):
            self.marker = os.environ["NAIAD_TEST_MARKER"]

        async def execute(self, requests):
            await asyncio.sleep(1.0)
            return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", r.inputs()[0].as_numpy())])
                    for r in requests]

        def finalize(self):
            with open(self.marker, "a") as f:
                f.write("finalized\\n")
"""

CONFIG = """
    name: "slow"
    backend: "python"
    input [{ name: "INPUT0", data_type: TYPE_FP32, dims: [ 1 ] }]
    output [{ name: "OUTPUT0", data_type: TYPE_FP32, dims: [ 1 ] }]
"""


def test_sigterm_drains_in_flight_then_finalizes(tmp_path: Path) -> None:
    write_model(tmp_path / "repo", "slow", CONFIG, SLOW_PY)
    marker = tmp_path / "marker"
    server = RunningServer([tmp_path / "repo"], env={"NAIAD_TEST_MARKER": str(marker)})
    body = json.dumps({"inputs": [{"name": "INPUT0", "shape": [1], "datatype": "FP32", "data": [3.5]}]})
    result: dict[str, object] = {}

    def call() -> None:
        result["reply"] = server.request("POST", "/v2/models/slow/infer", body)

    worker = threading.Thread(target=call)
    worker.start()
    time.sleep(0.3)  # the request is now inside execute()
    server.proc.send_signal(signal.SIGTERM)
    worker.join(10)
    status, _, payload = result["reply"]  # type: ignore[misc]
    assert status == 200, payload
    assert json.loads(payload)["outputs"][0]["data"] == [3.5]
    assert server.proc.wait(15) == 0
    server.stop()
    assert marker.read_text() == "finalized\n"


def test_exit_timeout_bounds_shutdown(tmp_path: Path) -> None:
    write_model(tmp_path / "repo", "slow", CONFIG, SLOW_PY.replace("asyncio.sleep(1.0)", "asyncio.sleep(30)"))
    marker = tmp_path / "marker"
    server = RunningServer([tmp_path / "repo"], "--exit-timeout-secs", "1", env={"NAIAD_TEST_MARKER": str(marker)})
    body = json.dumps({"inputs": [{"name": "INPUT0", "shape": [1], "datatype": "FP32", "data": [1.0]}]})
    threading.Thread(target=lambda: _swallow(server, body), daemon=True).start()
    time.sleep(0.3)
    started = time.monotonic()
    server.proc.send_signal(signal.SIGTERM)
    server.proc.wait(15)
    assert time.monotonic() - started < 10
    assert marker.read_text() == "finalized\n"


def _swallow(server: RunningServer, body: str) -> None:
    try:
        server.request("POST", "/v2/models/slow/infer", body)
    except OSError:
        pass
