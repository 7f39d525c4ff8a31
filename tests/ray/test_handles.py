"""The ingress's handles (naiad.ray.handles): kept per model of the repositories, for the most recently used
names only; a name no repository has is sent on without a model id and leaves nothing behind. Ray's handle is
stood in for by one that answers which model id and method a call went with (no Ray needed)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from naiad.ray.handles import CALL, Handles
from naiad.ray.ingress import Ingress
from naiad.ray.options import RayServeOptions
from naiad.ray.rpc import RPC
from tests.ray.test_routing import copies


class RayHandle:
    """What the ingress uses of a DeploymentHandle: ``options`` (a changed copy) and an awaitable ``remote``."""

    def __init__(self, **settings: Any) -> None:
        self.settings = settings

    def options(self, **settings: Any) -> RayHandle:
        return RayHandle(**{**self.settings, **settings})

    async def remote(self, *args: Any) -> tuple[str | None, str, tuple]:
        return self.settings.get("multiplexed_model_id"), self.settings.get("method_name", CALL), args


def test_least_recently_used_names_are_dropped() -> None:
    handles = Handles(limit=3)
    for name in ("a", "b", "c"):
        handles.add(name, RayHandle(multiplexed_model_id=name), CALL)
    assert handles.get("a", CALL).settings == {"multiplexed_model_id": "a"}  # "a" is now the most recent
    rpc = handles.get("b", RPC)
    assert rpc.settings == {"multiplexed_model_id": "b", "method_name": RPC, "stream": False}
    assert handles.get("b", RPC) is rpc  # made once
    handles.add("d", RayHandle(multiplexed_model_id="d"), CALL)
    assert list(handles.names) == ["a", "b", "d"]  # "c", the least recently used, went
    assert handles.get("c", CALL) is None and len(handles) == 3


def test_unknown_names_are_answered_without_a_handle(tmp_path: Path) -> None:
    repository = copies(tmp_path / "repo", ["m0", "m1", "m2"])
    (repository / "a_file").write_text("not a model")
    (repository / ".hidden").mkdir()
    ingress = Ingress(RayHandle(), RayServeOptions(model_repositories=[str(repository)]))
    ingress.handles.limit = 2

    async def calls() -> list[Any]:
        answers = []
        for name in [f"probe-{i}" for i in range(200)] + ["a_file", ".hidden", "..", "m0/1", ""]:
            answers.append(await ingress.reach(name, CALL, (name,)))
            answers.append(await ingress.reach(name, RPC, (name,)))
        for name in ("m0", "m1", "m0", "m2"):
            answers.append(await ingress.reach(name, RPC, (name,)))
        return answers

    answers = asyncio.run(calls())
    unknown, known = answers[:-4], answers[-4:]
    # Sent on as a request naming no model (the replica's routers answer it as naiad serve does), through the
    # same two handles each time; nothing kept.
    assert all(model_id is None for model_id, _, _ in unknown)
    assert [method for _, method, _ in unknown[:2]] == [CALL, RPC]
    assert [model_id for model_id, _, _ in known] == ["m0", "m1", "m0", "m2"]
    assert ingress.cached_models() == ["m0", "m2"]  # at most `limit`, the least recently used (m1) dropped
    assert not ingress.first
