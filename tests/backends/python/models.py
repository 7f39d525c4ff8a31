"""Python models the python-backend tests serve: written here, installed into tmp repositories by the tests."""

from __future__ import annotations

from pathlib import Path

from tests.models import write_model


def io_config(name: str, inputs: list[tuple[str, str, str]], outputs: list[tuple[str, str, str]],
              extra: str = "") -> str:
    def block(items: list[tuple[str, str, str]]) -> str:
        return ",".join(f'{{ name: "{n}", data_type: {t}, dims: {d} }}' for n, t, d in items)

    return f'name: "{name}"\nbackend: "python"\ninput [{block(inputs)}]\noutput [{block(outputs)}]\n{extra}\n'


DECOUPLED = "model_transaction_policy { decoupled: true }"

ADD_SUB = """
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            a = pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
            b = pb_utils.get_input_tensor_by_name(r, "INPUT1").as_numpy()
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", a + b),
                                                   pb_utils.Tensor("OUTPUT1", a - b)]))
        return out
"""

# Mode 0 answers its pid; 1 exits the process; 2 segfaults; 3 sleeps (to be killed while busy).
CRASHER = """
import ctypes, os, time
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        mode = int(requests[0].inputs()[0].as_numpy()[0])
        if mode == 1:
            os._exit(3)
        if mode == 2:
            ctypes.string_at(0)
        if mode == 3:
            time.sleep(30)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("PID", np.array([os.getpid()], np.int64))])
                for _ in requests]
"""

# REPEAT: one response per element of IN (OUT = element, IDX = position), then a final flag-only response,
# all from a thread after execute has returned, as python_backend's repeat example does.
REPEAT = """
import threading, time
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            values = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            sender = request.get_response_sender()
            threading.Thread(target=self.respond, args=(sender, values)).start()
        return None

    def respond(self, sender, values):
        for i, v in enumerate(values):
            sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([v], np.int32)),
                                                    pb_utils.Tensor("IDX", np.array([i], np.uint32))]))
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
"""

# Sends one response, then waits for the client to go away and records that it noticed.
CANCEL_WATCH = """
import threading, time
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        self.marker = args["model_repository"] + "/cancelled"

    def execute(self, requests):
        request = requests[0]
        sender = request.get_response_sender()
        sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([1], np.int32))]))

        def watch():
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline and not sender.is_cancelled():
                time.sleep(0.01)
            if request.is_cancelled():
                open(self.marker, "w").write("yes")
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        threading.Thread(target=watch).start()
"""

DECOUPLED_RAISES = """
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        raise pb_utils.TritonModelException("decoupled failure on purpose")
"""

BLS_SYNC = """
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            target = r.parameters()
            import json
            # As bytes: python_backend's bls example reads the name out of a BYTES tensor.
            model = json.loads(target).get("target", "add_sub").encode()
            resp = pb_utils.InferenceRequest(model_name=model, inputs=r.inputs(),
                                             requested_output_names=["OUTPUT0", "OUTPUT1"]).exec()
            if resp.has_error():
                out.append(pb_utils.InferenceResponse(error=resp.error()))
                continue
            out.append(pb_utils.InferenceResponse([
                pb_utils.get_output_tensor_by_name(resp, "OUTPUT0"),
                pb_utils.get_output_tensor_by_name(resp, "OUTPUT1")]))
        return out
"""

BLS_ASYNC = """
import asyncio
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    async def execute(self, requests):
        out = []
        for r in requests:
            calls = [pb_utils.InferenceRequest(model_name="add_sub", inputs=r.inputs(),
                                               requested_output_names=[name]).async_exec()
                     for name in ("OUTPUT0", "OUTPUT1")]
            first, second = await asyncio.gather(*calls)
            out.append(pb_utils.InferenceResponse([pb_utils.get_output_tensor_by_name(first, "OUTPUT0"),
                                                   pb_utils.get_output_tensor_by_name(second, "OUTPUT1")]))
        return out
"""

