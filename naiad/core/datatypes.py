"""Triton datatypes: the wire names, the config enum names and their NumPy equivalents.

BYTES tensors live in the server as NumPy object arrays of ``bytes``; on the wire each
element is a 4-byte little-endian length followed by its bytes.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable

import numpy as np

# BF16 has no NumPy type of its own: ml_dtypes' bfloat16 is the one JAX, TensorFlow and tritonclient use (2 bytes,
# the top half of an FP32), so the wire's bytes are viewed as it zero-copy like any other type. A Python model's
# own execution environment may lack ml_dtypes: there BF16 tensors are bare 2-byte words (``.view(np.uint16)``).
try:
    import ml_dtypes

    BF16 = np.dtype(ml_dtypes.bfloat16)
except ImportError:  # pragma: no cover - ml_dtypes is a dependency of the server itself
    BF16 = np.dtype("V2")
# Its type strings: bfloat16's '<V2', the bare words' '|V2' (both are 2-byte voids to np.dtype()).
BF16_CODES = frozenset(("<V2", "|V2"))

# Wire (KServe v2) name -> NumPy dtype. BYTES maps to object arrays of bytes.
WIRE_TO_NUMPY: dict[str, np.dtype] = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype(np.uint8),
    "UINT16": np.dtype(np.uint16),
    "UINT32": np.dtype(np.uint32),
    "UINT64": np.dtype(np.uint64),
    "INT8": np.dtype(np.int8),
    "INT16": np.dtype(np.int16),
    "INT32": np.dtype(np.int32),
    "INT64": np.dtype(np.int64),
    "FP16": np.dtype(np.float16),
    "FP32": np.dtype(np.float32),
    "FP64": np.dtype(np.float64),
    "BF16": BF16,
    "BYTES": np.dtype(np.object_),
}

# Config enum name (TYPE_*) <-> wire name. TYPE_STRING is the config spelling of BYTES.
CONFIG_TO_WIRE: dict[str, str] = {f"TYPE_{w}": w for w in WIRE_TO_NUMPY if w != "BYTES"}
CONFIG_TO_WIRE["TYPE_STRING"] = "BYTES"
WIRE_TO_CONFIG: dict[str, str] = {w: c for c, w in CONFIG_TO_WIRE.items()}

# NumPy dtype -> wire name. Fixed-width bytes/str arrays are BYTES too.
NUMPY_TO_WIRE: dict[np.dtype, str] = {d: w for w, d in WIRE_TO_NUMPY.items()}


def numpy_to_wire(dtype: np.dtype) -> str | None:
    dtype = np.dtype(dtype)
    wire = NUMPY_TO_WIRE.get(dtype)
    if wire is None and dtype.kind in "SUO":
        return "BYTES"
    return wire


# A variable-size dimension in a config's dims.
WILDCARD = -1


def fixed_size(dims: "Iterable[int]") -> int:
    """The product of a config's fixed dimensions (wildcards skipped)."""
    n = 1
    for d in dims:
        if d != WILDCARD:
            n *= d
    return n


def wildcard_count(dims: "Iterable[int]") -> int:
    return sum(1 for d in dims if d == WILDCARD)


def element_count(shape: list[int] | tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def dims_str(dims: list[int] | tuple[int, ...]) -> str:
    """Triton's rendering of a shape in messages: ``[-1,4]``."""
    return "[" + ",".join(str(int(d)) for d in dims) + "]"


def serialize_bytes(array: np.ndarray) -> bytes:
    """Length-prefix each element (row-major) as Triton's BYTES wire format does."""
    parts: list[bytes] = []
    pack = struct.Struct("<I").pack
    for item in array.ravel(order="C"):
        if isinstance(item, str):
            item = item.encode("utf-8")
        elif not isinstance(item, (bytes, bytearray)):
            item = str(item).encode("utf-8")
        parts.append(pack(len(item)))
        parts.append(item)
    return b"".join(parts)


class BytesFormatError(ValueError):
    """The buffer does not hold whole length-prefixed elements; ``detail`` reads after "for inference input X"."""

    def __init__(self, kind: str, detail: str) -> None:
        super().__init__(f"{kind} {detail}")
        self.kind = kind
        self.detail = detail

    def for_input(self, name: str) -> str:
        return f"{self.kind} for inference input '{name}', {self.detail}"


def deserialize_bytes(buffer: bytes | memoryview, count: int | None = None) -> np.ndarray:
    """Split a length-prefixed buffer into a flat object array of bytes.

    With ``count`` given, exactly that many elements must fill the buffer exactly.
    """
    view = memoryview(buffer)
    size = len(view)
    items: list[bytes] = []
    offset = 0
    unpack = struct.Struct("<I").unpack_from
    while offset < size:
        if offset + 4 > size:
            raise BytesFormatError(
                "incomplete string length indicator",
                f"expecting 4 bytes but only {size - offset} bytes available. Please make sure the string length "
                "indicator is in one chunk.",
            )
        (length,) = unpack(view, offset)
        offset += 4
        if offset + length > size:
            raise BytesFormatError(
                "incomplete string data",
                f"expecting string of length {length} but only {size - offset} bytes available",
            )
        items.append(bytes(view[offset : offset + length]))
        offset += length
    if count is not None and len(items) != count:
        raise BytesFormatError("unexpected number of string elements", f"expected {count}, got {len(items)}")
    out = np.empty(len(items), dtype=np.object_)
    out[:] = items
    return out


def byte_size(array: np.ndarray) -> int:
    """Size of a tensor on the wire (BYTES includes the length prefixes)."""
    if array.dtype == np.object_:
        total = 0
        for item in array.ravel():
            total += 4 + (len(item) if isinstance(item, (bytes, bytearray)) else len(str(item).encode()))
        return total
    return array.nbytes
