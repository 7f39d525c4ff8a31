"""SageMaker multi-model loads as an attacker with a foothold in the models root (or an upload) would try them: a
symbolic link out of the models root is never followed, and an archive of 150k members is refused in a moment,
before it is extracted, while the endpoint keeps serving."""

from __future__ import annotations

import io
import json
import shutil
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.models import IDENTITY_FP32, IDENTITY_PY, write_model
from tests.server import RunningServer

TARGET = "X-Amzn-SageMaker-Target-Model"
IDENTITY = {"inputs": [{"name": "INPUT0", "shape": [2], "datatype": "FP32", "data": [1.5, 2.5]}]}


@pytest.fixture(scope="module")
def layout(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("paths")
    root = base / "models"
    outside = base / "outside"
    secret = write_model(outside / "key", "model", IDENTITY_FP32.format(name="linked"), IDENTITY_PY)
    write_model(root / "inside", "model", IDENTITY_FP32.format(name="inside"), IDENTITY_PY)
    # The key's folder itself leads out.
    (root / "linked").symlink_to(outside / "key", target_is_directory=True)
    # A model folder inside whose code file leads out.
    write_model(root / "filelink", "model", IDENTITY_FP32.format(name="filelink"), IDENTITY_PY)
    code = root / "filelink" / "model" / "1" / "model.py"
    code.unlink()
    code.symlink_to(secret / "1" / "model.py")
    # A version folder that leads out.
    version = write_model(root / "dirlink", "model", IDENTITY_FP32.format(name="dirlink"), IDENTITY_PY)
    shutil.rmtree(version / "1")
    (version / "1").symlink_to(secret / "1", target_is_directory=True)
    # A link that stays inside the models root is fine.
    write_model(root / "samedir", "model", IDENTITY_FP32.format(name="samedir"), IDENTITY_PY)
    code = root / "samedir" / "model" / "1" / "model.py"
    code.unlink()
    code.symlink_to(root / "inside" / "model" / "1" / "model.py")
    # On-demand archives: one with 150k empty members, and a good one.
    data = base / "data"
    data.mkdir()
    with tarfile.open(data / "many.tar.gz", "w:gz", compresslevel=1) as tar:
        for index in range(150_000):
            tar.addfile(tarfile.TarInfo(f"many/{index}"), io.BytesIO(b""))
    good = base / "good"
    write_model(good, "good", IDENTITY_FP32.format(name="good"), IDENTITY_PY)
    with tarfile.open(data / "good.tar.gz", "w:gz") as tar:
        tar.add(good / "good", arcname="good")
    return base


@pytest.fixture(scope="module")
def server(layout: Path) -> Iterator[RunningServer]:
    empty = layout / "empty"
    empty.mkdir()
    running = RunningServer([empty], "--allow-sagemaker=true", "--allow-grpc=false", "--model-control-mode=explicit",
                            f"--sagemaker-models-root={layout / 'models'}",
                            f"--sagemaker-model-data-url={layout / 'data'}",
                            env={"SAGEMAKER_MULTI_MODEL": "true"})
    yield running
    running.stop()


def _load(server: RunningServer, key: str, url: Path) -> tuple[int, str]:
    status, _, body = server.sagemaker("POST", "/models", json.dumps({"model_name": key, "url": str(url)}))
    return status, body.decode(errors="replace")


@pytest.mark.parametrize("key, url, link", [
    ("linked", "linked/model", "linked/model"),
    ("filelink", "filelink/model", "filelink/model/1/model.py"),
    ("dirlink", "dirlink/model", "dirlink/model/1"),
])
def test_a_link_out_of_the_models_root_is_refused(server: RunningServer, layout: Path, key: str, url: str,
                                                  link: str) -> None:
    root = layout / "models"
    status, body = _load(server, key, root / url)
    assert status == 400, body
    assert f"'{link}' leads to '{layout / 'outside'}" in body and "outside the models root" in body, body
    assert key not in server.sagemaker("GET", "/models")[2].decode()
    status, _, _ = server.sagemaker("POST", f"/models/{key}/invoke", json.dumps(IDENTITY))
    assert status == 404


def test_links_inside_the_models_root_still_load(server: RunningServer, layout: Path) -> None:
    for key in ("inside", "samedir"):
        assert _load(server, key, layout / "models" / key / "model") == (200, "")
        status, _, body = server.sagemaker("POST", f"/models/{key}/invoke", json.dumps(IDENTITY))
        assert status == 200, body


def test_an_archive_of_150k_members_is_refused_before_extraction(server: RunningServer, layout: Path) -> None:
    started = time.monotonic()
    status, _, body = server.sagemaker("POST", "/endpoints/local/invocations", json.dumps(IDENTITY), {TARGET: "many.tar.gz"})
    elapsed = time.monotonic() - started
    assert 400 <= status < 500, body
    assert b"more than 10000 members" in body, body
    assert elapsed < 3, f"refused after {elapsed:.1f} s"
    # Nothing of it stays on disk, and the endpoint serves on.
    assert not [p for p in (layout / "models").iterdir() if p.name not in
                ("inside", "linked", "filelink", "dirlink", "samedir")]
    status, _, body = server.sagemaker("POST", "/endpoints/local/invocations", json.dumps(IDENTITY), {TARGET: "good.tar.gz"})
    assert status == 200, body
