"""Containment of a device error that sticks (naiad/backends/faults.py), on CPU: Python-backend models that, after
one bad request, fail with CUDA's text on every later call (state kept in their process, so only a fresh process
heals them). The server must restart the instance in a new process, tell the bad request and those in flight
why, let the requests queued behind it wait for the restart, and keep every other model serving throughout."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from naiad.backends import faults
from tests.models import write_model
from tests.reliability.load import Load
from tests.reliability.repo import write_echo_pid, write_onnx_add_sub
from tests.server import RunningServer

# What torch raises after a device-side assert (its first lines).
ASSERT_TEXT = ("CUDA error: device-side assert triggered\nCUDA kernel errors might be asynchronously reported at some "
               "other API call, so the stacktrace below might be incorrect.")

_CONFIG = """
    name: "{name}"
    backend: "python"
    input [{{ name: "INPUT0", data_type: TYPE_FP32, dims: [ -1 ] }}]
    output [{{ name: "OUTPUT0", data_type: TYPE_FP32, dims: [ -1 ] }},
            {{ name: "PID", data_type: TYPE_INT64, dims: [ 1 ] }}]
"""

# Synchronous: a negative input is the bad request; it says it started (a file beside the model's versions) and
# takes 1 s (requests sent meanwhile queue behind it in the worker), and from then on every call raises what torch
# raises. A process started after that takes 0.5 s to initialize, as a model reloading its weights does: the
# instance is not ready for that long after the bad request is answered, long enough to be seen under any load.
_SYNC_PY = f"""
    import os, time
    import numpy as np
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def initialize(self, args):
            self.broken = False
            self.started = os.path.join(args["model_repository"], "bad-started")
            if os.path.exists(self.started):
                time.sleep(0.5)

        def execute(self, requests):
            pid = np.array([os.getpid()], dtype=np.int64)
            out = []
            for r in requests:
                x = r.inputs()[0].as_numpy()
                if (x < 0).any():
                    open(self.started, "w").close()
                    time.sleep(1.0)
                    self.broken = True
                if self.broken:
                    raise RuntimeError({ASSERT_TEXT!r})
                out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x), pb_utils.Tensor("PID", pid)]))
            return out
"""

# Asynchronous (executions overlap): a request with the "hold" parameter sleeps that long first; a bad one is
# answered with an error response carrying CUDA's text (the model catches the exception itself), as is every
# later call.
_ASYNC_PY = f"""
    import asyncio, json, os
    import numpy as np
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def initialize(self, args):
            self.broken = False

        async def execute(self, requests):
            pid = np.array([os.getpid()], dtype=np.int64)
            out = []
            for r in requests:
                hold = json.loads(r.parameters()).get("hold")
                if hold:
                    await asyncio.sleep(float(hold))
                x = r.inputs()[0].as_numpy()
                if (x < 0).any():
                    self.broken = True
                if self.broken:
                    out.append(pb_utils.InferenceResponse(error=pb_utils.TritonError({ASSERT_TEXT!r})))
                else:
                    out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x),
                                                           pb_utils.Tensor("PID", pid)]))
            return out
"""


def test_sticky_causes_are_read_from_every_wording() -> None:
    assert faults.sticky_cause(ASSERT_TEXT) == "device-side assert triggered"
    assert faults.sticky_cause("CUDA failure 700: an illegal memory access was encountered ; GPU=0") == \
        "an illegal memory access was encountered"
    assert faults.sticky_cause("[TRT] cudaErrorLaunchFailure") == "unspecified launch failure"
    assert faults.sticky_cause("CUDA_ERROR_MISALIGNED_ADDRESS") == "misaligned address"
    assert faults.sticky_cause("CUDA out of memory. Tried to allocate 2.00 GiB") is None  # recoverable
    assert faults.sticky_cause("index 7 is out of bounds for dimension 0 with size 4") is None
    assert faults.poisoned(["shape mismatch"]) is None  # and no probe where CUDA was never initialized


def _infer(url: str, model: str, values: list[float], parameters: dict | None = None) -> tuple[np.ndarray, int]:
    client = httpclient.InferenceServerClient(url, network_timeout=30)
    try:
        data = np.array(values, dtype=np.float32)
        tensor = httpclient.InferInput("INPUT0", list(data.shape), "FP32")
        tensor.set_data_from_numpy(data)
        result = client.infer(model, [tensor], parameters=parameters)
        return result.as_numpy("OUTPUT0"), int(result.as_numpy("PID")[0])
    finally:
        client.close()


def _send(url: str, model: str, values: list[float], into: dict, key: object, parameters: dict | None = None) -> None:
    try:
        into[key] = (_infer(url, model, values, parameters), time.monotonic())
    except InferenceServerException as exc:
        into[key] = (exc, time.monotonic())


def _ready(url: str, model: str) -> bool:
    client = httpclient.InferenceServerClient(url)
    try:
        return client.is_model_ready(model)
    finally:
        client.close()


class _Readiness:
    """Polls a model's readiness until stopped: was it ever seen not ready?"""

    def __init__(self, server: RunningServer, model: str) -> None:
        self.client = httpclient.InferenceServerClient(server.url)
        self.model = model
        self.unready = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()

    def _poll(self) -> None:
        while not self._stop.is_set():
            if not self.client.is_model_ready(self.model):
                self.unready += 1
            time.sleep(0.005)

    def stop(self) -> int:
        self._stop.set()
        self._thread.join(5)
        self.client.close()
        return self.unready


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> RunningServer:
    repo = tmp_path_factory.mktemp("faults") / "repo"
    write_model(repo, "fragile", _CONFIG.format(name="fragile"), _SYNC_PY)
    write_model(repo, "fragile_async", _CONFIG.format(name="fragile_async"), _ASYNC_PY)
    write_echo_pid(repo, "bystander")
    write_onnx_add_sub(repo, "onnx")
    running = RunningServer([repo])
    yield running
    running.stop()


