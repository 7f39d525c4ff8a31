"""The models the reliability suite (and benchmarks/reliability) serve, written into a repository by the caller."""

from __future__ import annotations

import textwrap
from pathlib import Path

from tests import onnx_graphs
from tests.models import write_model

# An echo that also says which process ran it, so a test can kill exactly that worker.
_ECHO_PID_PY = """
    import os
    import numpy as np
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def execute(self, requests):
            pid = np.array([os.getpid()], dtype=np.int64)
            return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", r.inputs()[0].as_numpy()),
                                                pb_utils.Tensor("PID", pid)]) for r in requests]
"""

_ECHO_PID_CONFIG = """
    name: "{name}"
    backend: "python"
    input [{{ name: "INPUT0", data_type: TYPE_FP32, dims: [ -1 ] }}]
    output [{{ name: "OUTPUT0", data_type: TYPE_FP32, dims: [ -1 ] }},
            {{ name: "PID", data_type: TYPE_INT64, dims: [ 1 ] }}]
"""

# An echo that says which process ran it; a request whose "hold" parameter names a file touches that file and
# then stays in execute until its worker is killed; while the file "slow_init" beside model.py exists, initialize
# takes 3 s (a restart that is slow).
_GATED_PY = """
    import json, os, time
    import numpy as np
    import triton_python_backend_utils as pb_utils

    HERE = os.path.dirname(__file__)

    class TritonPythonModel:
        def initialize(self, args):
            if os.path.exists(os.path.join(HERE, "slow_init")):
                time.sleep(3)

        def execute(self, requests):
            pid = np.array([os.getpid()], dtype=np.int64)
            for r in requests:
                hold = json.loads(r.parameters()).get("hold")
                if hold:
                    open(hold, "w").close()
                    time.sleep(60)
            return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", r.inputs()[0].as_numpy()),
                                                pb_utils.Tensor("PID", pid)]) for r in requests]
"""

# With the response cache (the fuzz servers run with --cache-config): odd BYTES meet its hashing.
_BYTES_CONFIG = """
    name: "bytes"
    backend: "python"
    response_cache { enable: true }
    input [{ name: "INPUT0", data_type: TYPE_STRING, dims: [ -1 ] }]
    output [{ name: "OUTPUT0", data_type: TYPE_STRING, dims: [ -1 ] }]
"""

_ECHO_PY = """
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def execute(self, requests):
            return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", r.inputs()[0].as_numpy())])
                    for r in requests]
"""

# Batched through the dynamic batcher: the batch dimension and the batcher's queue meet the fuzzer too.
# Priority levels and a queue policy that requests may shorten: the fuzzer's priority and timeout reach them.
_BATCHED_CONFIG = """
    name: "batched"
    backend: "python"
    max_batch_size: 4
    dynamic_batching {
      max_queue_delay_microseconds: 500
      priority_levels: 2
      default_priority_level: 1
      default_queue_policy { allow_timeout_override: true default_timeout_microseconds: 5000000 max_queue_size: 64 }
    }
    input [{ name: "INPUT0", data_type: TYPE_INT32, dims: [ 2 ] }]
    output [{ name: "OUTPUT0", data_type: TYPE_INT32, dims: [ 2 ] }]
"""

# The batched model behind an ensemble step.
_ENSEMBLE_CONFIG = """
    name: "ensemble"
    platform: "ensemble"
    max_batch_size: 4
    input [{ name: "INPUT0", data_type: TYPE_INT32, dims: [ 2 ] }]
    output [{ name: "OUTPUT0", data_type: TYPE_INT32, dims: [ 2 ] }]
    ensemble_scheduling { step [{ model_name: "batched" model_version: -1 input_map { key: "INPUT0" value: "INPUT0" }
                                  output_map { key: "OUTPUT0" value: "OUTPUT0" } }] }
"""

# Two responses per request, then the final flag alone.
_DECOUPLED_CONFIG = """
    name: "decoupled"
    backend: "python"
    model_transaction_policy { decoupled: true }
    input [{ name: "INPUT0", data_type: TYPE_FP32, dims: [ -1 ] }]
    output [{ name: "OUTPUT0", data_type: TYPE_FP32, dims: [ -1 ] }]
"""

