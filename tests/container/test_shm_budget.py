"""Issue 30: a SageMaker multi-model endpoint under Docker's default 64 MiB /dev/shm (SageMaker passes no
--shm-size). Each Python model's worker has two shared-memory arenas of SageMaker's default 16 MiB; as files in
/dev/shm reserved up front, the third model's load failed ("failed to allocate 16777216 bytes of shared memory in
/dev/shm (no space left)"), as in Triton. As sparse memfds they cost only the pages their traffic reaches, outside
/dev/shm: 50 models load and answer, and a 100 MiB tensor (larger than /dev/shm) crosses to a model and back.

The server runs as a container runs it: ``naiad sagemaker serve`` as PID 1 of its own PID namespace with a 64 MiB
tmpfs on /dev/shm (namespace.py), driven from outside over loopback as SageMaker's front door drives it."""

from __future__ import annotations

import http.client
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import psutil
import pytest
import tritonclient.http as httpclient

from tests.container.namespace import DOCKER_SHM, as_pid1, pid1_of, unavailable
from tests.models import IDENTITY_FP32, IDENTITY_PY, write_model
from tests.server import ROOT, free_port

pytestmark = pytest.mark.skipif(unavailable() is not None, reason=str(unavailable()))

MODELS = 50
BINARY_JSON = "application/vnd.sagemaker-triton.binary+json;json-header-size="
ELEMENTS = 16 * 1024  # 64 KiB of FP32: past the 16 KiB a message carries inline, so each crosses both arenas