def _bystanders(server: RunningServer) -> list[Load]:
    onnx_body = (b'{"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}, '
                 b'{"name": "INPUT1", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}]}')
    return [Load(server.http_port, ["bystander"], clients=1).start(),
            Load(server.http_port, ["onnx"], clients=1, body=lambda n: onnx_body).start()]


def _all_served(loads: list[Load]) -> None:
    results = [r for load in loads for r in load.stop()]
    failed = [r for r in results if r.status != 200]
    assert results and not failed, f"{len(failed)} of {len(results)} bystander requests failed: {failed[:3]}"


def test_a_sticky_error_restarts_the_instance_and_queued_requests_wait(server: RunningServer) -> None:
    _, old_pid = _infer(server.url, "fragile", [1.0])
    loads = _bystanders(server)
    readiness = _Readiness(server, "fragile")
    results: dict = {}
    started = time.monotonic()
    bad = threading.Thread(target=_send, args=(server.url, "fragile", [-1.0], results, "bad"))
    bad.start()
    started_file = server.repos[0] / "fragile" / "bad-started"
    deadline = time.monotonic() + 30
    while not started_file.exists():  # the bad request runs; these queue behind it, in the worker
        assert time.monotonic() < deadline, "the bad request never started"
        time.sleep(0.01)
    queued = [threading.Thread(target=_send, args=(server.url, "fragile", [float(i)], results, i)) for i in range(4)]
    for thread in queued:
        thread.start()
    bad.join(30)
    # Told of the fault, a client finds the model not ready through any front end (new connections: with
    # front-end processes, each may reach another) while its instance restarts.
    ready = [_ready(server.url, "fragile") for _ in range(4)]
    for thread in queued:
        thread.join(30)
    assert not any(ready), f"the model was ready after its fault through {ready.count(True)} of 4 connections"
    error, _ = results["bad"]
    assert isinstance(error, InferenceServerException), error
    text = str(error)
    assert "instance 'fragile_0' of model 'fragile' hit a sticky CUDA error (device-side assert triggered) and " \
           "is being restarted" in text, text
    assert "CUDA kernel errors might be asynchronously reported" in text  # the model's own words follow
    for i in range(4):
        answer, _ = results[i]
        assert not isinstance(answer, Exception), f"a queued request failed instead of waiting: {answer}"
        (output, pid) = answer
        assert output.tolist() == [float(i)] and pid != old_pid
    recovered = max(results[i][1] for i in range(4)) - started
    print(f"\nfrom the bad request to serving again: {recovered:.2f} s")
    assert recovered < 5.0
    for i in range(20):
        assert _infer(server.url, "fragile", [float(i)])[0].tolist() == [float(i)]
    assert readiness.stop() > 0, "readiness never showed the instance unhealthy"
    assert httpclient.InferenceServerClient(server.url).is_model_ready("fragile")
    _all_served(loads)
    assert "sticky restarts of this instance: 1" in server.log()


def test_requests_in_flight_fail_with_the_cause(server: RunningServer) -> None:
    _, old_pid = _infer(server.url, "fragile_async", [1.0])
    loads = _bystanders(server)
    results: dict = {}
    held = threading.Thread(target=_send, args=(server.url, "fragile_async", [2.0], results, "held", {"hold": "3"}))
    held.start()
    time.sleep(0.3)  # the held request is running (awaiting) in the worker
    started = time.monotonic()
    _send(server.url, "fragile_async", [-1.0], results, "bad")
    held.join(30)
    notice = "instance 'fragile_async_0' of model 'fragile_async' hit a sticky CUDA error (device-side assert " \
             "triggered) and is being restarted"
    for key in ("bad", "held"):
        error, _ = results[key]
        assert isinstance(error, InferenceServerException) and notice in str(error), (key, error)
    assert results["held"][1] - started < 2.5  # failed with its process, not after its 3 s
    deadline = started + 5.0
    while True:
        try:
            output, pid = _infer(server.url, "fragile_async", [3.0])
            break
        except InferenceServerException:
            assert time.monotonic() < deadline, server.log()[-3000:]
            time.sleep(0.05)
    assert output.tolist() == [3.0] and pid != old_pid
    _all_served(loads)
