"""Request tensors for tritonclient, shared by the live-server tests."""

from __future__ import annotations

from types import ModuleType
from typing import Any

import numpy as np
from tritonclient.utils import np_to_triton_dtype


def infer_inputs(client: ModuleType, **arrays: np.ndarray) -> list[Any]:
    """``client.InferInput`` objects (tritonclient.http, .grpc or .grpc.aio) named by keyword, typed from each array.
    HTTP sends them as binary tensors, tritonclient's default."""
    inputs = []
    for name, data in arrays.items():
        tensor = client.InferInput(name, list(data.shape), np_to_triton_dtype(data.dtype))
        tensor.set_data_from_numpy(data)
        inputs.append(tensor)
    return inputs
