"""ModelRepository's bookkeeping of the versions a model serves."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from naiad.core.errors import InferError
from naiad.repository.manager import ModelEntry, ModelRepository, RepositoryOptions


def test_a_request_naming_no_version_gets_the_newest_as_versions_come_and_go() -> None:
    repository = ModelRepository(RepositoryOptions(paths=[]))
    entry = repository.models["m"] = ModelEntry("m", Path("m"), polled=True)
    one, two, three = (SimpleNamespace(version=v) for v in (1, 2, 3))
    for version, model in ((1, one), (3, three), (2, two)):  # (in any order: the highest number serves)
        entry.add_version(version, model)  # type: ignore[arg-type]
    assert repository.get("m") is three and entry.latest() is three
    entry.remove_version(3)
    assert repository.get("m") is two
    with pytest.raises(InferError, match="version 3 is not found"):
        repository.get("m", "3")
    entry.remove_version(1)
    assert repository.get("m") is two
    entry.clear_versions()
    assert entry.newest is None
    with pytest.raises(InferError, match="has no available versions"):
        repository.get("m")
