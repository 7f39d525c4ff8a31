"""Host staging buffers for one GPU instance's copies to and from its device, as Triton's backends keep them.

Each ``KIND_GPU`` instance of the pytorch and TensorRT backends (and of onnxruntime's CUDA provider, where torch
is installed) runs on its own CUDA stream. Inputs are gathered into page-locked (pinned) host buffers and copied
to the device with ``non_blocking=True``; outputs come back into pinned buffers the same way; then only the
instance's own stream is synchronized, so two instances on one GPU overlap their copies and kernels. Pinned
memory is slow to allocate, so the buffers live as long as the instance and grow (doubling) when a batch needs
more; one execution of an instance runs at a time, so one set per instance is enough.

A staged output is a view of a buffer the next execution overwrites, while the loop may still be sending this
one's reply (overlap): callers copy it out after the synchronize (``np.ndarray.copy``; no more copies than a
pageable device-to-host copy makes, which CUDA stages through pinned memory itself).

Imported only where torch is: the pytorch backend, and the others once they found it.
"""

from __future__ import annotations

import numpy as np
import torch


class Staging:
    """Reusable host buffers, one per (tensor name, dtype); ``pin``: page-locked (needs CUDA)."""

    def __init__(self, pin: bool) -> None:
        self.pin = pin
        self._buffers: dict[tuple[str, torch.dtype], torch.Tensor] = {}
        self.allocations = 0  # buffers allocated so far (for tests: reuse shows as no growth)

    def buffer(self, key: str, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
        """A host tensor of ``shape`` over the buffer for ``key``, grown when too small."""
        numel = 1
        for dim in shape:
            numel *= dim
        held = self._buffers.get((key, dtype))
        if held is None or held.numel() < numel:
            size = max(numel, 2 * held.numel() if held is not None else 0, 1)
            held = torch.empty(size, dtype=dtype, pin_memory=self.pin)
            self._buffers[(key, dtype)] = held
            self.allocations += 1
        return held[:numel].view(shape)

    def to_device(self, key: str, array: np.ndarray, device: torch.device) -> torch.Tensor:
        """``array`` on ``device``: gathered into the pinned buffer, then copied without blocking on the current
        stream (the caller runs under the instance's stream and synchronizes it before the buffer is reused)."""
        source = torch.from_numpy(array)
        host = self.buffer(key, source.dtype, tuple(source.shape))
        host.copy_(source)
        return host.to(device, non_blocking=True)

    def to_host(self, key: str, tensor: torch.Tensor) -> np.ndarray:
        """A view of ``tensor``'s values in the pinned buffer for ``key``, valid once the stream is synchronized
        and until the instance's next execution."""
        host = self.buffer(key, tensor.dtype, tuple(tensor.shape))
        host.copy_(tensor.detach(), non_blocking=True)
        return host.numpy()

