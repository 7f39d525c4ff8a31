"""Request inputs as perf_analyzer makes them: synthesized from the model's metadata and config ("random" once
per input, or "zero"), or read from perf_analyzer's JSON data format; then encoded once into the exact bytes
each protocol sends, so the workers only write prepared buffers."""

from __future__ import annotations

import base64
import json
import random
import string
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from naiad.bench.control import ModelInfo, TensorSpec
from naiad.core.datatypes import WIRE_TO_NUMPY, serialize_bytes


class InputError(ValueError):
    """A request that cannot be built from what the model and the flags say."""


@dataclass
class Tensor:
    name: str
    datatype: str
    shape: list[int]      # as sent, the batch dimension included when the model batches
    data: bytes           # raw contents (BYTES: length-prefixed elements)


def _shape_for(spec: TensorSpec, shapes: dict[str, list[int]]) -> list[int]:
    """The model's dims; --shape fills variable dims (as in perf_analyzer it does not change fixed ones)."""
    if all(d >= 0 for d in spec.shape):
        return list(spec.shape)
    if spec.name not in shapes:
        raise InputError(
            f"input {spec.name} contains dynamic shape, provide shapes to send along with the request")
    given = list(shapes[spec.name])
    if len(given) != len(spec.shape) or any(d >= 0 and d != g for d, g in zip(spec.shape, given)):
        raise InputError(f"--shape {spec.name}:{','.join(map(str, given))} does not match the model's dims "
                         f"{spec.shape}")
    return given


def _random_strings(count: int, length: int, rng: random.Random, fixed: str | None) -> list[bytes]:
    if fixed is not None:
        return [fixed.encode()] * count
    alphabet = string.ascii_letters + string.digits
    return [("".join(rng.choice(alphabet) for _ in range(length))).encode() for _ in range(count)]


def _synthesize(spec: TensorSpec, shape: list[int], mode: str, string_length: int, string_data: str | None,
                rng: np.random.Generator) -> bytes:
    count = int(np.prod(shape)) if shape else 1
    if spec.datatype == "BYTES":
        if mode == "zero" and string_data is None:
            values = [b"\x00" * string_length] * count
        else:
            values = _random_strings(count, string_length, random.Random(int(rng.integers(1 << 30))), string_data)
        return serialize_bytes(np.array(values, dtype=np.object_))
    dtype = WIRE_TO_NUMPY.get(spec.datatype)
    if dtype is None:
        raise InputError(f"unsupported datatype {spec.datatype} for input {spec.name}")
    if mode == "zero":
        return np.zeros(count, dtype=dtype).tobytes()
    if dtype.kind == "f":
        return rng.random(count).astype(dtype).tobytes()
    if dtype.kind == "b":
        return rng.integers(0, 2, count).astype(dtype).tobytes()
    return rng.integers(0, 100, count).astype(dtype).tobytes()


def _from_json_value(spec: TensorSpec, value: Any, default_shape: list[int]) -> tuple[list[int], bytes]:
    shape = default_shape
    if isinstance(value, dict) and "content" in value:
        if "shape" in value:
            shape = [int(d) for d in value["shape"]]
        value = value["content"]
    if isinstance(value, dict) and "b64" in value:
        return shape, base64.b64decode(value["b64"])
    flat = np.array(value, dtype=np.object_ if spec.datatype == "BYTES" else None).reshape(-1)
    if spec.datatype == "BYTES":
        items = [v.encode() if isinstance(v, str) else bytes(v) for v in flat]
        data = serialize_bytes(np.array(items, dtype=np.object_))
    else:
        data = flat.astype(WIRE_TO_NUMPY[spec.datatype]).tobytes()
    count = len(flat)
    if any(d < 0 for d in shape):
        raise InputError(f"input {spec.name} contains dynamic shape, provide shapes to send along with the request")
    if spec.datatype != "BYTES" and int(np.prod(shape)) != count:
        raise InputError(f"input {spec.name}: {count} values given for shape {shape}")
    return shape, data