_DECOUPLED_PY = """
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def execute(self, requests):
            for r in requests:
                sender = r.get_response_sender()
                for _ in range(2):
                    sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", r.inputs()[0].as_numpy())]))
                sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            return None
"""

_SEQUENCE_CONFIG = """
    name: "sequence"
    backend: "python"
    max_batch_size: 2
    sequence_batching { max_sequence_idle_microseconds: 300000 }
    input [{ name: "INPUT0", data_type: TYPE_INT32, dims: [ 1 ] }]
    output [{ name: "OUTPUT0", data_type: TYPE_INT32, dims: [ 1 ] }]
"""

_ONNX_CONFIG = """
    name: "onnx_add_sub"
    platform: "onnxruntime_onnx"
    max_batch_size: 8
    input [{ name: "INPUT0", data_type: TYPE_FP32, dims: [ 4 ] }, { name: "INPUT1", data_type: TYPE_FP32, dims: [ 4 ] }]
    output [{ name: "OUTPUT0", data_type: TYPE_FP32, dims: [ 4 ] },
            { name: "OUTPUT1", data_type: TYPE_FP32, dims: [ 4 ] }]
"""

# A slow model: one execution at a time, ``delay`` seconds each, batching up to 4 requests.
_SLOW_PY = """
    import time
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def execute(self, requests):
            time.sleep({delay})
            return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", r.inputs()[0].as_numpy())])
                    for r in requests]
"""

_SLOW_CONFIG = """
    name: "{name}"
    backend: "python"
    max_batch_size: 4
    dynamic_batching {{ {queue} }}
    input [{{ name: "INPUT0", data_type: TYPE_FP32, dims: [ 1 ] }}]
    output [{{ name: "OUTPUT0", data_type: TYPE_FP32, dims: [ 1 ] }}]
"""


# A model that misbehaves as its MODE input says: wrong datatypes, shapes and names, missing or extra outputs,
# values no JSON number holds, too few responses, none at all, exceptions, error responses, a large output.
CHAOS_MODES = 20
_CHAOS_CONFIG = """
    name: "chaos"
    backend: "python"
    input [{ name: "MODE", data_type: TYPE_INT32, dims: [ 1 ] }]
    output [{ name: "OUT", data_type: TYPE_FP32, dims: [ -1 ] }, { name: "TEXT", data_type: TYPE_STRING, dims: [ -1 ] }]
"""
_CHAOS_PY = """
    import numpy as np
    import triton_python_backend_utils as pb_utils

    T = pb_utils.Tensor
    R = pb_utils.InferenceResponse


    def answer(mode):
        f = np.arange(3, dtype=np.float32)
        s = np.array([b"a", b"bc"], dtype=np.object_)
        outputs = {
            0: [T("OUT", f), T("TEXT", s)],
            1: [T("OUT", f.astype(np.float64)), T("TEXT", s)],
            2: [T("OUT", f.reshape(3, 1)), T("TEXT", s)],
            3: [T("TEXT", s)],
            4: [T("OUT", f), T("TEXT", s), T("EXTRA", f)],
            5: [T("OUT", f), T("TEXT", np.array([1, None, 2.5, "x"], dtype=np.object_))],
            6: [T("OUT", np.array([np.nan, np.inf, -np.inf], np.float32)), T("TEXT", s)],
            10: [T("OUT", np.zeros(1_000_000, np.float32)), T("TEXT", s)],
            11: [T("OUT", np.asfortranarray(np.ones((3, 2), np.float32))[:, 0]), T("TEXT", s)],
            12: [T("OUT", np.array(["x", "y"])), T("TEXT", np.array(["str", "\u00fc"]))],
            13: [T("OUT", np.array([1, 2], dtype=np.int64)), T("TEXT", s)],
            14: [T("OUT", f), T("OUT", f), T("TEXT", s)],
            15: [T("OUT", np.array([], np.float32)), T("TEXT", np.array([], dtype=np.object_))],
        }
        if mode in outputs:
            return R(outputs[mode])
        if mode == 16:
            return R([], error=pb_utils.TritonError("chaos error"))
        if mode == 17:
            return "not a response"
        if mode == 18:
            return R([T("OUT", np.float32(3.0).reshape(())), T("TEXT", s)])
        raise RuntimeError("chaos")


    class TritonPythonModel:
        def execute(self, requests):
            modes = [int(r.inputs()[0].as_numpy()[0]) for r in requests]
            if 7 in modes:
                return None
            if 8 in modes:
                return []  # too few responses
            return [answer(mode) for mode in modes]
"""


