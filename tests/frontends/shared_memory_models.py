"""Models and client flows for the shared-memory tests of both protocols.

``simple`` and ``simple_string`` are the models tritonclient's shm examples drive (INT32 / BYTES [1, 16], sum and
difference), here as Python models; ``gate`` holds its request until the test lets it go, to unregister a region
while a request uses it. The ``*_roundtrip`` flows follow simple_{http,grpc}_shm_client.py and
simple_{http,grpc}_shm_string_client.py step by step, through whichever tritonclient module is given.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import tritonclient.utils.shared_memory as shm
from tritonclient import utils

from tests.backends.python.models import ADD_SUB
from tests.models import write_model

SIMPLE = """
    name: "{name}"
    backend: "python"
    max_batch_size: 8
    input [{{ name: "INPUT0", data_type: {t}, dims: [ 16 ] }}, {{ name: "INPUT1", data_type: {t}, dims: [ 16 ] }}]
    output [{{ name: "OUTPUT0", data_type: {t}, dims: [ 16 ] }}, {{ name: "OUTPUT1", data_type: {t}, dims: [ 16 ] }}]
"""

SIMPLE_PY = ADD_SUB  # INPUT0 + INPUT1 and INPUT0 - INPUT1, whatever the datatype

# The strings hold integers: their sum and difference, as strings.
SIMPLE_STRING_PY = """
    import numpy as np
    import triton_python_backend_utils as pb_utils

    def strings(values):
        return np.array([str(v).encode() for v in values.flat], dtype=np.object_).reshape(values.shape)

    class TritonPythonModel:
        def execute(self, requests):
            out = []
            for r in requests:
                a = pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy().astype(np.int32)
                b = pb_utils.get_input_tensor_by_name(r, "INPUT1").as_numpy().astype(np.int32)
                out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", strings(a + b)),
                                                       pb_utils.Tensor("OUTPUT1", strings(a - b))]))
            return out
"""

# Touches the file the "started" parameter names, waits for the one "release" names, then echoes INPUT0.
GATE = """
    name: "gate"
    backend: "python"
    input [{ name: "INPUT0", data_type: TYPE_INT32, dims: [ -1 ] }]
    output [{ name: "OUTPUT0", data_type: TYPE_INT32, dims: [ -1 ] }]
"""

GATE_PY = """
    import json, os, time
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def execute(self, requests):
            out = []
            for r in requests:
                params = json.loads(r.parameters())
                open(params["started"], "w").close()
                deadline = time.monotonic() + 30
                while not os.path.exists(params["release"]) and time.monotonic() < deadline:
                    time.sleep(0.01)
                out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", r.inputs()[0].as_numpy())]))
            return out
"""


def write_shm_models(repo: Path) -> None:
    write_model(repo, "simple", SIMPLE.format(name="simple", t="TYPE_INT32"), SIMPLE_PY)
    write_model(repo, "simple_string", SIMPLE.format(name="simple_string", t="TYPE_STRING"), SIMPLE_STRING_PY)
    write_model(repo, "gate", GATE, GATE_PY)


def key(name: str) -> str:
    """A shm key of this test process's own, so concurrent runs never share a region."""
    return f"/naiad-test-{os.getpid()}-{name}"


def _output(result: Any, name: str) -> tuple[str, list[int]]:
    """An output's datatype and shape from an HTTP (dict) or gRPC (message) result."""
    output = result.get_output(name)
    assert output is not None, f"{name} is missing in the response"
    if isinstance(output, dict):
        return output["datatype"], output["shape"]
    return output.datatype, list(output.shape)