def build_inputs(model: ModelInfo, *, batch_size: int = 1, input_data: str = "random",
                 shapes: dict[str, list[int]] | None = None, string_length: int = 128,
                 string_data: str | None = None) -> list[list[Tensor]]:
    """One list of tensors per distinct request (several when a JSON file gives several entries)."""
    shapes = shapes or {}
    if model.max_batch_size == 0 and batch_size > 1:
        raise InputError("can not specify batch size > 1 as the model does not support batching")
    if model.max_batch_size > 0 and batch_size > model.max_batch_size:
        raise InputError(f"expecting batch size <= {model.max_batch_size} for model '{model.name}'")
    batched = model.max_batch_size > 0

    def with_batch(shape: list[int]) -> list[int]:
        return [batch_size, *shape] if batched else shape

    def repeat(data: bytes) -> bytes:
        return data * batch_size if batched else data

    if input_data in ("random", "zero"):
        rng = np.random.default_rng(0)
        tensors = []
        for spec in model.inputs:
            shape = _shape_for(spec, shapes)
            one = _synthesize(spec, shape, input_data, string_length, string_data, rng)
            tensors.append(Tensor(spec.name, spec.datatype, with_batch(shape), repeat(one)))
        return [tensors]

    path = Path(input_data)
    if not path.is_file():
        raise InputError(f"Failed to parse --input-data. Unsupported type provided: '{input_data}'. The available "
                         "options are 'zero', 'random', path to a directory, or a json file.")
    document = json.loads(path.read_text())
    entries = document.get("data", [])
    if entries and isinstance(entries[0], list):   # streams (sequence models): played back one after another
        entries = [step for stream in entries for step in stream]
    requests = []
    for entry in entries:
        tensors = []
        for spec in model.inputs:
            if spec.name not in entry:
                raise InputError(f"input data file is missing input '{spec.name}'")
            default = list(spec.shape) if all(d >= 0 for d in spec.shape) else list(shapes.get(spec.name, spec.shape))
            shape, data = _from_json_value(spec, entry[spec.name], default)
            tensors.append(Tensor(spec.name, spec.datatype, with_batch(shape), repeat(data)))
        requests.append(tensors)
    if not requests:
        raise InputError(f"no data entries in {input_data}")
    return requests


# --- encodings -------------------------------------------------------------------------------------------

def infer_path(model: str, version: str) -> str:
    return f"/v2/models/{model}" + (f"/versions/{version}" if version else "") + "/infer"


def http_request(host: str, model: ModelInfo, tensors: list[Tensor], *, headers: dict[str, str] | None = None,
                 shm: dict[str, tuple[str, int, int]] | None = None) -> bytes:
    """A complete HTTP/1.1 request using the binary tensor extension (or shared-memory references)."""
    inputs, blobs = [], []
    for t in tensors:
        item: dict[str, Any] = {"name": t.name, "shape": t.shape, "datatype": t.datatype}
        if shm and t.name in shm:
            region, offset, size = shm[t.name]
            item["parameters"] = {"shared_memory_region": region, "shared_memory_byte_size": size,
                                  "shared_memory_offset": offset}
        else:
            item["parameters"] = {"binary_data_size": len(t.data)}
            blobs.append(t.data)
        inputs.append(item)
    outputs = []
    for out in model.outputs:
        if shm and out.name in shm:
            region, offset, size = shm[out.name]
            outputs.append({"name": out.name, "parameters": {"shared_memory_region": region,
                                                               "shared_memory_byte_size": size,
                                                               "shared_memory_offset": offset}})
        else:
            outputs.append({"name": out.name, "parameters": {"binary_data": True}})
    header = json.dumps({"inputs": inputs, "outputs": outputs}, separators=(",", ":")).encode()
    body = header + b"".join(blobs)
    lines = [f"POST {infer_path(model.name, model.version)} HTTP/1.1", f"Host: {host}",
             "Content-Type: application/octet-stream", f"Inference-Header-Content-Length: {len(header)}",
             f"Content-Length: {len(body)}"]
    for key, value in (headers or {}).items():
        lines.append(f"{key}: {value}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def http_get(host: str, path: str) -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: {host}\r\n\r\n".encode()


def grpc_request(model: ModelInfo, tensors: list[Tensor], *, streaming: bool = False,
                 shm: dict[str, tuple[str, int, int]] | None = None) -> bytes:
    """A serialized ModelInferRequest with raw_input_contents (or shared-memory references)."""
    from tritonclient.grpc import service_pb2

    request = service_pb2.ModelInferRequest(model_name=model.name, model_version=model.version)
    for t in tensors:
        tensor = request.inputs.add(name=t.name, datatype=t.datatype, shape=t.shape)
        if shm and t.name in shm:
            region, offset, size = shm[t.name]
            tensor.parameters["shared_memory_region"].string_param = region
            tensor.parameters["shared_memory_byte_size"].int64_param = size
            tensor.parameters["shared_memory_offset"].int64_param = offset
        else:
            request.raw_input_contents.append(t.data)
    for out in model.outputs:
        wanted = request.outputs.add(name=out.name)
        if shm and out.name in shm:
            region, offset, size = shm[out.name]
            wanted.parameters["shared_memory_region"].string_param = region
            wanted.parameters["shared_memory_byte_size"].int64_param = size
            wanted.parameters["shared_memory_offset"].int64_param = offset
    if streaming and model.decoupled:
        # Decoupled models: the server marks the last response, so a request's end is known.
        request.parameters["triton_enable_empty_final_response"].bool_param = True
    return request.SerializeToString()
