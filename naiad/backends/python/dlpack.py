"""BF16 through DLPack, which NumPy cannot do: it neither exports nor imports DLPack's bfloat16 (kDLBfloat).

A BF16 array leaves as its 2-byte words (a uint16 view that NumPy exports), with the capsule's dtype fields
rewritten to bfloat16, so torch.from_dlpack reads bfloat16 values from the same memory. A bfloat16 capsule comes
in the other way: its dtype fields are rewritten to uint16 before NumPy imports it, and the array is viewed as
BF16. Both stay zero-copy, and the capsule's own deleter still frees what it holds.
"""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np

from naiad.core.datatypes import BF16

# DLDataType's type codes (dlpack.h).
_KDL_UINT = 1
_KDL_BFLOAT = 4
# Where DLTensor starts in the capsule's struct: DLManagedTensor begins with it; DLManagedTensorVersioned
# (DLPack 1.0) puts its version, manager_ctx, deleter and flags first (4 words).
_DL_TENSOR_AT = {b"dltensor": 0, b"dltensor_versioned": 32}
# DLTensor's dtype field: after data (8), device (8) and ndim (4); code, bits, then lanes (uint16).
_DTYPE_AT = 20

_get_name = ctypes.pythonapi.PyCapsule_GetName
_get_name.restype = ctypes.c_char_p
_get_name.argtypes = [ctypes.py_object]
_get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_get_pointer.restype = ctypes.c_void_p
_get_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]


def is_bf16(dtype: np.dtype) -> bool:
    # ml_dtypes' bfloat16, or the bare 2-byte words a model's environment without ml_dtypes sees
    return dtype == BF16 or (dtype.kind == "V" and dtype.itemsize == 2 and dtype.fields is None)


def _dtype_field(capsule: Any) -> Any:
    """The capsule's DLDataType (code, bits, lanes) as a writable ctypes view, or None for a capsule that is
    not an unconsumed DLPack tensor."""
    name = _get_name(capsule)
    offset = _DL_TENSOR_AT.get(name) if name is not None else None
    if offset is None:
        return None
    address = _get_pointer(capsule, name)
    return (ctypes.c_uint8 * 4).from_address(address + offset + _DTYPE_AT)


def export_bf16(array: np.ndarray) -> Any:
    """A DLPack capsule (legacy, as Triton's to_dlpack gives) of a BF16 array, typed kDLBfloat/16."""
    capsule = array.view(np.uint16).__dlpack__()
    field = _dtype_field(capsule)
    field[0], field[1] = _KDL_BFLOAT, 16
    return capsule


def import_capsule(capsule: Any) -> Any:
    """If the capsule holds bfloat16 (code kDLBfloat, 16 bits), retype it to uint16 for NumPy and return the
    dtype to view the imported array as (BF16); None leaves the capsule as it was."""
    field = _dtype_field(capsule)
    if field is None or (field[0], field[1]) != (_KDL_BFLOAT, 16):
        return None
    field[0] = _KDL_UINT
    return BF16
