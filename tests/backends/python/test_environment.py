"""EXECUTION_ENV_PATH against a running server: models run on a venv-pack archive's interpreter and packages
(a package only the environment has, written by the test: nothing is downloaded), from a .tar.gz or a folder, through
``$$TRITON_MODEL_DIRECTORY``, two models sharing one unpacked copy; broken environments fail their own load
with a clear reason while the rest of the repository serves."""

from __future__ import annotations

import io
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from importlib import metadata
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.backends.python import models as m
from tests.server import RunningServer

ENV_PROBE = "1.16.0"  # the version of the probe package in the environment; the server has none

REPORT = """
import json, os, sys
import numpy as np
import naiad_env_probe
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        info = {"naiad_env_probe": naiad_env_probe.__version__, "prefix": sys.prefix, "executable": sys.executable,
                "numpy": np.__version__, "virtual_env": os.environ.get("VIRTUAL_ENV", ""), "pid": os.getpid()}
        out = np.array([json.dumps(info).encode()], dtype=np.object_)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("INFO", out)]) for _ in requests]
"""


# No inputs or outputs: the hook adds them, and only when it runs where naiad_env_probe is the environment's.
AUTO_CONFIG = """
name: "env_auto"
backend: "python"
parameters {{ key: "EXECUTION_ENV_PATH" value: {{ string_value: "{env}" }} }}
"""
AUTO_HOOK = f"""
    @staticmethod
    def auto_complete_config(config):
        config.add_input({{"name": "IN", "data_type": "TYPE_INT32", "dims": [1]}})
        name = "INFO" if naiad_env_probe.__version__ == "{ENV_PROBE}" else "SERVER_PROBE_" + naiad_env_probe.__version__
        config.add_output({{"name": name, "data_type": "TYPE_STRING", "dims": [1]}})
        return config
"""


def _config(name: str, env_path: str | None) -> str:
    param = (f'parameters {{ key: "EXECUTION_ENV_PATH" value: {{ string_value: "{env_path}" }} }}'
             if env_path is not None else "")
    return m.io_config(name, [("IN", "TYPE_INT32", "[ 1 ]")], [("INFO", "TYPE_STRING", "[ 1 ]")], param)


def _venv(folder: Path, packages: list[str], with_numpy: bool) -> Path:
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder)], check=True)
    site = folder / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
    site.mkdir(parents=True, exist_ok=True)
    for package in packages:
        # A real installed distribution (module plus dist-info), made here so the test runs offline.
        name, _, version = package.partition("==")
        (site / f"{name}.py").write_text(f"__version__ = {version!r}\n")
        info = site / f"{name}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        (info / "RECORD").write_text(f"{name}.py,,\n{info.name}/METADATA,,\n{info.name}/RECORD,,\n")
    if with_numpy:
        # The server's own numpy, linked in (copied across file systems): what the worker needs, quickly.
        source = Path(np.__file__).parent.parent
        names = ["numpy", "numpy.libs", f"numpy-{np.__version__}.dist-info"]
        for name in names:
            if (source / name).exists():
                shutil.copytree(source / name, site / name, copy_function=_link_or_copy)
    return folder


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


@pytest.fixture(scope="module")
def envs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    envs = tmp_path_factory.mktemp("envs")
    env = _venv(envs / "probe-env", [f"naiad_env_probe=={ENV_PROBE}"], with_numpy=True)
    subprocess.run(["venv-pack", "-q", "-p", str(env), "-o", str(envs / "probe-env.tar.gz"), "--compress-level", "1"],
                   check=True)
    _venv(envs / "bare-env", [], with_numpy=False)
    shutil.copytree(envs / "bare-env", envs / "no-activate-env", symlinks=True)
    (envs / "no-activate-env" / "bin" / "activate").unlink()
    (envs / "corrupt.tar.gz").write_bytes((envs / "probe-env.tar.gz").read_bytes()[:4096])
    (envs / "not-an-archive.tar.gz").write_text("conda-pack was never run on this\n")
    with tarfile.open(envs / "escape.tar.gz", "w:gz") as tar:
        for member in ("bin/activate", "../escaped.txt"):
            info = tarfile.TarInfo(member)
            info.size = 1
            tar.addfile(info, io.BytesIO(b"x"))
    return envs


@pytest.fixture(scope="module")
def setup(envs: Path, tmp_path_factory: pytest.TempPathFactory):
    base = tmp_path_factory.mktemp("envrepo")
    repo, cache = base / "repo", base / "cache"
    # Relative to each model's folder, as Triton's docs share one archive between models.
    shared = "$$TRITON_MODEL_DIRECTORY/../../" + os.path.relpath(envs, base) + "/probe-env.tar.gz"
    for name, env_path in [("env_tar", shared), ("env_tar_again", shared),
                           ("env_folder", str(envs / "probe-env")), ("plain", None),
                           ("env_missing", str(envs / "nowhere.tar.gz")),
                           ("env_corrupt", str(envs / "corrupt.tar.gz")),
                           ("env_not_archive", str(envs / "not-an-archive.tar.gz")),
                           ("env_escape", str(envs / "escape.tar.gz")),
                           ("env_no_numpy", str(envs / "bare-env")),
                           ("env_no_activate", str(envs / "no-activate-env"))]:
        m.write(repo, name, _config(name, env_path), REPORT if env_path is not None else REPORT.replace(
            "import naiad_env_probe\n", "try:\n    import naiad_env_probe\nexcept ImportError:\n"
                                         "    naiad_env_probe = type('probe', (), {'__version__': ''})\n"))
    # Not "ready": the broken models stay unavailable on purpose. The HTTP port opens once loading is done.
    m.write_model(repo, "env_auto", AUTO_CONFIG.format(env=shared), REPORT + AUTO_HOOK)
    server = RunningServer([repo], env={"NAIAD_PYTHON_ENV_CACHE": str(cache)}, wait_ready=False)
    yield server, cache, envs
    server.stop()


