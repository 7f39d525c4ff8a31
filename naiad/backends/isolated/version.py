"""The server's side of a framework model whose instances run in their own processes.

A ``KIND_GPU`` instance of the onnxruntime, pytorch or TensorRT backend runs in a worker process, as a Python
model's does: a device error that sticks (faults.py) then costs one process, restarted while every other
model keeps serving, and an unload gives the device memory back with the process. The worker runs ``model.py``
beside this file, which builds the framework's own instance inside it; everything else (shared-memory tensors,
restart after a crash and the requests that wait for it, cancellation, statistics, finalize) is the Python
backend's worker machinery.

``--backend-config=<backend>,instance-process=true|false`` decides for every model of that backend; unset,
models with a ``KIND_GPU`` instance group run apart and the others stay on threads in the server (cheaper per
request: no hop to another process). The Python backend's worker settings (``restart-wait-seconds``,
``pipeline-depth``, ``shm-default-byte-size``, ...) apply, under the framework's own backend name.
"""

from __future__ import annotations

import json
from pathlib import Path

from naiad.backends.base import VersionContext
from naiad.backends.isolated import SETUP_ARG, SWITCH
from naiad.backends.parameters import parse_bool
from naiad.backends.python.backend import WorkerVersion
from naiad.config import pb

ADAPTER = Path(__file__).resolve().with_name("model.py")


def runs_apart(ctx: VersionContext) -> bool:
    value = ctx.options.get(SWITCH, "").strip()
    if value:
        return parse_bool(value)
    return any(group.kind == pb.ModelInstanceGroup.KIND_GPU for group in ctx.config.instance_group)


class IsolatedVersion(WorkerVersion):
    """One worker per instance, running the ``backend`` framework's own instance."""

    def __init__(self, ctx: VersionContext, backend: str) -> None:
        setup = {"backend": backend, "options": ctx.options, "version_dir": str(ctx.version_dir)}
        super().__init__(ctx, model_file=str(ADAPTER), extra_args={SETUP_ARG: json.dumps(setup)})