_CHAOS_ENSEMBLE_CONFIG = """
    name: "chaos_ensemble"
    platform: "ensemble"
    input [{ name: "MODE", data_type: TYPE_INT32, dims: [ 1 ] }]
    output [{ name: "OUT", data_type: TYPE_FP32, dims: [ -1 ] }, { name: "TEXT", data_type: TYPE_STRING, dims: [ -1 ] }]
    ensemble_scheduling { step [{ model_name: "chaos" model_version: -1 input_map { key: "MODE" value: "MODE" }
                                  output_map [{ key: "OUT" value: "OUT" }, { key: "TEXT" value: "TEXT" }] }] }
"""


def write_chaos(repo: Path) -> None:
    """The chaos model, and an ensemble whose one step is it."""
    write_model(repo, "chaos", _CHAOS_CONFIG, _CHAOS_PY)
    (repo / "chaos_ensemble" / "1").mkdir(parents=True, exist_ok=True)
    (repo / "chaos_ensemble" / "config.pbtxt").write_text(textwrap.dedent(_CHAOS_ENSEMBLE_CONFIG))


FUZZ_SERVER_FLAGS = ("--cache-config", "local,size=1048576")


def write_echo_pid(repo: Path, name: str) -> None:
    write_model(repo, name, _ECHO_PID_CONFIG.format(name=name), _ECHO_PID_PY)


def write_fuzz_models(repo: Path) -> None:
    """What the fuzzers aim at: an echo (FP32, any length), BYTES (cached), a batched model with priorities and a
    queue policy, an ensemble of it, a sequence model, a decoupled model, ONNX. Serve with ``FUZZ_SERVER_FLAGS``."""
    write_echo_pid(repo, "echo")
    write_model(repo, "bytes", _BYTES_CONFIG, _ECHO_PY)
    write_model(repo, "batched", _BATCHED_CONFIG, _ECHO_PY)
    (repo / "ensemble" / "1").mkdir(parents=True, exist_ok=True)
    (repo / "ensemble" / "config.pbtxt").write_text(textwrap.dedent(_ENSEMBLE_CONFIG))
    write_model(repo, "decoupled", _DECOUPLED_CONFIG, _DECOUPLED_PY)
    write_model(repo, "sequence", _SEQUENCE_CONFIG, _ECHO_PY)
    write_onnx_add_sub(repo)


def write_onnx_add_sub(repo: Path, name: str = "onnx_add_sub") -> None:
    onnx_graphs.write(repo, name, onnx_graphs.add_sub("TYPE_FP32", [4]),
                      _ONNX_CONFIG.replace('"onnx_add_sub"', f'"{name}"'))


def write_slow(repo: Path, name: str, delay: float, max_queue_size: int = 0, queue_timeout_us: int = 0) -> None:
    """A slow model; a queue policy when ``max_queue_size`` or ``queue_timeout_us`` (REJECT) is given."""
    policy = (f"max_queue_size: {max_queue_size}" if max_queue_size else "") + \
        (f" default_timeout_microseconds: {queue_timeout_us}" if queue_timeout_us else "")
    queue = "max_queue_delay_microseconds: 100" + (f" default_queue_policy {{ {policy} }}" if policy else "")
    write_model(repo, name, _SLOW_CONFIG.format(name=name, queue=queue), _SLOW_PY.replace("{delay}", str(delay)))


def write_gated(repo: Path, name: str) -> Path:
    """``_GATED_PY`` under ``name`` (one instance); returns its version folder."""
    write_model(repo, name, _ECHO_PID_CONFIG.format(name=name), _GATED_PY)
    return repo / name / "1"
