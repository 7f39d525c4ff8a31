"""A service built without ``naiad serve``, as each Ray process holds one: the repositories made local (s3://
mirrored, archives extracted), a model repository in explicit mode with nothing loaded, and SageMaker's
residency over it, through which models are loaded and unloaded one by one (the multi-model path naiad serve
uses). Here, under the face, so that Ray's front ends need nothing from the repository."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from naiad.repository.control import ModelControl
from naiad.repository.layout import model_dir
from naiad.repository.manager import ModelRepository, RepositoryOptions
from naiad.sagemaker.residency import Residency
from naiad.service.face import Service


def local_repositories(specs: list[str]) -> list[Path]:
    """Each replica mirrors an s3:// repository itself (cached by content, so replicas on one node share it)."""
    paths = []
    for spec in specs:
        if spec.startswith("s3://") or spec.endswith((".tar.gz", ".tgz", ".tar")):
            from naiad.repository.sources import materialize_repository  # boto3 only when it is needed

            cache = Path(tempfile.gettempdir()) / f"naiad-repositories-{os.getuid()}"
            paths.append(materialize_repository(spec, cache))
        else:
            paths.append(Path(spec).resolve())
    return paths


def find_model(repositories: list[Path], name: str) -> Path | None:
    """The folder of model ``name`` in the first repository that has one."""
    for repository in repositories:
        folder = model_dir(repository, name)
        if folder is not None:
            return folder
    return None


def explicit_service(scratch: Path, backend_config: dict[str, dict[str, str]], paths: list[Path] | None = None,
                     link_roots: list[Path] | None = None, missing: str = "") -> Service:
    """The service, live and accepting, with no model loaded; ``scratch`` holds the residency's model links.
    ``paths``: repositories to list in the index (the ingress's, which never loads them); without them the
    repository is an empty folder and every model comes in through the residency (a replica's), whose links
    may lead into ``link_roots``. ``missing``: what an unknown target model lacks, said in its error."""
    if paths is None:
        empty = scratch / "repository"
        empty.mkdir(parents=True, exist_ok=True)
        paths = [empty]
    repository = ModelRepository(RepositoryOptions(paths=paths, backend_config=backend_config))
    control = ModelControl(repository, "explicit")
    residency = Residency(repository, control, scratch / "models")
    residency.link_roots = list(link_roots or [])
    if missing:
        residency.missing = missing
    service = Service(repository, strict_readiness=False, control=control, residency=residency)
    control.load_startup()
    service.live = service.accepting = True
    return service