# SUM of every OUT of the decoupled 'repeat' model, through exec(decoupled=True) (sync) or async_exec.
BLS_DECOUPLED = """
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    {kind}def execute(self, requests):
        out = []
        for r in requests:
            request = pb_utils.InferenceRequest(model_name="repeat", inputs=[r.inputs()[0]],
                                                requested_output_names=["OUT"])
            responses = {call}
            total, count = 0, 0
            for response in responses:
                if response.has_error():
                    raise pb_utils.TritonModelException(response.error().message())
                if response.output_tensors():
                    total += int(pb_utils.get_output_tensor_by_name(response, "OUT").as_numpy()[0])
                    count += 1
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("SUM", np.array([total], np.int32)),
                                                   pb_utils.Tensor("COUNT", np.array([count], np.int32))]))
        return out
"""

# Each execute waits until N executions of this instance are in flight at once (or gives up after 10 s):
# it answers True only if they overlapped.
OVERLAP = """
import asyncio, time
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        self.in_flight = 0
        self.peak = 0

    async def execute(self, requests):
        wanted = int(requests[0].inputs()[0].as_numpy()[0])
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        deadline = time.monotonic() + 10
        while self.peak < wanted and time.monotonic() < deadline:
            await asyncio.sleep(0.005)
        self.in_flight -= 1
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OK", np.array([self.peak >= wanted]))])
                for _ in requests]
"""

# Async, and each call awaits a BLS call to OVERLAP: the caller's executions must overlap too.
OVERLAP_CALLER = """
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    async def execute(self, requests):
        r = requests[0]
        resp = await pb_utils.InferenceRequest(model_name="overlap", inputs=r.inputs(),
                                               requested_output_names=["OK"]).async_exec()
        if resp.has_error():
            raise pb_utils.TritonModelException(resp.error().message())
        return [pb_utils.InferenceResponse([pb_utils.get_output_tensor_by_name(resp, "OK")])]
"""

# Makes an N-byte tensor and hands it to 'big_sum' through BLS: N bytes cross in each direction.
BIG_PRODUCER = """
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        n = int(requests[0].inputs()[0].as_numpy()[0])
        data = np.full(n, 3, dtype=np.uint8)
        resp = pb_utils.InferenceRequest(model_name="big_sum", inputs=[pb_utils.Tensor("DATA", data)],
                                         requested_output_names=["TOTAL", "ECHO"]).exec()
        if resp.has_error():
            raise pb_utils.TritonModelException(resp.error().message())
        echo = pb_utils.get_output_tensor_by_name(resp, "ECHO").as_numpy()
        ok = echo.shape == (n,) and bool((echo[:: max(1, n // 4096)] == 3).all())
        return [pb_utils.InferenceResponse([pb_utils.get_output_tensor_by_name(resp, "TOTAL"),
                                            pb_utils.Tensor("ECHO_OK", np.array([ok]))])]
"""

BIG_SUM = """
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        data = requests[0].inputs()[0].as_numpy()
        return [pb_utils.InferenceResponse([pb_utils.Tensor("TOTAL", np.array([int(data.sum(dtype=np.uint64))], np.int64)),
                                            pb_utils.Tensor("ECHO", data)])]
"""

# An output far larger than /dev/shm can hold (a broadcast view, so it costs no memory to make).
HUGE_OUTPUT = """
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        huge = np.broadcast_to(np.zeros(1, np.uint8), (1 << 46,))
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", huge)]) for _ in requests]
"""

LOGGER = """
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        pb_utils.Logger.log_info("hello from the model log")
        pb_utils.Logger.log_warn("a model warning")
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", r.inputs()[0].as_numpy())]) for r in requests]
"""

# python_backend's custom_metrics pattern: a counter with model/version labels, incremented by the input.
METERED = """
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        # kept: as in Triton, a metric whose family object is gone refuses every operation
        self.family = pb_utils.MetricFamily(name="requests_process_total_ns", description="Cumulative input",
                                            kind=pb_utils.MetricFamily.COUNTER)
        self.metric = self.family.Metric(labels={"model": args["model_name"], "version": args["model_version"]})

    def execute(self, requests):
        for r in requests:
            self.metric.increment(float(r.inputs()[0].as_numpy()[0]))
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", r.inputs()[0].as_numpy())]) for r in requests]
"""


def write(repo: Path, name: str, config: str, source: str) -> Path:
    return write_model(repo, name, config, source)
