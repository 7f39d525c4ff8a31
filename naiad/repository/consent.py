"""Consent for code from the network, and the rule that keeps a model's file inside its version folder.

A load request (HTTP / gRPC repository extension) may carry what the server then runs as its own user: model
files (``file:<version>/<name>`` parameters), or a config override whose ``default_model_filename`` or python
``EXECUTION_ENV_PATH`` names another file or interpreter. Triton runs it for any client in explicit mode. naiad
runs it only with the operator's consent, given per front end: ``model-repository`` restricted with a key on that
front end, or ``--allow-model-code-upload`` for all. Loading a model from the server's own repository by name, or
with an override that keeps the model's own file and environment, needs no consent.
"""

from __future__ import annotations

from pathlib import Path, PurePosixPath

from naiad.config import ModelConfig
from naiad.config.normalize import DEFAULT_FILENAMES
from naiad.core.errors import InferError, invalid

FLAG = "--allow-model-code-upload"
ENV_PARAMETER = "EXECUTION_ENV_PATH"  # the python backend's (backends/python/environment.py)


class CodeConsent:
    """What one front end may load: ``keyed`` when its restricted-API rules cover model-repository; ``restrict``
    names its restriction flag, for the refusal's advice."""

    __slots__ = ("keyed", "restrict")

    def __init__(self, keyed: bool, restrict: str) -> None:
        self.keyed = keyed
        self.restrict = restrict


def code_in(override: ModelConfig | None, files: dict[str, bytes] | None, own: list[ModelConfig]) -> str | None:
    """What in a load request would run as code the operator did not put there (None: nothing). ``own``: the
    model's configs as the operator gave them (its config.pbtxt, the config it serves with), whose file name and
    environment an override may repeat, as a client does that reads ``/config``, edits it and loads it back."""
    if files:
        return "model files (file: parameters)"
    if override is None:
        return None
    name = override.default_model_filename
    if name and name not in DEFAULT_FILENAMES.values() and all(name != c.default_model_filename for c in own):
        return f"default_model_filename '{name}'"
    if ENV_PARAMETER in override.parameters:
        path = override.parameters[ENV_PARAMETER].string_value
        if path and all(ENV_PARAMETER not in c.parameters or c.parameters[ENV_PARAMETER].string_value != path
                        for c in own):
            return f"{ENV_PARAMETER} '{path}'"
    return None


def refusal(what: str, consent: CodeConsent) -> InferError:
    return invalid(
        f"load request refused: its {what} would run code from the network as the server's user. To allow it, "
        f"restrict model-repository with a key ({consent.restrict}=model-repository:<key>=<value>) or start the "
        f"server with {FLAG}")


def startup_warning(unkeyed: list[str]) -> str:
    """The warning for explicit mode where front ends in ``unkeyed`` (e.g. ["HTTP"]) have no consent."""
    return (f"explicit model control: {' and '.join(unkeyed)} clients may load models by name, but not upload model "
            f"code (file: parameters, or a config override setting default_model_filename or {ENV_PARAMETER}). "
            f"To allow it, restrict model-repository with a key (--http-restricted-api / --grpc-restricted-protocol "
            f"model-repository:<key>=<value>) or pass {FLAG}")


def check_model_file(config: ModelConfig, version_dirs: list[Path]) -> None:
    """The model file (``default_model_filename``) names a file inside the version folder: no absolute path, no
    '..'. Raises ``InferError``. Symbolic links the operator put in the repository are followed, as Triton does
    (shared weight stores and Kubernetes volume mounts are made of them); no client can create one."""
    name = config.default_model_filename
    if not name:
        return
    path = PurePosixPath(name)
    if path.is_absolute() or ".." in path.parts or "\\" in name or "\0" in name:
        raise invalid(f"default_model_filename '{name}' of model '{config.name}' must name a file inside the version "
                      "folder (no absolute path, no '..')")
