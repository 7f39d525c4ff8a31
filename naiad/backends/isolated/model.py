"""What a framework instance's worker process runs in place of a model.py: it builds the framework's own
instance (the same code that runs on a thread in the server: ``naiad.backends.threaded``) for this one instance,
and runs each execution's requests through it, as one batch where the model batches.

The worker imports this file as it imports a model.py; ``initialize`` gets Triton's args plus the setup the
server put under ``SETUP_ARG`` (version.py): the framework's name, its ``--backend-config`` settings and the
version's folder.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from naiad.backends.base import VersionContext
from naiad.backends.isolated import SETUP_ARG, SWITCH
from naiad.backends.python import pb_utils
from naiad.backends.python.runner import CODES, ExecutionFailed
from naiad.backends.registry import get_backend
from naiad.config import ModelConfig
from naiad.config.render import dict_to_config
from naiad.core.errors import internal
from naiad.core.request import InferRequest

_Response, _TritonError, _wrap = pb_utils.InferenceResponse, pb_utils.TritonError, pb_utils.Tensor._wrap
_new = object.__new__


def one_instance(config: ModelConfig, instance: str, device: int) -> ModelConfig:
    """``config`` with the instance group of ``instance`` ("<group>_<index>") alone, once, on ``device``."""
    for group in config.instance_group:
        prefix = f"{group.name}_"
        if instance.startswith(prefix) and instance[len(prefix):].isdigit():
            only = ModelConfig()
            only.CopyFrom(config)
            del only.instance_group[:]
            chosen = only.instance_group.add()
            chosen.CopyFrom(group)
            chosen.count = 1
            if group.gpus:
                del chosen.gpus[:]
                chosen.gpus.append(device)
            return only
    raise internal(f"model '{config.name}' has no instance group for instance '{instance}'")


class TritonPythonModel:
    def initialize(self, args: dict[str, str]) -> None:
        setup = json.loads(args[SETUP_ARG])
        config = dict_to_config(json.loads(args["model_config"]))
        name = args["model_instance_name"]
        self.model_name = args["model_name"]
        self.version = args["model_version"]
        self.batching = config.max_batch_size > 0
        only = one_instance(config, name, int(args.get("model_instance_device_id") or 0))
        # This process runs the instance itself: the framework must not send it to a process of its own again.
        options = {**setup["options"], SWITCH: "false"}
        ctx = VersionContext(self.model_name, int(self.version), only, args["model_config"],
                             Path(args["model_repository"]), Path(setup["version_dir"]), options)
        self.loaded = get_backend(setup["backend"]).load(ctx)
        instance: Any = self.loaded.instances[0]
        instance.name = name
        # The instance's own synchronous entry: this process has nothing else to do while it computes.
        self._run = instance._execute

    def execute(self, requests: list) -> list:
        model, version, batching = self.model_name, self.version, self.batching
        batch = []
        for request in requests:
            inputs = {t._name: t._array for t in request._inputs}
            ours = InferRequest(model, version, request._request_id, inputs)
            if batching and inputs:
                ours.batch_size = next(iter(inputs.values())).shape[0]
            batch.append(ours)
        execution = self._run(batch)
        responses = execution.responses
        if execution.failed:
            errors = [r.error for r in responses]
            first = errors[0]
            if first is not None and all(e is not None and e.message == first.message for e in errors):
                raise ExecutionFailed(first)  # counted as a failed execution, in the framework's own words
        out = []
        for response in responses:
            answer = _new(_Response)
            error = response.error
            if error is None:
                answer._output_tensors = [_wrap(n, a) for n, a in response.outputs.items()]
                answer._error = None
            else:
                answer._output_tensors = []
                answer._error = _TritonError(error.message, CODES.index(error.code) if error.code in CODES else 1)
            answer._parameters = {}
            out.append(answer)
        return out

    def finalize(self) -> None:
        self.loaded.unload()
