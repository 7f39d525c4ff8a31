"""``model_warmup``: before a version is READY, run each sample ``count`` times on every instance, as Triton does.

A sample is ``batch_size`` requests of one row each, executed together on the instance (not through the
scheduler). Inputs are ``zero_data``, ``random_data`` (BYTES: empty strings, as Triton) or ``input_data_file``
read from ``<model>/warmup/``. Warmup executions count in the statistics like any other. A failing sample
fails the load with Triton's message.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import numpy as np

from naiad.backends.base import Execution, Instance
from naiad.config import pb
from naiad.core.datatypes import WILDCARD, deserialize_bytes
from naiad.core.errors import InferError, invalid
from naiad.core.request import InferRequest
from naiad.repository.model import ModelVersion
from naiad.scheduling.execution import now_ns, record, run

log = logging.getLogger("naiad.repository")

_DTYPES = {
    pb.TYPE_BOOL: np.bool_, pb.TYPE_UINT8: np.uint8, pb.TYPE_UINT16: np.uint16, pb.TYPE_UINT32: np.uint32,
    pb.TYPE_UINT64: np.uint64, pb.TYPE_INT8: np.int8, pb.TYPE_INT16: np.int16, pb.TYPE_INT32: np.int32,
    pb.TYPE_INT64: np.int64, pb.TYPE_FP16: np.float16, pb.TYPE_FP32: np.float32, pb.TYPE_FP64: np.float64,
    pb.TYPE_STRING: np.object_,
}


def _input(name: str, spec: pb.ModelWarmup.Input, shape: list[int], model_dir: Path, rng: np.random.Generator,
           prefix: str) -> np.ndarray:
    dtype = _DTYPES.get(spec.data_type)
    if dtype is None:
        raise invalid(f"{prefix}warmup setting has an unsupported data type for input '{name}'")
    count = int(np.prod(shape))
    which = spec.WhichOneof("input_data_type")
    if which == "zero_data" or (which == "random_data" and dtype is np.object_):
        if dtype is np.object_:
            return np.full(shape, b"", dtype=object)
        return np.zeros(shape, dtype=dtype)
    if which == "random_data":
        raw = rng.integers(0, 256, count * np.dtype(dtype).itemsize, dtype=np.uint8).tobytes()
        return np.frombuffer(raw, dtype=dtype).reshape(shape).copy()
    if which == "input_data_file":
        path = model_dir / "warmup" / spec.input_data_file
        try:
            raw = path.read_bytes()
        except OSError as exc:
            raise invalid(f"{prefix}unable to read warmup data file '{path}': {exc.strerror}") from None
        if dtype is np.object_:
            return deserialize_bytes(raw, count).reshape(shape)
        expected = count * np.dtype(dtype).itemsize
        if expected > len(raw):
            raise invalid(f"{prefix}warmup setting expects {expected} bytes, but the data provided from "
                          f"{spec.input_data_file}only has {len(raw)} bytes")
        return np.frombuffer(raw[:expected], dtype=dtype).reshape(shape).copy()
    raise invalid(f"{prefix}warmup setting expects input '{name}' to have input_data_type set")


def samples(model: ModelVersion, model_dir: Path) -> list[tuple[str, int, list[dict[str, np.ndarray]]]]:
    """(name, count, the inputs of each request) for every warmup sample with a non-zero batch size."""
    config = model.config
    rng = np.random.default_rng()
    config_inputs = {i.name for i in config.input}
    prepared = []
    for setting in config.model_warmup:
        if setting.batch_size == 0:
            continue
        for name, spec in setting.inputs.items():
            if any(d == WILDCARD for d in spec.dims):
                raise invalid("warmup setting expects all variable-size dimensions are specified for input "
                              f"'{name}'")
        requests = []
        for _ in range(setting.batch_size):
            inputs = {}
            for name, spec in setting.inputs.items():
                # Model inputs get the batch dimension; control inputs (not in the config) are given whole.
                shape = ([1] if config.max_batch_size and name in config_inputs else []) + list(spec.dims)
                inputs[name] = _input(name, spec, shape, model_dir, rng, "[request id: <id_unknown>] ")
            requests.append(inputs)
        prepared.append((setting.name, max(setting.count, 1), requests))
    return prepared


async def _execute(instance: Instance, requests: list[InferRequest]) -> Execution:
    future: asyncio.Future[Execution] = asyncio.get_running_loop().create_future()
    run(instance, requests, lambda i, reqs, result: future.set_result(result))
    return await future


async def warm_up(model: ModelVersion, model_dir: Path) -> None:
    """Run the warmup samples on every instance; raises Triton's INVALID_ARG when a sample fails."""
    prepared = samples(model, model_dir)
    if not prepared:
        return
    batching = model.config.max_batch_size > 0
    for instance in model.loaded.instances:
        for name, count, rows in prepared:
            for iteration in range(1, count + 1):
                log.debug("model '%s' instance %s is running warmup sample '%s' for iteration %d",
                          model.name, instance.name, name, iteration)
                requests = []
                for inputs in rows:
                    request = InferRequest(model.name, model.version_str, inputs=dict(inputs))
                    request.batch_size = 1 if batching else 0
                    request.arrival_ns = now_ns()
                    requests.append(request)
                started = now_ns()
                result = await _execute(instance, requests)
                record(model.stats, requests, result, started)
                ended = now_ns()
                for request in requests:
                    if result.failed:
                        model.stats.record_failure(ended - request.arrival_ns, "BACKEND")
                    else:
                        model.stats.success.add(ended - request.arrival_ns)
                errors = [r.error.message for r in result.responses if r.error is not None]
                if errors:
                    raise InferError(f"failed to run warmup sample '{name}': " + "".join(f"{e}; " for e in errors))
