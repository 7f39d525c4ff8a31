"""A Python model's ``auto_complete_config``, run in a process of its own as Triton's stub runs it, never in the
server: importing model.py runs the model's code, which may exit, crash or pull a framework into the server's
memory. ``python -m naiad.backends.python.autocomplete`` reads ``{"model_file", "name", "config"}`` as JSON on
stdin and prints ``{"config": ...}`` or ``{"error": ...}``.

Most models have no hook: their source says so (``defines_hook``) and nothing is run for them at all.
"""

from __future__ import annotations

import ast
import json
import signal
import subprocess
import sys
import threading
from pathlib import Path
from types import ModuleType
from typing import Any

from naiad.backends.python import pb_utils
from naiad.backends.python.runner import import_model
from naiad.core.errors import Code, InferError, internal, invalid

# CPython 3.11 keeps the AST converter's recursion depth in interpreter-wide state: two loads parsing at once on the
# load pool's threads failed with "SystemError: AST constructor recursion depth mismatch" (seen in a CI run).
_PARSING = threading.Lock()


def defines_hook(model_file: Path) -> bool:
    """Whether the model may define ``auto_complete_config``, read from its source without running it. Only a
    top-level ``class TritonPythonModel`` with no base classes and no such member surely has none; anything the
    source can't settle (a base class, a class made elsewhere, a syntax error) is asked in a process."""
    try:
        source = model_file.read_bytes()
        with _PARSING:
            tree = ast.parse(source, str(model_file))
    except (OSError, SyntaxError, ValueError):
        return True
    classes = [node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == "TritonPythonModel"]
    if len(classes) != 1 or classes[0].bases or classes[0].keywords or classes[0].decorator_list:
        return True
    for item in classes[0].body:
        if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and item.name == "auto_complete_config":
            return True
        if isinstance(item, (ast.Assign, ast.AnnAssign)) and "auto_complete_config" in ast.dump(item):
            return True
    return False


def run_isolated(python: str, env: dict[str, str], model_file: Path, name: str,
                 config: dict[str, Any]) -> dict[str, Any] | None:
    """The hook's config, run by ``python`` in a process of its own; a model that exits or crashes fails only
    its own load."""
    job = json.dumps({"model_file": str(model_file), "name": name, "config": config})
    try:
        done = subprocess.run([python, "-m", "naiad.backends.python.autocomplete"], input=job, check=False, env=env,
                              capture_output=True, text=True, cwd=str(model_file.parent), timeout=300,
                              start_new_session=True)  # as the workers: the server's signals aren't its
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise internal(f"auto_complete_config of model '{name}' could not run: {exc}") from None
    lines = done.stdout.strip().splitlines()
    try:
        answer = json.loads(lines[-1]) if done.returncode == 0 and lines else None
    except ValueError:
        answer = None
    if not isinstance(answer, dict):
        errors = [line for line in done.stderr.strip().splitlines() if line.strip()]
        raise internal(f"auto_complete_config of model '{name}' failed: "
                       f"{errors[-1] if errors else f'its process ended with exit code {done.returncode}'}")
    if "error" in answer:
        raise InferError(answer["error"][1], Code[answer["error"][0]])
    return answer["config"]


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
    for signum in (signal.SIGINT, signal.SIGTERM):  # the server decides, as for the workers (worker.py)
        signal.signal(signum, lambda *_: None)
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
