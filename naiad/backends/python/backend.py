"""Runs ``TritonPythonModel`` classes. In this build each instance runs inside the server process;
the worker-process transport replaces ``PythonInstance`` behind the same seam.
"""

from __future__ import annotations

import importlib.util
import inspect
import sys
import time
import traceback
from pathlib import Path
from types import ModuleType
from typing import Any, Awaitable

from naiad.backends.base import Backend, Execution, ExecuteResult, Instance, LoadedVersion, VersionContext
from naiad.backends.python import pb_utils
from naiad.config import ModelConfig, pb
from naiad.config.render import config_to_dict, dict_to_config
from naiad.core.errors import Code, InferError, internal, invalid
from naiad.core.request import InferRequest, InferResponse

# pb_utils.TritonError codes, in order, as core codes.
_CODES = [Code.UNKNOWN, Code.INTERNAL, Code.NOT_FOUND, Code.INVALID_ARG, Code.UNAVAILABLE, Code.UNSUPPORTED,
          Code.ALREADY_EXISTS, Code.CANCELLED]
_KIND_NAMES = {pb.ModelInstanceGroup.KIND_CPU: "CPU", pb.ModelInstanceGroup.KIND_GPU: "GPU",
               pb.ModelInstanceGroup.KIND_MODEL: "MODEL", pb.ModelInstanceGroup.KIND_AUTO: "AUTO"}


def _model_file(config: ModelConfig, version_dir: Path) -> Path:
    return version_dir / (config.default_model_filename or "model.py")


def _import_model(path: Path, tag: str) -> ModuleType:
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


