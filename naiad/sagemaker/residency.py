"""SageMaker's multi-model contract over the model cache, and the platform's part around it.

Triton's part: a model is loaded from a folder under the models root (``<root>/<key>/model``) under a key
SageMaker chose (``model_name``), served under the target model's name, listed, and unloaded with its
repository (the url rules: ``urls.py``). The platform's part, which naiad does in the server: archives fetched
on demand from the model data url into ``<root>/<hash of the target>/model``, and models unloaded before a load
that would not fit the memory limit (the generic part: ``naiad.repository.model_cache``).

Who owns residency: SageMaker's agent, for what it loads through ``POST /models`` (it unloads and retries on a
507): naiad never unloads those, and their loads unload nothing. naiad, for what it loads on demand: under
--model-memory-limit an archive whose members already take more than the room there is (or a model measured so
at an earlier load) is refused before it is extracted (or downloaded), and before anything is evicted for it.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from functools import partial
from pathlib import Path
from typing import Callable

from naiad.core.errors import Code, InferError, not_found
from naiad.repository.control import ModelControl
from naiad.repository.eviction import EvictionPolicy
from naiad.repository.manager import ModelRepository
from naiad.repository.memory import format_size
from naiad.repository.model_cache import ModelCache, Resident, log
from naiad.sagemaker.contract import ArchiveError, model_key
from naiad.sagemaker.counters import EndpointStats
from naiad.sagemaker.urls import locate

__all__ = ["Fetch", "Residency", "Resident"]

Fetch = Callable[[str, Path], int]  # (relative archive path, destination file) -> bytes fetched


class Residency(ModelCache):
    kind = "SageMaker model"
    step_error = ArchiveError
    stats: EndpointStats

    def __init__(self, repository: ModelRepository, control: ModelControl, models_root: Path,
                 memory_limit: int | None = None, fetch: Fetch | None = None, source_url: str = "",
                 archive_limits: tuple[int, int] | None = None, policy: EvictionPolicy | None = None) -> None:
        super().__init__(repository, control, memory_limit, policy, EndpointStats())
        self.models_root = Path(os.path.abspath(models_root))
        self.fetch = fetch
        self.source_url = source_url
        self.archive_limits = archive_limits  # (bytes, members) an archive may hold; None: archive.py's defaults
        # Folders outside the models root that links in it may lead to (Ray's replicas link repository folders).
        self.link_roots: list[Path] = []
        # What a target that is neither loaded nor fetchable lacks, as the server that holds it sees it (Ray's
        # replicas load from their model repositories, not a model data url).
        self.missing = "no model data url is set (--sagemaker-model-data-url)"

    # --- Triton's multi-model API ------------------------------------------------------------------------------

    def locate(self, url: str, target: str = "") -> tuple[Path, str]:
        """The repository to register for ``url`` and the folder in it that becomes the target model."""
        return locate(url, target, self.models_root, self.link_roots)

    async def load(self, key: str, url: str, target: str, folder: Path | None = None) -> Resident:
        """Register ``url``'s repository under ``key`` and load ``target`` from it, making room first."""
        async with self._slots:
            return await self._load(key, url, target, folder, pinned=True)

    async def _load(self, key: str, url: str, target: str, folder: Path | None, fetched: float = 0.0,
                    pinned: bool = False) -> Resident:
        repository, model_folder = self.locate(url, target)
        return await self._admit(key, repository, model_folder, target, folder, fetched, pinned)

    def find(self, name: str) -> Resident | None:
        """The model loaded under the key ``name``, else the one a client knows as ``name``: the key an on-demand
        load filed it under (the hash of its name), or the target model it serves as."""
        return self.get(name) or self.get(model_key(name)) or self._by_name.get(name)

    # --- the platform's part: on-demand loading ----------------------------------------------------------------

    async def _miss(self, target: str) -> None:
        """Fetch ``target`` (an archive's path relative to the model data url), extract it and load it."""
        if self.fetch is None:
            raise not_found(f"model '{target}' is not loaded and {self.missing}")
        from naiad.repository.archive import archive_size, extract_archive  # only on-demand loading needs tarfile

        key = model_key(target)
        if key in self.models:  # loaded under its key, but not ready (e.g. a worker restarting)
            raise InferError(f"model '{target}' is not ready", Code.UNAVAILABLE)
        self.check_fits(target, 0)  # measured at an earlier load: refused before the download
        async with self._slots:
            self.models_root.mkdir(parents=True, exist_ok=True)
            handle, name = tempfile.mkstemp(prefix=".download-", suffix=".tar.gz", dir=self.models_root)
            os.close(handle)
            archive = Path(name)
            try:
                started = time.perf_counter()
                size = await self._off_loop(f"download of '{target}'", partial(self.fetch, target, archive),
                                            partial(archive.unlink, missing_ok=True))
                fetched = time.perf_counter() - started
                if self.memory_limit is not None:  # its members' sizes, from the member list: before extraction
                    members = await self._off_loop(f"member list of '{target}'",
                                                   partial(archive_size, archive, *(self.archive_limits or ()),
                                                           label=target), lambda: None)
                    self.check_fits(target, members or 0)
                leaving = self._leaving.get(key)
                if leaving is not None:  # an eviction of this very key may still be removing its folder
                    await leaving[0].wait()
                folder = self.models_root / key
                if folder.exists():
                    shutil.rmtree(folder, ignore_errors=True)
                try:
                    extracting = time.perf_counter()
                    await self._off_loop(f"extraction of '{target}'",
                                         partial(extract_archive, archive, folder / "model",
                                                 *(self.archive_limits or ()), label=target),
                                         partial(shutil.rmtree, folder, ignore_errors=True), key)
                    self.stats.downloading.add(fetched + time.perf_counter() - extracting)
                    log.info("fetched '%s' (%s) into %s", target, format_size(size or 0), folder)
                    await self._load(key, str(folder / "model"), target, folder,
                                     fetched + time.perf_counter() - extracting)
                except BaseException:
                    if key not in self.models and key not in self._leaving:
                        shutil.rmtree(folder, ignore_errors=True)
                    raise
            finally:
                archive.unlink(missing_ok=True)
