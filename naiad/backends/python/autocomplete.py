"""A Python model's ``auto_complete_config``, run in the server or, for a model with an execution environment,
in that environment's interpreter (as Triton's stub runs it): ``python -m naiad.backends.python.autocomplete``
reads ``{"model_file", "name", "config"}`` as JSON on stdin and prints ``{"config": ...}`` or ``{"error": ...}``."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

from naiad.backends.python import pb_utils
from naiad.backends.python.runner import import_model
from naiad.core.errors import InferError, invalid


def complete(module: ModuleType, config: dict[str, Any], name: str) -> dict[str, Any] | None:
    """The config the model's hook returns, or None when it has no hook."""
    hook = getattr(getattr(module, "TritonPythonModel", None), "auto_complete_config", None)
    if hook is None:
        return None
    try:
        result = hook(pb_utils.ModelConfig(config))
    except Exception as exc:
        raise invalid(f"auto_complete_config failed for model '{name}': {exc}") from None
    if not isinstance(result, pb_utils.ModelConfig):
        raise invalid(f"auto_complete_config function in model '{name}' must return a valid pb.ModelConfig object.")
    return result.as_dict()


def main() -> None:
    job = json.loads(sys.stdin.read())
    sys.modules.setdefault("triton_python_backend_utils", pb_utils)
    try:
        module = import_model(Path(job["model_file"]), job["name"])
        answer: dict[str, Any] = {"config": complete(module, job["config"], job["name"])}
    except InferError as exc:
        answer = {"error": [exc.code.name, exc.message]}
    sys.stdout.flush()
    print("\n" + json.dumps(answer))  # last line: whatever the model printed while importing comes before it


if __name__ == "__main__":
    main()
