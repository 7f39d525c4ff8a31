"""Shutdown: SIGTERM lets in-flight requests finish, refuses new ones, then calls every finalize()."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.models import write_model
from tests.server import ROOT, RunningServer, free_port

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


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_signal_to_the_process_group_finalizes_without_tracebacks(tmp_path: Path, sig: int) -> None:
    """Ctrl-C in a terminal (SIGINT) and `timeout`, docker or systemd (SIGTERM) signal the whole process group: the
    workers pass it over and the server drains, then finalizes, as Triton's stub leaves shutdown to the server."""
    write_model(tmp_path / "repo", "slow", CONFIG, SLOW_PY)
    marker = tmp_path / "marker"
    server = RunningServer([tmp_path / "repo"], env={"NAIAD_TEST_MARKER": str(marker)}, preexec_fn=os.setsid)
    body = json.dumps({"inputs": [{"name": "INPUT0", "shape": [1], "datatype": "FP32", "data": [2.5]}]})
    result: dict[str, object] = {}
    caller = threading.Thread(target=lambda: result.update(reply=server.request("POST", "/v2/models/slow/infer", body)))
    caller.start()
    time.sleep(0.3)  # inside execute()
    os.killpg(server.proc.pid, sig)
    caller.join(10)
    status, _, payload = result["reply"]  # type: ignore[misc]
    assert status == 200, payload
    assert server.proc.wait(15) == 0
    log = server.log()
    server.stop()
    assert marker.read_text() == "finalized\n", log
    assert "Traceback" not in log and "KeyboardInterrupt" not in log, log


def test_signal_to_the_process_group_while_models_load(tmp_path: Path) -> None:
    """The signal arrives while initialize() runs: the load finishes, the server stops, finalize() runs, and the log
    shows no traceback."""
    slow_start = SLOW_PY.replace('self.marker = os.environ["NAIAD_TEST_MARKER"]',
                                 'self.marker = os.environ["NAIAD_TEST_MARKER"]\n'
                                 '            open(self.marker + ".init", "w").close()\n'
                                 '            import time; time.sleep(1.5)')
    write_model(tmp_path / "repo", "slow", CONFIG, slow_start)
    marker = tmp_path / "marker"
    log_path = tmp_path / "log"
    with open(log_path, "wb") as log_file:
        proc = subprocess.Popen([sys.executable, "-m", "naiad", "serve", "--model-repository", str(tmp_path / "repo"),
                                 "--http-address", "127.0.0.1", "--http-port", str(free_port()), "--allow-grpc=false",
                                 "--allow-metrics=false"], stdout=log_file, stderr=subprocess.STDOUT, cwd=ROOT,
                                env={**os.environ, "PYTHONPATH": str(ROOT), "NAIAD_TEST_MARKER": str(marker)},
                                start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while not Path(str(marker) + ".init").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        os.killpg(proc.pid, signal.SIGTERM)
        code = proc.wait(30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    log = log_path.read_text(errors="replace")
    assert code == 0, log
    assert marker.read_text() == "finalized\n", log
    assert "Traceback" not in log, log


DIES_PY = """
    import os, time
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def initialize(self, args):
            marker = os.environ["NAIAD_TEST_MARKER"]
            if os.path.exists(marker):
                time.sleep(1.0)  # the replacement: slow to start, so that the server stops meanwhile
            open(marker, "a").close()

        def execute(self, requests):
            os._exit(3)
"""


def test_stop_while_a_dead_worker_restarts(tmp_path: Path) -> None:
    """A worker dies and the server stops while its replacement starts: the replacement is abandoned cleanly (it
    used to be attached after the unload had closed its channel: an `Invalid file descriptor: -1` traceback)."""
    write_model(tmp_path / "repo", "dies", CONFIG.replace('"slow"', '"dies"'), DIES_PY)
    server = RunningServer([tmp_path / "repo"], env={"NAIAD_TEST_MARKER": str(tmp_path / "started")})
    body = json.dumps({"inputs": [{"name": "INPUT0", "shape": [1], "datatype": "FP32", "data": [1.0]}]})
    status, _, _ = server.request("POST", "/v2/models/dies/infer", body)
    assert status == 500
    time.sleep(0.4)
    server.proc.send_signal(signal.SIGTERM)  # the replacement is inside initialize() now
    assert server.proc.wait(30) == 0
    time.sleep(0.5)  # (a replacement left behind would log its failure now)
    log = server.log()
    server.stop()
    assert "restarting it" in log, log
    assert "Traceback" not in log and "Invalid file descriptor" not in log, log
