"""Loading a ``model.py`` and checking what its ``execute`` returns, with Triton's messages. Used both in
the worker process and by the in-process instance, so the two report the same errors."""

from __future__ import annotations

import importlib.util
import inspect
import sys
import traceback
from pathlib import Path
from types import ModuleType
from typing import Any, Callable

from naiad.backends.python import pb_utils
from naiad.core.errors import Code, InferError, internal, invalid

# pb_utils.TritonError codes, in order, as core codes.
CODES = [Code.UNKNOWN, Code.INTERNAL, Code.NOT_FOUND, Code.INVALID_ARG, Code.UNAVAILABLE, Code.UNSUPPORTED,
         Code.ALREADY_EXISTS, Code.CANCELLED]

_OWN_DIR = str(Path(__file__).resolve().parent)


def import_model(path: Path, tag: str) -> ModuleType:
    if not path.is_file():
        raise invalid(f"unable to find '{path}' for model '{tag}'")
    module_name = f"_naiad_model_{abs(hash(str(path))):x}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise invalid(f"unable to import '{path}'")
    module = importlib.util.module_from_spec(spec)
    # Models import helpers that sit beside model.py, as Triton's stub allows.
    folder = str(path.parent)
    sys.path.insert(0, folder)
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        raise invalid(f"failed to load model '{tag}' from {path}: {type(exc).__name__}: {exc}") from None
    finally:
        if sys.path and sys.path[0] == folder:
            sys.path.pop(0)
    if not hasattr(module, "TritonPythonModel"):
        raise invalid(f"{path} must define class 'TritonPythonModel' for model '{tag}'")
    return module


def describe(exc: BaseException) -> str:
    """An exception as Triton's stub reports it: type, message, then the model's frames, innermost first."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if not f.filename.startswith(_OWN_DIR)]
    where = "".join(f"  {f.filename}({f.lineno}): {f.name}\n" for f in reversed(frames))
    return f"{type(exc).__name__}: {exc}\n\nAt:\n{where}" if where else f"{type(exc).__name__}: {exc}"


def initialize(model: Any, args: dict[str, str], name: str, run: Callable[[Any], Any] | None = None) -> None:
    """Call ``initialize(args)``; an ``async def initialize`` is run to completion by ``run``."""
    init = getattr(model, "initialize", None)
    if init is None:
        return
    try:
        result = init(args)
        if inspect.isawaitable(result):
            if run is None:
                raise invalid(f"initialize() of model '{name}' must not be a coroutine in in-process mode")
            run(result)
    except InferError:
        raise
    except Exception as exc:
        raise internal(describe(exc)) from None


class ExecutionFailed(Exception):
    """Raised from ``execute`` by naiad's own framework adapter (backends/isolated): the execution failed with
    exactly ``error``, the framework's failure in Triton's words, not wrapped as a model.py's exception is."""

    def __init__(self, error: InferError) -> None:
        super().__init__(error.message)
        self.error = error


def execute_failed(instance: str, exc: BaseException) -> InferError:
    if isinstance(exc, ExecutionFailed):
        return exc.error
    return internal(f"Failed to process the request(s) for model '{instance}', message: {describe(exc)}")


def check_result(result: Any, count: int, instance: str) -> list[Any]:
    """``execute``'s return value as one item per request: a ``pb_utils.InferenceResponse`` or an ``InferError``."""
    if not isinstance(result, list):
        error = internal(
            f"Failed to process the request(s) for model '{instance}', message: Expected a list in the execute "
            f"return, found type '{type(result)}'."
        )
        return [error] * count
    if len(result) != count:
        error = internal(
            f"Failed to process the request(s) for model '{instance}', message: Number of InferenceResponse "
            f"objects do not match the number of InferenceRequest objects. InferenceRequest(s) size is:"
            f"{count}, and InferenceResponse(s) size is:{len(result)}\n"
        )
        return [error] * count
    return [check_response(r, instance) for r in result]


def check_response(response: Any, instance: str) -> Any:
    if not isinstance(response, pb_utils.InferenceResponse):
        return internal(
            f"Failed to process the request(s) for model '{instance}', message: Expected an InferenceResponse "
            f"object in the execute function return list, found type '{type(response)}'."
        )
    error = response._error
    if error is not None:
        code = CODES[error.code()] if 0 <= error.code() < len(CODES) else Code.INTERNAL
        return InferError(error.message(), code)
    return response
