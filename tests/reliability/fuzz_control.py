"""Seeded fuzzing of model control in explicit mode (HTTP): load requests whose ``config`` override and ``file:``
contents are odd (config fields of the wrong kind or range, JSON that is not a config, files outside the model's
folder, model code that fails or exits while it loads), odd model names, unload requests with odd parameters.

Judged by http_oracle; between batches the server must be live and its ``target`` model must still load
from its own files and answer. The same seed always gives the same cases.
"""

from __future__ import annotations

import base64
import copy
import http.client
import json
import random
from typing import Any, Callable

from tests.reliability.batches import in_batches
from tests.reliability.fuzz_http import ODD_VALUES
from tests.reliability.http_oracle import HttpCase, HttpFuzzer, Outcome

TARGET = "target"
# A valid override for ``target`` (an FP32 echo); mutations start from it.
BASE_CONFIG: dict[str, Any] = {
    "name": TARGET, "backend": "python", "max_batch_size": 0,
    "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [-1]}],
    "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [-1]}],
}
_FIELDS: dict[str, list[Any]] = {
    "name": ["", "other", TARGET.upper(), 5],
    "backend": ["", "onnxruntime", "nope", "python ", None],
    "platform": ["", "onnxruntime_onnx", "ensemble", "tensorflow_savedmodel"],
    "max_batch_size": [-1, 2**31, 2**63, "4", 1.5, 8],
    "version_policy": [{"specific": {"versions": [1, 99, -1]}}, {"latest": {"num_versions": 0}}, {"all": {}}, 3],
    "instance_group": [[{"count": 0}], [{"count": -1}], [{"kind": "KIND_GPU", "gpus": [0]}], [{"kind": "KIND_X"}],
                       [{"count": 2, "kind": "KIND_CPU"}], [{}], "x"],
    "dynamic_batching": [{"max_queue_delay_microseconds": -1}, {"preferred_batch_size": [0, -4]},
                         {"priority_levels": 2, "default_priority_level": 5}, {"default_queue_policy":
                                                                                {"max_queue_size": -1}}, []],
    "sequence_batching": [{"max_sequence_idle_microseconds": 0}, {"control_input": [{"name": "START"}]},
                          {"oldest": {"max_candidate_sequences": 0}}],
    "parameters": [{"k": {"string_value": "v"}}, {"k": "v"}, {"": {}}, []],
    "model_transaction_policy": [{"decoupled": True}, {"decoupled": "yes"}],
    "response_cache": [{"enable": True}, {"enable": 1}],
    "ensemble_scheduling": [{"step": [{"model_name": TARGET, "model_version": -1}]},
                            {"step": [{"model_name": "nope", "input_map": {"a": "b"}}]}],
    "optimization": [{"execution_accelerators": {"cpu_execution_accelerator": [{"name": "openvino"}]}}],
    "model_warmup": [[{"name": "w", "batch_size": 1, "inputs": {"INPUT0": {"data_type": "TYPE_FP32", "dims": [4],
                                                                           "zero_data": True}}}],
                     [{"name": "w", "inputs": {"NOPE": {"data_type": "TYPE_FP32", "dims": [4], "random_data": True}}}]],
    "unknown_field": [1],
}
_IO_FIELDS: dict[str, list[Any]] = {
    "name": ["", "INPUT0", "OUTPUT0", 3],
    "data_type": ["TYPE_INVALID", "TYPE_STRING", "TYPE_BF16", "FP32", 7, -1],
    "dims": [[], [0], [-2], [2**63], [-1, -1], ["4"], 4],
    "reshape": [{"shape": [2, 2]}, {"shape": [-3]}],
    "optional": [True, "yes"],
    "format": ["FORMAT_NCHW", "X"],
    "is_shape_tensor": [True],
}
# model.py bodies: each fails in its own way while the model loads (or not at all).
MODEL_FILES = [
    "import triton_python_backend_utils as pb_utils\nclass TritonPythonModel:\n    def execute(self, requests):\n"
    "        return [pb_utils.InferenceResponse([pb_utils.Tensor('OUTPUT0', r.inputs()[0].as_numpy())])"
    " for r in requests]\n",
    "this is not python(\n",
    "raise RuntimeError('fails on import')\n",
    "class TritonPythonModel:\n    def initialize(self, args):\n        raise ValueError('no')\n",
    "class TritonPythonModel:\n    def initialize(self, args):\n        import os; os.kill(os.getpid(), 9)\n",
    "class NotTheModel:\n    pass\n",
    "",
    "\x00\xff",
]
# model.py bodies that end the process that imports them. Loading one must fail only that load, but naiad runs a
# Python model's auto_complete_config import inside the server (naiad/backends/python/backend.py), so each ends the
# server: test_fuzz_control has a strict xfail for them, and they stay out of the generated cases until it's fixed.
EXITING_MODEL_FILES = ["import sys\nsys.exit(0)\n", "import os\nos._exit(3)\n"]
_NAMES = [TARGET, TARGET, "nope", "", "%2e%2e", "..", "target%2F1", "x" * 300, "ta%20get", "%C3%A9", "%00"]