def _info(server: RunningServer, model: str) -> dict:
    with httpclient.InferenceServerClient(server.url) as client:
        inp = httpclient.InferInput("IN", [1], "INT32")
        inp.set_data_from_numpy(np.zeros(1, dtype=np.int32))
        return json.loads(client.infer(model, [inp]).as_numpy("INFO")[0])


def _reasons(server: RunningServer) -> dict[str, str]:
    with httpclient.InferenceServerClient(server.url) as client:
        return {e["name"]: e.get("reason", "") for e in client.get_model_repository_index()}


def _server_probe() -> str:
    try:
        return metadata.version("naiad_env_probe")
    except metadata.PackageNotFoundError:
        return ""


def test_archive_env_runs_its_own_interpreter_and_packages(setup) -> None:
    server, cache, _ = setup
    assert _server_probe() != ENV_PROBE
    info = _info(server, "env_tar")
    assert info["naiad_env_probe"] == ENV_PROBE
    assert Path(info["prefix"]).parent == cache  # unpacked into the cache, not the server's prefix
    assert info["virtual_env"] == info["prefix"]
    assert info["executable"].startswith(info["prefix"] + "/bin/")


def test_the_rest_of_the_repository_runs_on_the_servers_packages(setup) -> None:
    server, _, _ = setup
    info = _info(server, "plain")
    assert info["naiad_env_probe"] == _server_probe() and info["prefix"] == sys.prefix


def test_unpacked_folder_is_used_in_place(setup) -> None:
    server, _, envs = setup
    info = _info(server, "env_folder")
    assert info["naiad_env_probe"] == ENV_PROBE and info["prefix"] == str((envs / "probe-env").resolve())


def test_models_naming_one_archive_share_one_unpacked_copy(setup) -> None:
    server, cache, _ = setup
    assert _info(server, "env_tar")["prefix"] == _info(server, "env_tar_again")["prefix"]
    unpacked = [p.name for p in cache.iterdir() if not p.name.startswith("naiad-")]
    assert len(unpacked) == 1, unpacked  # one environment, and no half-extracted leftovers from the broken ones
    extracted = [line for line in server.log().splitlines() if "Extracting Python execution env" in line]
    assert len([line for line in extracted if "probe-env.tar.gz" in line]) == 1, extracted


def test_a_dead_worker_comes_back_in_its_environment(setup) -> None:
    server, _, _ = setup
    before = _info(server, "env_folder")
    os.kill(before["pid"], signal.SIGKILL)
    deadline = time.monotonic() + 20
    with httpclient.InferenceServerClient(server.url) as client:
        while True:  # the restart is noticed asynchronously: until then the model may still look ready
            try:
                after = _info(server, "env_folder") if client.is_model_ready("env_folder") else None
            except InferenceServerException:
                after = None
            if after is not None and after["pid"] != before["pid"]:
                break
            assert time.monotonic() < deadline, "the worker did not come back"
            time.sleep(0.05)
    assert after["naiad_env_probe"] == ENV_PROBE and after["prefix"] == before["prefix"]


def test_auto_complete_config_runs_in_the_environment(setup) -> None:
    server, _, _ = setup
    with httpclient.InferenceServerClient(server.url) as client:
        config = client.get_model_config("env_auto")
    assert [o["name"] for o in config["output"]] == ["INFO"], config["output"]
    assert _info(server, "env_auto")["naiad_env_probe"] == ENV_PROBE


@pytest.mark.parametrize(("model", "words"), [
    ("env_missing", ["Failed to get the canonical path for", "nowhere.tar.gz", "no such file"]),
    ("env_corrupt", ["failed to extract the Python execution environment", "corrupt.tar.gz"]),
    ("env_not_archive", ["failed to extract", "not-an-archive.tar.gz", "conda-pack / venv-pack .tar.gz"]),
    ("env_escape", ["failed to extract", "escape.tar.gz", "outside"]),
    ("env_no_numpy", ["cannot run the python backend's worker", "No module named 'numpy'",
                      "the environment must provide numpy"]),
    ("env_no_activate", [("no-activate-env/bin/activate does not exist. The Python environment should contain an "
                          "'activate' script.")]),
])
def test_broken_environment_fails_only_its_model(setup, model: str, words: list[str]) -> None:
    server, _, envs = setup
    reason = _reasons(server)[model]
    for word in words:
        assert word in reason, reason
    with httpclient.InferenceServerClient(server.url) as client:
        assert not client.is_model_ready(model)
        assert client.is_server_live()
    assert not (envs / "escaped.txt").exists() and not (envs.parent / "escaped.txt").exists()
    assert _info(server, "env_tar")["naiad_env_probe"] == ENV_PROBE  # and the rest keeps serving


def test_in_process_server_still_runs_an_environment_model_in_its_worker(envs: Path, tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    m.write(repo, "env_folder", _config("env_folder", str(envs / "probe-env")), REPORT)
    server = RunningServer([repo], "--backend-config=python,in-process=true",
                           env={"NAIAD_PYTHON_ENV_CACHE": str(tmp_path / "cache")})
    try:
        assert _info(server, "env_folder")["naiad_env_probe"] == ENV_PROBE
    finally:
        server.stop()