class Container:
    """``naiad sagemaker serve`` (multi-model) as PID 1 of a namespace whose /dev/shm is Docker's 64 MiB."""

    def __init__(self, models_root: Path, scratch: Path) -> None:
        self.models_root = models_root
        self.port = free_port()
        self.log_path = scratch / "naiad.log"
        self._log = open(self.log_path, "wb")
        argv = [sys.executable, "-m", "naiad", "sagemaker", "serve", f"--models-root={models_root}",
                f"--multi-model-repo={scratch / 'placeholder'}"]
        # shm sizes: the script's defaults, 16 MiB and 1 MiB. Bodies up to 256 MiB, for the 100 MiB tensor.
        env = {**os.environ, "PYTHONPATH": str(ROOT), "SAGEMAKER_MULTI_MODEL": "true",
               "SAGEMAKER_BIND_TO_PORT": str(self.port),
               "SAGEMAKER_TRITON_ADDITIONAL_ARGS": f"--http-max-input-size={256 << 20}"}
        self.proc = subprocess.Popen(as_pid1(argv, DOCKER_SHM), stdout=self._log, stderr=subprocess.STDOUT,
                                     env=env, cwd=ROOT)
        self.pid1 = pid1_of(self.proc.pid)
        self.dev_shm = f"/proc/{self.pid1}/root/dev/shm"  # the namespace's own /dev/shm, seen from outside
        deadline = time.monotonic() + 60
        while True:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the container did not answer /ping:\n{self.log()}")
            try:
                if self.request("GET", "/ping")[0] == 200:
                    break
            except OSError:
                pass
            time.sleep(0.05)

    def request(self, method: str, path: str, body: bytes | str | None = None,
                headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
        """On the SageMaker port (the namespaces share the host's network: loopback reaches it)."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)
        try:
            conn.request(method, path, body=body, headers=headers or {})
            resp = conn.getresponse()
            return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
        finally:
            conn.close()

    def shm_used(self) -> int:
        info = os.statvfs(self.dev_shm)
        return (info.f_blocks - info.f_bfree) * info.f_frsize

    def shm_size(self) -> int:
        info = os.statvfs(self.dev_shm)
        return info.f_blocks * info.f_frsize

    def workers(self) -> list[psutil.Process]:
        return [p for p in psutil.Process(self.pid1).children(recursive=True)
                if "naiad.backends.python.worker" in " ".join(p.cmdline())]

    def log(self) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.pid1, signal.SIGTERM)  # PID 1 forwards it to the server, as docker stop's does
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()  # --kill-child: the namespace goes with unshare
                self.proc.wait()
        self._log.close()


@pytest.fixture(scope="module")
def container(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Container]:
    base = tmp_path_factory.mktemp("shm_budget")
    root = base / "models"
    for i in range(MODELS):  # SageMaker's layout: <root>/<hash>/model, the model's config.pbtxt at the url
        write_model(root / f"m{i}", "model", IDENTITY_FP32.format(name=f"m{i}"), IDENTITY_PY)
    write_model(root / "big", "model", IDENTITY_FP32.format(name="big"), IDENTITY_PY)
    running = Container(root, base)
    yield running
    running.stop()


def _invoke(container: Container, key: str, data: np.ndarray) -> tuple[int, np.ndarray | str]:
    inputs = [httpclient.InferInput("INPUT0", list(data.shape), "FP32")]
    inputs[0].set_data_from_numpy(data, binary_data=True)
    body, json_size = httpclient.InferenceServerClient.generate_request_body(
        inputs, outputs=[httpclient.InferRequestedOutput("OUTPUT0", binary_data=True)])
    status, headers, reply = container.request("POST", f"/models/{key}/invoke", body,
                                               {"Content-Type": f"{BINARY_JSON}{json_size}"})
    if status != 200:
        return status, reply.decode(errors="replace")
    size = int(headers["content-type"][len(BINARY_JSON):])
    result = httpclient.InferenceServerClient.parse_response_body(reply, header_length=size)
    return status, result.as_numpy("OUTPUT0")


def _load(container: Container, key: str) -> tuple[int, str]:
    url = container.models_root / key / "model"
    status, _, body = container.request("POST", "/models", json.dumps({"model_name": key, "url": str(url)}))
    return status, body.decode(errors="replace")


def test_fifty_python_models_load_and_answer_under_a_64_mib_dev_shm(container: Container) -> None:
    assert container.shm_size() == 64 << 20
    keys = [f"m{i}" for i in range(MODELS)]
    with ThreadPoolExecutor(2) as pool:  # SageMaker loads models as requests come; two at a time here
        loads = dict(zip(keys, pool.map(lambda key: _load(container, key), keys)))
    failed = {key: answer for key, answer in loads.items() if answer[0] != 200}
    assert not failed, f"{len(failed)} of {MODELS} loads failed, e.g. {next(iter(failed.items()), None)}"
    assert len(container.workers()) == MODELS
    for i, key in enumerate(keys):
        data = np.arange(ELEMENTS, dtype=np.float32) + i  # each model's own values
        status, out = _invoke(container, key, data)
        assert status == 200, (key, out)
        np.testing.assert_array_equal(out, data)
    used = container.shm_used()
    workers = container.workers()
    memory = [p.memory_full_info() for p in workers]
    rss, uss = sorted(m.rss for m in memory), sorted(m.uss for m in memory)
    print(f"\n{MODELS} Python models: /dev/shm used {used} of {container.shm_size()} bytes; per worker: RSS "
          f"median {rss[MODELS // 2] / 2**20:.1f} MiB (max {rss[-1] / 2**20:.1f}), USS median "
          f"{uss[MODELS // 2] / 2**20:.1f} MiB (max {uss[-1] / 2**20:.1f})")
    assert used == 0, "naiad's segments are memfds: nothing of its own lives in /dev/shm"
    # Nothing to tell the operator about /dev/shm: naiad doesn't need it.
    assert "--shm-size" not in container.log(), container.log()[-3000:]


def test_a_100_mib_tensor_crosses_a_64_mib_dev_shm(container: Container) -> None:
    status, body = _load(container, "big")
    assert status == 200, body
    data = np.random.default_rng(7).random(25 * 2**20, dtype=np.float32)  # 100 MiB
    status, out = _invoke(container, "big", data)
    assert status == 200, out
    np.testing.assert_array_equal(out, data)
    assert container.proc.poll() is None and container.shm_used() == 0
