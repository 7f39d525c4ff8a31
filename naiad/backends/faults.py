"""Device errors that poison the process they happen in: after one, every later CUDA call in that process fails
the same way, so the instance must be restarted in a fresh process (a client's bad input must cost one failed
request, not the model).

CUDA documents these ("the process must be terminated and relaunched"); they are matched by the runtime's own
text (cudaGetErrorString), the runtime's enum name and the driver's, since a framework may report any of them
(torch: "CUDA error: device-side assert triggered"; onnxruntime: "CUDA failure 710: device-side assert
triggered"; TensorRT logs the enum name). Where the text says nothing (an error surfacing later as a cuBLAS
failure, or a model that wraps the exception in its own words), a cheap probe of the device decides: in a
process where torch has initialized CUDA, ``torch.cuda.synchronize()`` raises the sticky error again.
"""

from __future__ import annotations

import sys

# cudaGetErrorString's text -> the other names the same error goes by (runtime enum, driver enum).
STICKY: dict[str, tuple[str, ...]] = {
    "device-side assert triggered": ("cudaErrorAssert", "CUDA_ERROR_ASSERT"),
    "an illegal memory access was encountered": ("cudaErrorIllegalAddress", "CUDA_ERROR_ILLEGAL_ADDRESS"),
    "unspecified launch failure": ("cudaErrorLaunchFailure", "CUDA_ERROR_LAUNCH_FAILED"),
    "misaligned address": ("cudaErrorMisalignedAddress", "CUDA_ERROR_MISALIGNED_ADDRESS"),
    "an illegal instruction was encountered": ("cudaErrorIllegalInstruction", "CUDA_ERROR_ILLEGAL_INSTRUCTION"),
    "hardware stack error": ("cudaErrorHardwareStackError", "CUDA_ERROR_HARDWARE_STACK_ERROR"),
    "invalid program counter": ("cudaErrorInvalidPc", "CUDA_ERROR_INVALID_PC"),
    "operation not supported on global/shared address space": ("cudaErrorInvalidAddressSpace",
                                                               "CUDA_ERROR_INVALID_ADDRESS_SPACE"),
    "the launch timed out and was terminated": ("cudaErrorLaunchTimeout", "CUDA_ERROR_LAUNCH_TIMEOUT"),
    "uncorrectable ECC error encountered": ("cudaErrorECCUncorrectable", "CUDA_ERROR_ECC_UNCORRECTABLE"),
    "uncorrectable NVLink error detected during the execution": ("cudaErrorNvlinkUncorrectable",
                                                                 "CUDA_ERROR_NVLINK_UNCORRECTABLE"),
}
_NEEDLES = [(needle.lower(), cause) for cause, names in STICKY.items() for needle in (cause, *names)]


def sticky_cause(text: str) -> str | None:
    """The sticky CUDA error ``text`` reports (its runtime text), if it reports one."""
    lowered = text.lower()
    for needle, cause in _NEEDLES:
        if needle in lowered:
            return cause
    return None


def probe() -> str | None:
    """Ask the device whether this process can still use it: only where torch is imported and has initialized
    CUDA here (a process that never touched CUDA can't have poisoned it, and initializing it now would cost a
    context). Returns the sticky error's text, or None when the device answers or the probe can't tell."""
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    if cuda is None:
        return None
    try:
        if not cuda.is_initialized():
            return None
        cuda.synchronize()
    except Exception as exc:  # torch raises RuntimeError (or torch.AcceleratorError) with CUDA's text
        return sticky_cause(str(exc)) or f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    return None


def poisoned(texts: list[str]) -> str | None:
    """After a failed execution whose errors read ``texts``: the cause if the process's device is poisoned."""
    for text in texts:
        cause = sticky_cause(text)
        if cause is not None:
            return cause
    return probe()


def notice(instance: str, model: str, cause: str) -> str:
    """What requests that fail with the instance are told."""
    return f"instance '{instance}' of model '{model}' hit a sticky CUDA error ({cause}) and is being restarted"
