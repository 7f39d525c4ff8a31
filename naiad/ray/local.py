"""A naiad core service as a Ray process holds one, from Ray's options (``naiad.service.assemble`` builds it)."""

from __future__ import annotations

from pathlib import Path

from naiad.sagemaker.options import SageMakerOptions
from naiad.ray.options import RayServeOptions
from naiad.service import Service
from naiad.service.assemble import explicit_service, local_repositories

__all__ = ["backend_config", "build_service", "local_repositories", "sagemaker_options"]


def backend_config(values: list[str]) -> dict[str, dict[str, str]]:
    """``python,shm-default-byte-size=1048576`` -> {"python": {...}}, as naiad serve reads --backend-config."""
    parsed: dict[str, dict[str, str]] = {}
    for value in values:
        backend, _, setting = value.partition(",")
        if not setting:
            backend, setting = "", value
        key, sep, val = setting.partition("=")
        if not sep:
            raise ValueError(f"--backend-config expects <backend>,<setting>=<value>, got '{value}'")
        parsed.setdefault(backend, {})[key] = val
    return parsed


def sagemaker_options(options: RayServeOptions, models_root: Path) -> SageMakerOptions:
    """A multi-model endpoint: TargetModel names a repository model (the ingress supplies the default model's
    name when a request names none)."""
    return SageMakerOptions(enabled=True, models_root=models_root, multi_model=True,
                            default_model=options.default_model or SageMakerOptions.default_model)


def build_service(options: RayServeOptions, scratch: Path, paths: list[Path] | None = None,
                  link_roots: list[Path] | None = None) -> Service:
    """The service, live and accepting, with no model loaded (see ``naiad.service.assemble``)."""
    missing = ("no model of that name is in the model repository (--model-repository "
               f"{' '.join(options.model_repositories)})")
    return explicit_service(scratch, backend_config(options.backend_config), paths, link_roots, missing)
