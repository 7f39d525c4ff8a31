"""Backend name -> implementation, imported lazily so optional frameworks stay optional."""

from __future__ import annotations

import importlib

from naiad.backends.base import Backend
from naiad.core.errors import invalid

_BACKENDS: dict[str, str] = {
    "python": "naiad.backends.python.backend:PythonBackend",
}
_loaded: dict[str, Backend] = {}


def get_backend(name: str) -> Backend:
    backend = _loaded.get(name)
    if backend is not None:
        return backend
    target = _BACKENDS.get(name)
    if target is None:
        raise invalid(
            f"unable to find backend library for backend '{name}', try specifying runtime on the model configuration."
        )
    module_name, _, attr = target.partition(":")
    backend = _loaded[name] = getattr(importlib.import_module(module_name), attr)()
    return backend
