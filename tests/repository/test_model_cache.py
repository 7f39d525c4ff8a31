"""The generic model cache without SageMaker: a miss loads a model from a folder of its own, concurrent misses
share that load, and an unload leaves the repository as it was (through its register / unregister)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from naiad.core.errors import Code, InferError
from naiad.repository.control import ModelControl
from naiad.repository.manager import ModelRepository, RepositoryOptions
from naiad.repository.model_cache import ModelCache
from naiad.service import Service
from tests.models import IDENTITY_FP32, IDENTITY_PY, write_model


class FolderCache(ModelCache):
    """Each model in ``root/<name>/model``, registered as the repository ``root/<name>`` when first asked for."""

    def __init__(self, root: Path, repository: ModelRepository, control: ModelControl) -> None:
        super().__init__(repository, control)
        self.root = root
        self.misses: list[str] = []

    async def _miss(self, target: str) -> None:
        self.misses.append(target)
        if not (self.root / target).is_dir():
            await super()._miss(target)
        async with self._slots:
            await self._admit(target, self.root / target, "model", target, None)


def _cache(tmp_path: Path) -> tuple[FolderCache, ModelRepository]:
    empty = tmp_path / "repository"
    empty.mkdir()
    for name in ("one", "two"):
        write_model(tmp_path / "models" / name, "model", IDENTITY_FP32.format(name=name), IDENTITY_PY)
    repository = ModelRepository(RepositoryOptions(paths=[empty], backend_config={"python": {"in-process": "true"}}))
    control = ModelControl(repository, "explicit")
    service = Service(repository, strict_readiness=False, control=control)
    control.load_startup()
    service.live = service.accepting = True
    return FolderCache(tmp_path / "models", repository, control), repository


def test_misses_share_a_load_and_an_unload_unregisters(tmp_path: Path) -> None:
    async def run() -> None:
        cache, repository = _cache(tmp_path)
        await asyncio.gather(cache.ensure("one"), cache.ensure("one"), cache.ensure("two"))
        assert sorted(cache.misses) == ["one", "two"]  # the second miss on "one" waited on the first's load
        assert (cache.stats.cache_misses, cache.stats.loading.count) == (3, 2)
        assert repository.is_ready("one") and repository.is_ready("two")
        assert repository.served_from(tmp_path / "models" / "one") == ["one"]
        await cache.ensure("one")
        assert cache.stats.cache_hits == 1 and len(cache.misses) == 2

        await cache.unload("one")
        assert tmp_path / "models" / "one" not in repository.registered
        assert "one" not in repository.models and "one" not in [r.target for r in cache.listed()]
        assert repository.is_ready("two")
        await cache.ensure("one")  # registered again: nothing of the first registration is left in the way
        assert repository.is_ready("one") and cache.misses == ["one", "two", "one"]

        with pytest.raises(InferError) as missing:
            await cache.ensure("three")
        assert missing.value.code == Code.NOT_FOUND
        for key in list(cache.models):
            await cache.unload(key)
        assert repository.registered == {} and repository.models == {}

    asyncio.run(run())
