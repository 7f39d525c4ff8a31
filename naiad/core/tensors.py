"""Tensors from request buffers, checked the way Triton's core checks an input's bytes.

Every front end that receives raw tensor bytes (HTTP's binary extension, gRPC's ``raw_input_contents``)
builds its arrays here, so sizes and BYTES element counts are checked once, in Triton's words.
"""

from __future__ import annotations

import numpy as np

from naiad.core.datatypes import BytesFormatError, deserialize_bytes, dims_str, element_count
from naiad.core.errors import InferError, invalid
from naiad.core.request import InferRequest, log_prefix

_OBJECT = np.dtype(np.object_)


def from_buffer(name: str, buffer: bytes | memoryview, dtype: np.dtype, shape: list[int], request: InferRequest,
                model_name: str, core_bytes_wording: bool = False) -> np.ndarray:
    """A zero-copy view of ``buffer`` as the input ``name`` (BYTES: split into an object array).

    ``core_bytes_wording``: a malformed BYTES length prefix is reported as Triton's core words it (the gRPC
    path); Triton's HTTP front end parses BYTES itself first and words it differently.
    """
    count = element_count(shape)
    if dtype is _OBJECT:
        if count <= 0 and not valid_shape(shape):  # before a malformed shape gets a count-based message
            raise bad_shape(name, shape, request, model_name)
        try:
            array = deserialize_bytes(buffer)
        except BytesFormatError as exc:
            if core_bytes_wording and exc.kind == "incomplete string length indicator":
                raise invalid(
                    f"{log_prefix(request)}incomplete string length indicator for inference input '{name}' for "
                    f"model '{model_name}', {exc.detail.replace('in one chunk', 'in one buffer')}"
                ) from None
            raise invalid(exc.for_input(name)) from None
        if array.size > count:
            raise invalid(
                f"{log_prefix(request)}unexpected number of string elements {array.size} for inference input "
                f"'{name}' for model '{model_name}', expecting {count}"
            )
        if array.size < count:
            raise invalid(
                f"{log_prefix(request)}expected {count} string elements for inference input '{name}' for model "
                f"'{model_name}', got {array.size}"
            )
        return reshaped(array, shape, name, request, model_name)
    expected = count * dtype.itemsize
    if len(buffer) != expected:
        if not valid_shape(shape):  # a negative count, say: the shape is what is wrong
            raise bad_shape(name, shape, request, model_name)
        raise invalid(
            f"{log_prefix(request)}input byte size mismatch for input '{name}' for model '{model_name}'. Expected "
            f"{expected}, got {len(buffer)}"
        )
    try:
        return np.frombuffer(buffer, dtype=dtype).reshape(shape)
    except ValueError:  # see reshaped()
        raise bad_shape(name, shape, request, model_name) from None


# NumPy's bound on an array's byte size (and on each dimension): np.intp's largest value.
MAX_BYTES = np.iinfo(np.intp).max


def valid_shape(shape: list[int] | tuple[int, ...]) -> bool:
    """Whether NumPy can hold a tensor of this shape: no negative dimension, and the product of the non-zero ones
    (an 8-byte element each at most) within ``MAX_BYTES``. Only checked once something already failed, or by
    ``reshaped``'s error path: the hot path pays nothing for it."""
    size = 8
    for dim in shape:
        if dim < 0:
            return False
        if dim:
            size *= dim
    return size <= MAX_BYTES


def bad_shape(name: str, shape: list[int] | tuple[int, ...], request: InferRequest, model_name: str) -> InferError:
    return invalid(f"{log_prefix(request)}unexpected shape for input '{name}' for model '{model_name}'. Got "
                   f"{dims_str(shape)}: dimensions must not be negative, and the tensor must hold fewer than 2^63 "
                   "bytes")


def reshaped(array: np.ndarray, shape: list[int], name: str, request: InferRequest, model_name: str) -> np.ndarray:
    """``array`` in the request's shape. Its size already matches the shape's element count, so only a shape NumPy
    can't make fails: two negative dimensions whose product matches, or a zero beside dimensions that overflow
    (``[0, 2^63-1]``) - the client's error, not the server's."""
    try:
        return array.reshape(shape)
    except ValueError:
        raise bad_shape(name, shape, request, model_name) from None


def classify(array: np.ndarray, k: int, labels: list[str] | None, batching: bool = True) -> np.ndarray:
    """Triton's classification extension: the top ``k`` entries as ``value:index[:label]``, per batch row when
    the model batches (``batching``: its max_batch_size > 0), else over the whole tensor, as Triton's front
    ends split it."""
    if array.dtype == _OBJECT:
        raise invalid("classification is not supported for BYTES outputs")
    batched = batching and array.ndim > 0
    rows = array.reshape(array.shape[0], -1) if batched else array.reshape(1, -1)
    k = min(k, rows.shape[1])
    out = np.empty((rows.shape[0], k), dtype=np.object_)
    for r, row in enumerate(rows):
        order = np.argsort(-row, kind="stable")[:k]
        for j, idx in enumerate(order):
            value = row[idx]
            text = f"{float(value):f}" if row.dtype.kind == "f" else str(value)
            label = labels[idx] if labels and idx < len(labels) else None
            out[r, j] = (f"{text}:{idx}:{label}" if label else f"{text}:{idx}").encode()
    return out if batched else out.reshape(k)
