"""How the C heap of a serving process treats big buffers (glibc only; elsewhere nothing changes).

Why: a request's tensors are buffers of megabytes, allocated and freed once per request (the bytes read, the joined
message, the arrays). By default glibc serves such a block from fresh mmap'd pages, or from the heap's top, which it
gives back to the kernel whenever 2 x the block is free there; either way each request pays the kernel to fault
in and zero its pages again, which measured as ~40 % of a 1 MiB gRPC request's CPU. Blocks below 32 MiB are
served from the heap here, and up to 64 MiB freed at its top stays mapped for the next request. Settings made with
glibc's own variables (MALLOC_MMAP_THRESHOLD_, MALLOC_TRIM_THRESHOLD_) win.
"""

from __future__ import annotations

import ctypes
import os

M_TRIM_THRESHOLD = -1  # glibc's <malloc.h>
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 * 1024 * 1024
TRIM_THRESHOLD = 64 * 1024 * 1024


def keep_big_buffers() -> bool:
    """Set the thresholds in this process; False where the C library has no ``mallopt`` or the user set them."""
    if "MALLOC_MMAP_THRESHOLD_" in os.environ or "MALLOC_TRIM_THRESHOLD_" in os.environ:
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (AttributeError, OSError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))
