"""A naiad core service as a Ray process holds one: the repositories made local (s3:// mirrored, archives
extracted), a model repository in explicit mode with nothing loaded, and SageMaker's residency over it, through
which models are loaded and unloaded one by one (the multi-model path naiad serve uses)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from naiad.frontends.sagemaker.options import SageMakerOptions
from naiad.ray.options import RayServeOptions
from naiad.repository.control import ModelControl
from naiad.repository.manager import ModelRepository, RepositoryOptions
from naiad.repository.residency import Residency
from naiad.service import Service


def local_repositories(specs: list[str]) -> list[Path]:
    """Each replica mirrors an s3:// repository itself (cached by content, so replicas on one node share it)."""
    paths = []
    for spec in specs:
        if spec.startswith("s3://") or spec.endswith((".tar.gz", ".tgz", ".tar")):
            from naiad.repository.sources import materialize_repository

            cache = Path(tempfile.gettempdir()) / f"naiad-repositories-{os.getuid()}"
            paths.append(materialize_repository(spec, cache))
        else:
            paths.append(Path(spec).resolve())
    return paths


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


def build_service(options: RayServeOptions, scratch: Path, paths: list[Path] | None = None) -> Service:
    """The service, live and accepting, with no model loaded; ``scratch`` holds the residency's model links.
    ``paths``: repositories to list in the index (the ingress's, which never loads them); without them the
    repository is an empty folder and every model comes in through the residency (a replica's)."""
    if paths is None:
        empty = scratch / "repository"
        empty.mkdir(parents=True, exist_ok=True)
        paths = [empty]
    repository = ModelRepository(RepositoryOptions(paths=paths, backend_config=backend_config(options.backend_config)))
    control = ModelControl(repository, "explicit")
    residency = Residency(repository, control, scratch / "models")
    service = Service(repository, strict_readiness=False, control=control, residency=residency)
    control.load_startup()
    service.live = service.accepting = True
    return service
