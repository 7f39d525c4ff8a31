"""A multi-model endpoint on a (simulated) GPU: device memory counts in residency. With models loaded on demand
(residency naiad owns), a model the device has no room for makes room by unloading another model on that device; a
load or an execution that fails with CUDA's out-of-memory error while other models are resident unloads the least
valuable one (the eviction policy's order) and runs once more. Models SageMaker's agent loaded (``POST /models``)
are never unloaded: its load that fails out of memory is answered 507. The dashboard's feed shows the GPU and what
each model holds there."""

from __future__ import annotations

import hashlib
import json
import tarfile
import time
from pathlib import Path

import pytest

from tests import simulated_gpus
from tests.frontends.sagemaker.test_multi_model import IDENTITY, invoke, listed, load
from tests.frontends.sagemaker.test_parallel_loads import invoke as invoke_target
from tests.models import write_model
from tests.server import RunningServer

MIB = 1 << 20
TOTAL = 1000 * MIB
BASE = 200 * MIB  # held by something else on the device


def _models(root: Path) -> None:
    for name, size, execute in (("a", 300, 0), ("b", 300, 0), ("c", 300, 0), ("d", 300, 0), ("e", 100, 250)):
        write_model(root / name, "model", simulated_gpus.gpu_config(name, size * MIB, execute * MIB),
                    simulated_gpus.GPU_MODEL_PY)


def _archives(root: Path) -> Path:
    data = root.parent / "data"
    data.mkdir(exist_ok=True)
    for folder in sorted(root.iterdir()):
        with tarfile.open(data / f"{folder.name}.tar.gz", "w:gz") as tar:
            tar.add(folder / "model", arcname=".")
    return data


def _key(name: str) -> str:
    return hashlib.md5(f"{name}.tar.gz".encode()).hexdigest()


def _on_demand(server: RunningServer, name: str, times: int = 1) -> dict:
    for _ in range(times):
        answer = invoke_target(server, f"{name}.tar.gz")
        assert answer["status"] == 200, answer
    return answer


def _resident(server: RunningServer) -> list[str]:
    names = {_key(name): name for name in "abcde"}
    return sorted(names[key] for key in listed(server))


def mme(root: Path, devices: Path, *extra: str) -> RunningServer:
    empty = root.parent / "empty"
    empty.mkdir(exist_ok=True)
    return RunningServer([empty], "--allow-sagemaker=true", "--allow-grpc=false", "--model-control-mode=explicit",
                         f"--sagemaker-models-root={root}", *extra,
                         env={"SAGEMAKER_MULTI_MODEL": "true", simulated_gpus.ENV: str(devices)})


def _settled(devices: Path, expected: int) -> int:
    """The device's used memory once it reaches ``expected`` (a worker's memory goes when it exits)."""
    deadline = time.monotonic() + 10
    while (used := simulated_gpus.used(devices)) != expected and time.monotonic() < deadline:
        time.sleep(0.05)
    return used


def _use(server: RunningServer, key: str, times: int = 3) -> None:
    for _ in range(times):
        status, body = invoke(server, key, IDENTITY)
        assert status == 200, body


@pytest.fixture()
def gpu(tmp_path: Path) -> tuple[Path, Path]:
    devices = tmp_path / "gpus.json"
    simulated_gpus.write(devices, [{"uuid": "GPU-sim-0", "name": "Simulated", "memory_total": TOTAL,
                                    "memory_used": BASE, "utilization": 0.5}])
    root = tmp_path / "models"
    _models(root)
    return devices, root


