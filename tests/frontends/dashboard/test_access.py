"""Who may see the dashboard, and where: ``--allow-dashboard``, the restricted-API rule (the feed is in every category
whose data it shows: health, metadata, model-config, model-repository, statistics; the page itself holds no data),
and the SageMaker port (the dashboard there only when HTTP is off; the multi-model residency in the feed)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.frontends.dashboard.test_routes import feed
from tests.models import IDENTITY_FP32, IDENTITY_PY, write_model
from tests.server import RunningServer

ADMIN = {"Admin-Key": "secret"}
STATS = {"stats-key": "numbers"}


def _refused(key: str) -> bytes:
    return json.dumps({"error": f"This API is restricted, expecting header '{key}'"}, separators=(",", ":")).encode()


def _sagemaker_model(root: Path, key: str, name: str) -> Path:
    write_model(root / key / "model", name, IDENTITY_FP32.format(name=name), IDENTITY_PY)
    return root / key / "model"


@pytest.fixture(scope="module")
def restricted(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RunningServer, Path]]:
    """Restricted APIs, and a multi-model SageMaker endpoint beside HTTP."""
    base = tmp_path_factory.mktemp("restricted-dashboard")
    (base / "empty").mkdir()
    root = base / "models"
    running = RunningServer(
        [base / "empty"], "--http-restricted-api=model-repository:Admin-Key=secret",
        "--http-restricted-api=statistics:stats-key=numbers", "--http-restricted-api=inference:infer-key=x",
        "--allow-grpc=false", "--allow-metrics=false", "--allow-sagemaker=true", "--model-control-mode=explicit",
        f"--sagemaker-models-root={root}", "--model-memory-limit=4G", env={"SAGEMAKER_MULTI_MODEL": "true"})
    yield running, root
    running.stop()


def test_restricted_feed_needs_each_categorys_header(restricted: tuple[RunningServer, Path]) -> None:
    server, _ = restricted
    # The page holds no data: served to anyone (a browser cannot add a header to a page it opens); it asks.
    assert server.request("GET", "/dashboard")[0] == 200
    assert server.request("GET", "/dashboard/app.js")[0] == 200
    status, _, body = server.request("GET", "/dashboard/feed")
    assert (status, body) == (403, _refused("Admin-Key"))
    assert server.request("GET", "/dashboard/feed", headers={"Admin-Key": "wrong", **STATS})[:3:2] == (
        403, _refused("Admin-Key"))
    assert server.request("GET", "/dashboard/feed", headers=ADMIN)[:3:2] == (403, _refused("stats-key"))
    # Any case for the name, the exact value, as the other restricted routes.
    document = feed(server, headers={"admin-key": "secret", "STATS-KEY": "numbers"})
    assert document["server"]["live"] is True
    # Restricting inference alone does not hide the dashboard: it infers nothing.
    assert server.request("POST", "/v2/models/x/infer", "{}")[:3:2] == (403, _refused("infer-key"))


def test_feed_is_fenced_by_metadata_model_config_and_health_too(tmp_path: Path) -> None:
    """Issue 19: the feed was open when only metadata and model-config were restricted, though it shows both (each
    model's platform and instances, the server's name and version)."""
    write_model(tmp_path, "ident", IDENTITY_FP32.format(name="ident"), IDENTITY_PY)
    server = RunningServer([tmp_path], "--http-restricted-api=metadata:meta-key=m",
                           "--http-restricted-api=model-config:config-key=c", "--http-restricted-api=health:h-key=h",
                           "--allow-grpc=false", "--allow-metrics=false", wait_ready=False, wait_port=True)
    try:
        assert server.request("GET", "/dashboard/feed")[:3:2] == (403, _refused("h-key"))
        assert server.request("GET", "/dashboard/feed", headers={"h-key": "h"})[:3:2] == (403, _refused("meta-key"))
        partial = {"h-key": "h", "meta-key": "m"}
        assert server.request("GET", "/dashboard/feed", headers=partial)[:3:2] == (403, _refused("config-key"))
        document = feed(server, headers={**partial, "config-key": "c"})
        [ident] = [m for m in document["models"] if m["name"] == "ident"]
        assert ident["platform"] == "python" and document["server"]["id"] == "triton"
    finally:
        server.stop()


def test_residency_in_the_feed(restricted: tuple[RunningServer, Path]) -> None:
    server, root = restricted
    keys = {**ADMIN, **STATS}
    assert feed(server, headers=keys)["mme"]["limit"] == 4 << 30
    url = _sagemaker_model(root, "k1", "ident")
    status, _, body = server.sagemaker("POST", "/models", json.dumps({"model_name": "k1", "url": str(url)}),
                                       {"X-Amzn-SageMaker-Target-Model": "ident"})
    assert status == 200, body
    deadline = time.monotonic() + 5
    while True:  # the feed is rebuilt at most twice a second
        document = feed(server, headers=keys)
        mme: dict[str, Any] = document["mme"]
        if mme["models"] or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    [resident] = mme["models"]
    assert (resident["key"], resident["model"], resident["ready"]) == ("k1", "ident", True)
    assert resident["memory"] > 0 and mme["used"] == resident["memory"] and mme["loads"] == 1
    assert (mme["cache_hits"], mme["evictions"], mme["last_evicted"]) == (0, 0, [])
    [ident] = [r for r in document["models"] if r["name"] == "ident"]
    assert ident["state"] == "READY" and ident["instances"][0]["pid"] > 0
    # HTTP is on: the SageMaker port keeps Triton's bare 400 for what it doesn't route.
    assert server.sagemaker("GET", "/dashboard")[:3:2] == (400, b"")


class SageMakerOnly(RunningServer):
    """A server with HTTP off: ready once the SageMaker port's /ping answers 200."""

    def _wait(self, ready: bool, any_answer: bool = False, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"naiad exited with {self.proc.returncode}:\n{self.log()}")
            try:
                if self.sagemaker("GET", "/ping")[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.05)
        raise RuntimeError(f"naiad did not answer /ping:\n{self.log()}")


def test_on_the_sagemaker_port_when_http_is_off(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    server = SageMakerOnly([tmp_path / "empty"], "--allow-http=false", "--allow-grpc=false", "--allow-metrics=false",
                           "--allow-sagemaker=true", "--model-control-mode=explicit",
                           f"--sagemaker-models-root={tmp_path / 'models'}", env={"SAGEMAKER_MULTI_MODEL": "true"})
    try:
        status, headers, body = server.sagemaker("GET", "/dashboard")
        assert status == 200 and b"dashboard/app.js" in body
        document = feed(server, port=server.sagemaker_port)
        assert document["server"]["port"] == "sagemaker"
        # Its buttons call this port's routes: SageMaker's DELETE /models/<key>, not the repository extension.
        assert document["actions"] == {"repository": False, "residents": True}
        assert server.sagemaker("GET", "/dashboard/other")[:3:2] == (400, b"")
        assert server.sagemaker("GET", "/dashboard/")[0] == 301
        assert server.sagemaker("GET", "/ping")[0] == 200
        assert f"Dashboard at http://127.0.0.1:{server.sagemaker_port}/dashboard" in server.log()
    finally:
        server.stop()


def test_allow_dashboard_false(tmp_path: Path) -> None:
    server = RunningServer([tmp_path], "--allow-dashboard=false", "--allow-grpc=false", "--allow-metrics=false")
    try:
        for path in ("/dashboard", "/dashboard/", "/dashboard/feed", "/dashboard/app.js"):
            assert server.request("GET", path)[:3:2] == (404, b'{"error":"Not Found"}')
        assert "Dashboard at" not in server.log()
    finally:
        server.stop()
