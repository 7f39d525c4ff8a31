"""The repository says what changed as it happens: a version loaded, one unloaded, an entry put or dropped (the
model host pushes new views to its front ends from these, instead of looking every 0.2 s)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from naiad.repository.control import ModelControl
from naiad.repository.events import CHANGE, LOAD, UNLOAD
from naiad.repository.manager import ModelRepository, RepositoryOptions
from tests.onnx_graphs import identity, write

CONFIG = """
    name: "ident"
    backend: "onnxruntime"
    max_batch_size: 0
    input [{ name: "INPUT0", data_type: TYPE_FP32, dims: [ 4 ] }]
    output [{ name: "OUTPUT0", data_type: TYPE_FP32, dims: [ 4 ] }]
"""


def test_loads_unloads_and_reloads_are_told_as_they_happen(tmp_path: Path) -> None:
    write(tmp_path, "ident", identity("TYPE_FP32", [4]), CONFIG)
    repository = ModelRepository(RepositoryOptions(paths=[tmp_path]))
    control = ModelControl(repository, "explicit")
    heard: list[tuple[str, str]] = []
    repository.events.listen(lambda kind, name: heard.append((kind, name)))

    async def run() -> None:
        await control.load("ident")
        assert (LOAD, "ident") in heard and repository.is_ready("ident")
        loaded = len(heard)
        await control.unload("ident")
        assert heard[loaded:] and all(kind in (UNLOAD, CHANGE) for kind, _ in heard[loaded:])
        assert (UNLOAD, "ident") in heard[loaded:] and not repository.is_ready("ident")
        unloaded = len(heard)
        await control.load("ident")
        assert (LOAD, "ident") in heard[unloaded:]
        await control.close()

    try:
        asyncio.run(run())
    finally:
        repository.unload_all()
    assert {name for _, name in heard} == {"ident"}


def test_nothing_is_told_of_an_entry_until_it_is_the_repositorys(tmp_path: Path) -> None:
    repository = ModelRepository(RepositoryOptions(paths=[tmp_path]))
    heard: list[tuple[str, str]] = []
    repository.events.listen(lambda kind, name: heard.append((kind, name)))
    from naiad.repository.manager import ModelEntry

    entry = ModelEntry("m", tmp_path / "m")
    entry.clear_versions()
    assert heard == []
    repository.models["m"] = entry
    del repository.models["m"]
    assert heard == [(CHANGE, "m"), (CHANGE, "m")]