def test_device_memory_makes_room_and_out_of_memory_evicts_and_retries(gpu: tuple[Path, Path]) -> None:
    devices, root = gpu
    server = mme(root, devices, "--sagemaker-eviction-policy=lru",
                 f"--sagemaker-model-data-url={_archives(root)}")
    try:
        # c once, so its device memory is known; then gone again.
        _on_demand(server, "c")
        assert _settled(devices, BASE + 300 * MIB) == BASE + 300 * MIB
        assert server.sagemaker("DELETE", f"/models/{_key('c')}")[0] == 200
        assert _settled(devices, BASE) == BASE

        # a and b fill the device to 800 of 1000 MiB; c needs 300: a, least recently used, goes first.
        _on_demand(server, "a")
        _on_demand(server, "b")
        _on_demand(server, "a", 3)
        _on_demand(server, "b", 3)
        _on_demand(server, "c")
        assert _resident(server) == ["b", "c"]
        assert _settled(devices, BASE + 600 * MIB) == BASE + 600 * MIB
        assert "evicting 'a.tar.gz' (300.0 MiB on GPU 0, least recently used) to fit 300.0 MiB there" in server.log()

        # d was never loaded: its need is unknown (its files are tiny), so it loads, runs out of device memory in
        # initialize(), b (least recently used) is unloaded, and the second load succeeds.
        _on_demand(server, "c", 3)
        _on_demand(server, "d", 3)
        assert _resident(server) == ["c", "d"]
        assert "loading SageMaker model 'd.tar.gz' ran out of memory; loading it again after an unload" in server.log()

        # e holds 100 MiB and needs 250 more per execution: with c and d resident only 200 are free, so its first
        # execution fails with CUDA's error, c (least recently used) is unloaded and the request runs again.
        answer = _on_demand(server, "e")
        assert answer["body"]["outputs"][0]["data"] == [1.5, 2.5]
        assert _resident(server) == ["d", "e"]
        assert "ran out of memory; running the request again after an unload" in server.log()

        # The dashboard shows the GPU and what each resident model holds on it.
        status, _, page = server.request("GET", "/dashboard/feed")
        assert status == 200
        feed = json.loads(page)
        (card,) = feed["gpus"]
        assert card["uuid"] == "GPU-sim-0" and card["memory_total"] == TOTAL and card["utilization"] == 0.5
        assert card["memory_used"] == simulated_gpus.used(devices)
        held = {m["model"]: m["device"] for m in feed["mme"]["models"]}
        assert held == {"d.tar.gz": {"0": 300 * MIB}, "e.tar.gz": {"0": 100 * MIB}}
        assert feed["mme"]["evictions"] == 3
    finally:
        server.stop()


def test_out_of_memory_with_nothing_else_resident_is_answered(gpu: tuple[Path, Path]) -> None:
    devices, root = gpu
    simulated_gpus.update(devices, 0, memory_used=TOTAL - 150 * MIB)
    server = mme(root, devices)
    try:
        # Nothing to unload: the failure is the answer (507, as Triton's SageMaker server answers CUDA's words).
        status, body = load(server, "a", root / "a" / "model")
        assert status == 507 and "CUDA out of memory" in json.loads(body)["error"], body
        assert load(server, "e", root / "e" / "model") == (200, b"")
        status, body = invoke(server, "e", IDENTITY)
        assert status >= 400 and "CUDA out of memory" in body.decode(), body
        assert "running the request again" not in server.log()
        assert listed(server) == ["e"]
    finally:
        server.stop()


def test_the_agents_models_are_never_unloaded_for_device_memory(gpu: tuple[Path, Path]) -> None:
    devices, root = gpu
    server = mme(root, devices)
    try:
        # a and b fill the device to 800 of 1000 MiB: c (300) does not fit, and d runs out in initialize(). Both
        # are answered 507; a and b stay, as SageMaker's agent believes (it unloads one itself and loads again).
        assert load(server, "a", root / "a" / "model") == (200, b"")
        assert load(server, "b", root / "b" / "model") == (200, b"")
        for name in ("c", "d"):
            status, body = load(server, name, root / name / "model")
            assert status == 507 and "CUDA out of memory" in json.loads(body)["error"], body
        assert listed(server) == ["a", "b"] and "evicting" not in server.log()
        _use(server, "a")
        assert server.sagemaker("DELETE", "/models/a")[0] == 200
        assert load(server, "c", root / "c" / "model") == (200, b"")
    finally:
        server.stop()