def _config(rng: random.Random) -> Any:
    config = copy.deepcopy(BASE_CONFIG)
    for _ in range(rng.randint(1, 3)):
        tensors = [t for key in ("input", "output") if isinstance(config.get(key), list) for t in config[key]]
        if rng.random() < 0.35 and tensors:
            io = rng.choice(tensors)
            key = rng.choice(list(_IO_FIELDS))
            io[key] = copy.deepcopy(rng.choice(_IO_FIELDS[key]))
        elif rng.random() < 0.1 and config:
            config.pop(rng.choice(list(config)))
        else:
            key = rng.choice(list(_FIELDS))
            config[key] = copy.deepcopy(rng.choice(_FIELDS[key]))
    return config


def _load(rng: random.Random) -> HttpCase:
    name = rng.choice(_NAMES)
    parameters: dict[str, Any] = {}
    choice = rng.randrange(6)
    if choice == 0:
        parameters["config"] = json.dumps(_config(rng))
    elif choice == 1:  # a config with the model's files
        parameters["config"] = json.dumps(_config(rng) if rng.random() < 0.5 else BASE_CONFIG)
        path = rng.choice(["1/model.py", "1/model.py", "2/model.py", "../escape.py", "/abs/model.py", "1/../../x",
                           "", "1/", "config.pbtxt", "1/sub/dir/file.txt", "1/nul\x00.py", "1/" + "f" * 300])
        content = rng.choice(MODEL_FILES).encode("utf-8", "surrogateescape")
        parameters["file:" + path] = (base64.b64encode(content).decode() if rng.random() < 0.9
                                      else rng.choice(["not base64!", "", 5, None]))
    elif choice == 2:  # a config that is no model config
        parameters["config"] = rng.choice(["", "{", "[]", "null", "1", '{"input": 5}', '{"max_batch_size": 1e400}',
                                           "[" * 5000 + "]" * 5000, '{"name": "target", "backend": "python"' +
                                           ', "input": [' * 10 + "]" * 10 + "}", json.dumps({"a": [1] * 10})])
    elif choice == 3:
        parameters[rng.choice(["config", "file:1/model.py", "other"])] = copy.deepcopy(rng.choice(ODD_VALUES))
    elif choice == 4:  # files without a config
        parameters["file:1/model.py"] = base64.b64encode(MODEL_FILES[0].encode()).decode()
    body: Any = {"parameters": parameters} if rng.random() < 0.9 else rng.choice(ODD_VALUES)
    return HttpCase("load", "POST", f"/v2/repository/models/{name}/load", {}, json.dumps(body).encode())


def _unload(rng: random.Random) -> HttpCase:
    name = rng.choice(_NAMES)
    body = {"parameters": {"unload_dependents": copy.deepcopy(rng.choice([True, False] + ODD_VALUES))}}
    return HttpCase("unload", "POST", f"/v2/repository/models/{name}/unload",
                    {}, json.dumps(body).encode() if rng.random() < 0.8 else b"")


def _index(rng: random.Random) -> HttpCase:
    body = json.dumps({"ready": copy.deepcopy(rng.choice([True, False] + ODD_VALUES))}).encode()
    return HttpCase("index", "POST", "/v2/repository/index", {}, body)


MUTATIONS: list[tuple[Callable[[random.Random], HttpCase], int]] = [(_load, 10), (_unload, 3), (_index, 1)]


def generate(seed: int, count: int) -> list[HttpCase]:
    rng = random.Random(seed)
    functions = [f for f, _ in MUTATIONS]
    weights = [w for _, w in MUTATIONS]
    return [rng.choices(functions, weights)[0](rng) for _ in range(count)]


def healthy(host: str, port: int, timeout: float = 60.0) -> str | None:
    """None if live and ``target`` loads from its own files again and echoes."""
    try:
        conn = http.client.HTTPConnection(host, port, timeout=timeout)
        conn.request("GET", "/v2/health/live")
        response = conn.getresponse()
        response.read()
        if response.status != 200:
            return f"live answered {response.status}"
        conn.request("POST", f"/v2/repository/models/{TARGET}/load", b"")
        response = conn.getresponse()
        reply = response.read()
        if response.status != 200:
            return f"reloading {TARGET} answered {response.status}: {reply[:300]!r}"
        body = json.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [2], "data": [1, 2]}]})
        conn.request("POST", f"/v2/models/{TARGET}/infer", body)
        response = conn.getresponse()
        reply = response.read()
        if response.status != 200 or json.loads(reply)["outputs"][0]["data"] != [1, 2]:
            return f"{TARGET} answered {response.status}: {reply[:300]!r}"
        conn.close()
    except (OSError, http.client.HTTPException, ValueError, KeyError) as exc:
        return f"health check failed: {exc!r}"
    return None


def run(host: str, port: int, cases: list[HttpCase], batch: int = 25, timeout: float = 60.0,
        alive: Callable[[], bool] = lambda: True) -> tuple[list[Outcome], list[str]]:
    return in_batches([HttpFuzzer(host, port, timeout)], cases, batch, alive, lambda: healthy(host, port, timeout))
