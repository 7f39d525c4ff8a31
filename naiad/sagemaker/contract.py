"""What SageMaker's two sides agree on: the target-model header, the key a multi-model load is filed under, the
errors the multi-model API raises, and which failures are answered 507 and what the log says about them.

Plain values over ``naiad.core``: the HTTP front end (above the service face) and the residency (below it) both
import them.
"""

from __future__ import annotations

import hashlib

from naiad.core.errors import InferError

TARGET_MODEL = b"x-amzn-sagemaker-target-model"

# Later Triton (server PR #8923) refuses a header naming another model than the one loaded under the url's key:
# honouring it let a request meant for one model run, or unload, another.
MISMATCH = "X-Amzn-SageMaker-Target-Model header does not match the model requested in the URL"

# Triton's SageMaker server answers 507 when an error says any of these (sagemaker_server.cc).
OUT_OF_MEMORY = (
    "CUDA out of memory", "CUDA_OUT_OF_MEMORY", "Out of memory", "Out Of Memory", "out of memory", "MemoryError",
    "OutOfMemory", "OOM", "Dst tensor is not initialized", "Src tensor is not initialized",
    "CNMEM_STATUS_OUT_OF_MEMORY", "CUDNN_STATUS_NOT_INITIALIZED", "CUBLAS_STATUS_ALLOC_FAILED",
    "CUBLAS_STATUS_NOT_INITIALIZED", "Failed to allocate memory", "failed to allocate memory",
    "No space left on device",
)


def is_out_of_memory(message: str) -> bool:
    return any(text in message for text in OUT_OF_MEMORY)


def exhausted_budget(message: str) -> str:
    """Which budget an out-of-memory error says was hit, for the log line beside its 507 (the model cache's
    own refusal names --model-memory-limit: ``naiad.repository.cache``)."""
    if "(--model-memory-limit)" in message:
        return "the SageMaker models' memory limit (--model-memory-limit)"
    if "No space left on device" in message:
        return "disk space"
    if any(text in message for text in ("CUDA", "CNMEM", "CUDNN", "CUBLAS", "Dst tensor", "Src tensor")):
        return "GPU memory"
    return "host memory (the model's own allocation failed)"


def model_key(target: str) -> str:
    """The key an on-demand load files ``target`` (an archive's path under the model data url) under, as
    SageMaker names a multi-model endpoint's model: the hash of its name, ``<models root>/<key>/model``."""
    return hashlib.md5(target.encode()).hexdigest()


class UrlRefused(InferError):
    """A url under /dev, /proc or /sys: Triton refuses it with a bare 400 and only logs why."""


class ArchiveError(InferError):
    """An on-demand load that failed before the model itself was involved: fetching or extracting its archive."""