def simple_roundtrip(client: Any, module: ModuleType) -> Any:
    """simple_*_shm_client: INT32 inputs from one region (the second at an offset), outputs into another."""
    client.unregister_system_shared_memory()
    client.unregister_cuda_shared_memory()
    input0 = np.arange(16, dtype=np.int32)
    input1 = np.ones(16, dtype=np.int32)
    size = input0.nbytes
    out_handle = shm.create_shared_memory_region("output_data", key("output_simple"), size * 2)
    in_handle = shm.create_shared_memory_region("input_data", key("input_simple"), size * 2)
    try:
        client.register_system_shared_memory("output_data", key("output_simple"), size * 2)
        shm.set_shared_memory_region(in_handle, [input0])
        shm.set_shared_memory_region(in_handle, [input1], offset=size)
        client.register_system_shared_memory("input_data", key("input_simple"), size * 2)
        inputs = [module.InferInput("INPUT0", [1, 16], "INT32"), module.InferInput("INPUT1", [1, 16], "INT32")]
        inputs[0].set_shared_memory("input_data", size)
        inputs[1].set_shared_memory("input_data", size, offset=size)
        outputs = [module.InferRequestedOutput("OUTPUT0"), module.InferRequestedOutput("OUTPUT1")]
        outputs[0].set_shared_memory("output_data", size)
        outputs[1].set_shared_memory("output_data", size, offset=size)
        result = client.infer("simple", inputs, outputs=outputs)
        datatype, shape = _output(result, "OUTPUT0")
        assert (datatype, shape) == ("INT32", [1, 16])
        output0 = shm.get_contents_as_numpy(out_handle, utils.triton_to_np_dtype(datatype), shape)
        datatype, shape = _output(result, "OUTPUT1")
        output1 = shm.get_contents_as_numpy(out_handle, utils.triton_to_np_dtype(datatype), shape, offset=size)
        np.testing.assert_array_equal(output0[0], input0 + input1)
        np.testing.assert_array_equal(output1[0], input0 - input1)
        status = client.get_system_shared_memory_status()
        client.unregister_system_shared_memory()
        return status
    finally:
        shm.destroy_shared_memory_region(in_handle)
        shm.destroy_shared_memory_region(out_handle)


def string_roundtrip(client: Any, module: ModuleType) -> Any:
    """simple_*_shm_string_client: serialized BYTES inputs and outputs, one region per tensor."""
    client.unregister_system_shared_memory()
    client.unregister_cuda_shared_memory()
    in0 = np.arange(16, dtype=np.int32)
    in1 = np.ones(16, dtype=np.int32)

    def strings(values: np.ndarray) -> np.ndarray:
        return np.array([str(v).encode() for v in values], dtype=np.object_)

    serialized = [utils.serialize_byte_tensor(strings(in0)), utils.serialize_byte_tensor(strings(in1))]
    expected = [utils.serialize_byte_tensor(strings(in0 + in1)), utils.serialize_byte_tensor(strings(in0 - in1))]
    in_sizes = [utils.serialized_byte_size(s) for s in serialized]
    out_sizes = [utils.serialized_byte_size(s) for s in expected]
    handles = []
    try:
        for i in range(2):
            handles.append(shm.create_shared_memory_region(f"output{i}_data", key(f"output{i}_simple"), out_sizes[i]))
            client.register_system_shared_memory(f"output{i}_data", key(f"output{i}_simple"), out_sizes[i])
        for i in range(2):
            handles.append(shm.create_shared_memory_region(f"input{i}_data", key(f"input{i}_simple"), in_sizes[i]))
            shm.set_shared_memory_region(handles[-1], [serialized[i]])
            client.register_system_shared_memory(f"input{i}_data", key(f"input{i}_simple"), in_sizes[i])
        inputs = [module.InferInput("INPUT0", [1, 16], "BYTES"), module.InferInput("INPUT1", [1, 16], "BYTES")]
        outputs = [module.InferRequestedOutput("OUTPUT0"), module.InferRequestedOutput("OUTPUT1")]
        for i in range(2):
            inputs[i].set_shared_memory(f"input{i}_data", in_sizes[i])
            outputs[i].set_shared_memory(f"output{i}_data", out_sizes[i])
        result = client.infer("simple_string", inputs, outputs=outputs)
        for i in range(2):
            datatype, shape = _output(result, f"OUTPUT{i}")
            assert (datatype, shape) == ("BYTES", [1, 16])
            got = shm.get_contents_as_numpy(handles[i], utils.triton_to_np_dtype(datatype), shape)
            assert list(got[0]) == list(strings(in0 + in1 if i == 0 else in0 - in1))
        status = client.get_system_shared_memory_status()
        client.unregister_system_shared_memory()
        return status
    finally:
        for handle in handles:
            shm.destroy_shared_memory_region(handle)


def mapped(pid: int, shm_key: str) -> bool:
    """Whether process ``pid`` holds the shared memory object ``shm_key``: a mapping (/proc/<pid>/maps) or an open
    descriptor (/proc/<pid>/fd), the way naiad keeps a region."""
    path = f"/dev/shm/{shm_key.lstrip('/')}"
    if path in Path(f"/proc/{pid}/maps").read_text():
        return True
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            if os.readlink(fd) == path:
                return True
        except OSError:
            pass  # closed meanwhile
    return False


def wait_for_file(path: Path, timeout: float = 30.0) -> None:
    """Until the gate model has touched ``path``: its request is then inside execute, holding its regions."""
    for _ in range(int(timeout / 0.01)):
        if path.exists():
            return
        threading.Event().wait(0.01)
