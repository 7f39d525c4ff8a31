"""Backend name -> implementation, imported lazily so optional frameworks stay optional."""

from __future__ import annotations

import importlib
from pathlib import Path

from naiad.backends.base import Backend
from naiad.core.errors import invalid, unavailable

_BACKENDS: dict[str, str] = {
    "python": "naiad.backends.python.backend:PythonBackend",
    "onnxruntime": "naiad.backends.onnxruntime.backend:OnnxBackend",
    "pytorch": "naiad.backends.pytorch.backend:TorchBackend",
    "tensorrt": "naiad.backends.tensorrt.backend:TensorRTBackend",
    "identity": "naiad.backends.identity:IdentityBackend",  # Triton's test backend: a simulated accelerator
}
# The pyproject extra that brings each optional framework.
_EXTRAS = {"pytorch": "torch", "onnxruntime": "onnxruntime"}
_loaded: dict[str, Backend] = {}
# --backend-directory: a Python-based backend is <directory>/<name>/model.py, run by the Python backend for every
# model that names it (Triton's python_backend "Python-based backends").
_directory = Path("/opt/tritonserver/backends")


def set_backend_directory(path: str | Path) -> None:
    global _directory
    _directory = Path(path)


def python_based(name: str) -> Path | None:
    """The model.py of the Python-based backend ``name``, if there is one (never for naiad's own backends)."""
    if not name or name in _BACKENDS or name == "ensemble" or "/" in name or name.startswith("."):
        return None
    path = _directory / name / "model.py"
    return path if path.is_file() else None


def get_backend(name: str) -> Backend:
    backend = _loaded.get(name)
    if backend is not None:
        return backend
    target = _BACKENDS.get(name)
    if target is None and python_based(name) is not None:
        return get_backend("python")
    if target is None:
        raise invalid(
            f"unable to find backend library for backend '{name}', try specifying runtime on the model configuration."
        )
    module_name, _, attr = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        # An optional framework that isn't installed fails the models that need it, not the server.
        raise unavailable(
            f"unable to load backend '{name}': {exc}; install it (pip install 'naiad[{_EXTRAS.get(name, name)}]')"
        ) from None
    backend = _loaded[name] = getattr(module, attr)()
    return backend