def _describe(exc: BaseException) -> str:
    """An exception as Triton's stub reports it: type, message, then the model's frames, innermost first."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if not f.filename.startswith(_OWN_DIR)]
    where = "".join(f"  {f.filename}({f.lineno}): {f.name}\n" for f in reversed(frames))
    return f"{type(exc).__name__}: {exc}\n\nAt:\n{where}" if where else f"{type(exc).__name__}: {exc}"


_OWN_DIR = str(Path(__file__).resolve().parent)


class PythonBackend(Backend):
    name = "python"

    def auto_complete(self, config: ModelConfig, model_dir: Path, version_dirs: list[Path]) -> ModelConfig:
        # Triton asks the newest version's model.py.
        candidates = [d for d in version_dirs if _model_file(config, d).is_file()]
        if not candidates:
            return config
        module = _import_model(_model_file(config, candidates[-1]), config.name)
        hook = getattr(module.TritonPythonModel, "auto_complete_config", None)
        if hook is None:
            return config
        helper = pb_utils.ModelConfig(config_to_dict(config))
        try:
            result = hook(helper)
        except Exception as exc:
            raise invalid(f"auto_complete_config failed for model '{config.name}': {exc}") from None
        if not isinstance(result, pb_utils.ModelConfig):
            raise invalid(
                f"auto_complete_config function in model '{config.name}' must return a valid pb.ModelConfig object."
            )
        try:
            return dict_to_config(result.as_dict())
        except Exception as exc:
            raise invalid(f"auto_complete_config of model '{config.name}' returned an invalid config: {exc}") from None

    def load(self, ctx: VersionContext) -> LoadedVersion:
        module = _import_model(_model_file(ctx.config, ctx.version_dir), ctx.name)
        return PythonVersion(ctx, module)


class PythonVersion(LoadedVersion):
    def __init__(self, ctx: VersionContext, module: ModuleType) -> None:
        self.instances = []
        try:
            for group in ctx.config.instance_group:
                for index in range(group.count):
                    device = group.gpus[index % len(group.gpus)] if group.gpus else 0
                    args = {
                        "model_config": ctx.config_json,
                        "model_instance_kind": _KIND_NAMES.get(group.kind, "CPU"),
                        "model_instance_name": f"{group.name}_{index}",
                        "model_instance_device_id": str(device),
                        "model_repository": str(ctx.model_dir),
                        "model_version": str(ctx.version),
                        "model_name": ctx.name,
                    }
                    self.instances.append(PythonInstance(ctx, module.TritonPythonModel(), args))
        except BaseException:
            self.unload()
            raise


class PythonInstance(Instance):
    def __init__(self, ctx: VersionContext, model: Any, args: dict[str, str]) -> None:
        self.name = args["model_instance_name"]
        self.model_name = ctx.name
        self.version = ctx.version
        self.version_str = str(ctx.version)
        self.output_names = [o.name for o in ctx.config.output]
        self.model = model
        init = getattr(model, "initialize", None)
        if init is not None:
            try:
                result = init(args)
                if inspect.isawaitable(result):
                    raise invalid(f"initialize() of model '{ctx.name}' must not be a coroutine in this build")
            except InferError:
                raise
            except Exception as exc:
                raise internal(_describe(exc)) from None
        self._execute = model.execute

    def execute(self, requests: list[InferRequest]) -> ExecuteResult:
        t0 = time.perf_counter_ns()
        from_core = pb_utils.InferenceRequest._from_core
        pb_requests = [
            from_core(self.model_name, self.version, r, r.requested_outputs or self.output_names) for r in requests
        ]
        t1 = time.perf_counter_ns()
        try:
            result = self._execute(pb_requests)
        except Exception as exc:
            return self._failed(requests, exc, t1 - t0, time.perf_counter_ns() - t1)
        if inspect.isawaitable(result):
            return self._finish_async(result, requests, t0, t1)
        t2 = time.perf_counter_ns()
        responses = self._convert(result, requests)
        return Execution(responses, t1 - t0, t2 - t1, time.perf_counter_ns() - t2)

    async def _finish_async(self, pending: Awaitable[Any], requests: list[InferRequest], t0: int, t1: int) -> Execution:
        try:
            result = await pending
        except Exception as exc:
            return self._failed(requests, exc, t1 - t0, time.perf_counter_ns() - t1)
        t2 = time.perf_counter_ns()
        responses = self._convert(result, requests)
        return Execution(responses, t1 - t0, t2 - t1, time.perf_counter_ns() - t2)

    def _failed(self, requests: list[InferRequest], exc: BaseException, input_ns: int, infer_ns: int) -> Execution:
        error = internal(
            f"Failed to process the request(s) for model '{self.name}', message: {_describe(exc)}"
        )
        return Execution([self._error_response(r, error) for r in requests], input_ns, infer_ns, 0, failed=True)

    def _error_response(self, request: InferRequest, error: InferError) -> InferResponse:
        return InferResponse(self.model_name, self.version_str, request.id, error=error)

    def _convert(self, result: Any, requests: list[InferRequest]) -> list[InferResponse]:
        if not isinstance(result, list):
            error = internal(
                f"Failed to process the request(s) for model '{self.name}', message: Expected a list in the execute "
                f"return, found type '{type(result)}'."
            )
            return [self._error_response(r, error) for r in requests]
        if len(result) != len(requests):
            error = internal(
                f"Failed to process the request(s) for model '{self.name}', message: Number of InferenceResponse "
                f"objects do not match the number of InferenceRequest objects. InferenceRequest(s) size is:"
                f"{len(requests)}, and InferenceResponse(s) size is:{len(result)}\n"
            )
            return [self._error_response(r, error) for r in requests]
        return [self._convert_one(resp, req) for resp, req in zip(result, requests)]

    def _convert_one(self, response: Any, request: InferRequest) -> InferResponse:
        if not isinstance(response, pb_utils.InferenceResponse):
            return self._error_response(request, internal(
                f"Failed to process the request(s) for model '{self.name}', message: Expected an InferenceResponse "
                f"object in the execute function return list, found type '{type(response)}'."
            ))
        error = response._error
        if error is not None:
            code = _CODES[error.code()] if 0 <= error.code() < len(_CODES) else Code.INTERNAL
            return self._error_response(request, InferError(error.message(), code))
        outputs = {t._name: t._array for t in response._output_tensors}
        return InferResponse(self.model_name, self.version_str, request.id, outputs, response._parameters)

    def finalize(self) -> None:
        fin = getattr(self.model, "finalize", None)
        if fin is not None:
            fin()
