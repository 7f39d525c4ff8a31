"""The image as SageMaker runs it: the repository's Dockerfile built unchanged and started with ``docker run -v
MODEL:/opt/ml/model -p PORT:8080 IMAGE serve`` (no --init, so naiad is the container's PID 1): a single-model and a
multi-model endpoint of Python models, ``docker stop`` with a request in flight, and the SageMaker Python SDK's
local mode deploying, invoking and deleting an endpoint of the image.

Skipped, with the reason, where no Docker daemon answers or no base image can be had
(tools/container/base_image.sh builds one from Debian where Docker Hub is out of reach). The image is built once
per build context: its tag is a digest of exactly what ``docker build .`` reads, so a warm run builds nothing.
``tools/container/run_tier.sh`` gets a daemon going and runs this file; ``--durations=0`` shows each part's time
(the image build is the setup of the first test that needs it).
"""

from __future__ import annotations

import hashlib
import http.client
import json
import re
import shutil
import socket
import subprocess
import tarfile
import threading
import time
import tomllib
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.container.test_pid1 import ADD_SUB, ADD_SUB_OUTPUTS, DOCKER_STOP_GRACE, outputs, slow_model
from tests.server import EXAMPLES, ROOT, free_port

# A cold run builds the base image (~1 min of debootstrap) and the image (~1 min of pip) inside the setup of the
# first test that asks for it; the requests below carry their own, shorter deadlines.
pytestmark = pytest.mark.timeout(900)

CONSTRAINTS = ROOT / "docker" / "constraints.txt"
IMAGE_REPOSITORY = "naiad-test"
KEEP_IMAGES = 3  # earlier builds kept for other branches or worktrees sharing the daemon; older ones are removed


def run(argv: list[str], timeout: float = 60, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    if check and result.returncode != 0:
        raise AssertionError(f"{' '.join(argv)} exited {result.returncode}:\n{result.stdout}\n{result.stderr}")
    return result


def docker_unavailable() -> str | None:
    """Why no Docker daemon can be used here (None when one answers)."""
    if shutil.which("docker") is None:
        return "no docker client on PATH"
    try:
        probe = run(["docker", "version", "--format", "{{.Server.Version}}"], timeout=30, check=False)
    except subprocess.TimeoutExpired:
        return "the Docker daemon didn't answer within 30 s"
    if probe.returncode != 0:
        lines = probe.stderr.strip().splitlines()
        why = lines[-1] if lines else f"docker version exited {probe.returncode}"
        return f"no Docker daemon reachable ({why}); tools/container/run_tier.sh starts one"
    return None


def dockerfile_base() -> str:
    found = re.search(r"^FROM\s+(\S+)", (ROOT / "Dockerfile").read_text(), re.MULTILINE)
    assert found is not None, "the Dockerfile has no FROM"
    return found.group(1)


def build_context_digest(base_id: str) -> str:
    """A digest of what ``docker build .`` reads: the Dockerfile, .dockerignore, the paths .dockerignore lets
    through (its ``!`` lines; it excludes everything else), and the base image it builds on."""
    digest = hashlib.sha256(base_id.encode())
    ignore = (ROOT / ".dockerignore").read_text()
    allowed = [line[1:].strip() for line in ignore.splitlines() if line.startswith("!")]
    for name in sorted({"Dockerfile", ".dockerignore", *allowed}):
        path = ROOT / name
        files = sorted(path.rglob("*")) if path.is_dir() else [path]
        for file in files:
            if not file.is_file() or "__pycache__" in file.parts or file.suffix == ".pyc":
                continue
            digest.update(str(file.relative_to(ROOT)).encode() + b"\0" + file.read_bytes() + b"\0")
    return digest.hexdigest()


def remove_stale_images(current: str) -> None:
    listing = run(["docker", "images", IMAGE_REPOSITORY, "--format", "{{.Repository}}:{{.Tag}}"]).stdout.split()
    # docker images lists newest first; an image a container still uses refuses removal, which is fine.
    for tag in [t for t in listing if t != current][KEEP_IMAGES - 1:]:
        run(["docker", "rmi", tag], check=False)


@pytest.fixture(scope="session")
def image() -> str:
    """The repository's Dockerfile built unchanged, tagged by its build context's digest (reused when present)."""
    reason = docker_unavailable()
    if reason:
        pytest.skip(reason)
    base = dockerfile_base()
    made = subprocess.run([str(ROOT / "tools" / "container" / "base_image.sh")], capture_output=True, text=True,
                          timeout=600, check=False)
    if made.returncode != 0:
        pytest.skip(f"no base image {base}: {made.stderr.strip()[-500:]}")
    base_id = run(["docker", "image", "inspect", "--format", "{{.Id}}", base]).stdout.strip()
    tag = f"{IMAGE_REPOSITORY}:{build_context_digest(base_id)[:16]}"
    if run(["docker", "image", "inspect", tag], check=False).returncode != 0:
        # --network host: pip reaches PyPI however the daemon's bridge is set up (no NAT with --iptables=false);
        # the Dockerfile itself is built as anyone builds it.
        built = subprocess.run(["docker", "build", "--network", "host", "-t", tag, str(ROOT)], capture_output=True,
                               text=True, timeout=800, check=False)
        assert built.returncode == 0, f"docker build failed:\n{built.stdout[-4000:]}\n{built.stderr[-4000:]}"
        remove_stale_images(tag)
    return tag


def request(port: int, method: str, path: str, body: dict | None = None,
            timeout: float = 60) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request(method, path, body=json.dumps(body) if body is not None else None,
                     headers={"Content-Type": "application/json"} if body is not None else {})
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


class DockerContainer:
    """``docker run -d -v HOST:TARGET... -p PORT:8080 [-e K=V...] IMAGE serve``, as SageMaker starts the image."""

    def __init__(self, image: str, mounts: dict[Path, str], env: dict[str, str] | None = None) -> None:
        self.name = f"naiad-test-{uuid.uuid4().hex[:12]}"
        self.port = free_port()
        argv = ["docker", "run", "-d", "--name", self.name, "-p", f"127.0.0.1:{self.port}:8080"]
        for host, target in mounts.items():
            argv += ["-v", f"{host}:{target}"]
        for key, value in (env or {}).items():
            argv += ["-e", f"{key}={value}"]
        run([*argv, image, "serve"])

    def state(self) -> dict:
        return json.loads(run(["docker", "inspect", "--format", "{{json .State}}", self.name]).stdout)

    def logs(self) -> str:
        result = run(["docker", "logs", self.name], check=False)
        return result.stdout + result.stderr

    def wait_ping(self, timeout: float = 90.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.state()["Running"]:
                raise AssertionError(f"the container exited with {self.state()['ExitCode']}:\n{self.logs()}")
            try:
                if request(self.port, "GET", "/ping", timeout=2)[0] == 200:
                    return
            except OSError:
                pass  # docker-proxy accepts before naiad listens, then drops the connection
            time.sleep(0.2)
        raise AssertionError(f"/ping never answered 200:\n{self.logs()}")

    def pid1(self) -> str:
        """PID 1's command line inside the container."""
        return run(["docker", "exec", self.name, "cat", "/proc/1/cmdline"]).stdout.replace("\0", " ").strip()

    def stop(self) -> tuple[int, float]:
        """``docker stop`` with its default grace (SIGTERM, SIGKILL 10 s later): the exit code and the seconds
        the stop took."""
        started = time.monotonic()
        run(["docker", "stop", self.name], timeout=DOCKER_STOP_GRACE + 30)
        took = time.monotonic() - started
        return self.state()["ExitCode"], took

    def remove(self) -> None:
        run(["docker", "rm", "-f", self.name], check=False)


@pytest.fixture
def started(image: str) -> Iterator[list[DockerContainer]]:
    """Containers a test starts; removed afterwards whatever happened."""
    containers: list[DockerContainer] = []
    yield containers
    for container in containers:
        container.remove()


def normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def locked() -> dict[str, str]:
    pins = {}
    for line in CONSTRAINTS.read_text().splitlines():
        if line and not line.startswith("#"):
            name, version = line.split("==")
            pins[normalized(name)] = version
    return pins


def test_the_lock_pins_every_runtime_dependency_and_the_default_extras() -> None:
    # A dependency added to pyproject without rerunning tools/container/lock.sh would install unpinned.
    dependencies = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    extras = re.search(r"^ARG EXTRA_PIP_PACKAGES=(.*)$", (ROOT / "Dockerfile").read_text(), re.MULTILINE)
    assert extras is not None, "the Dockerfile no longer sets EXTRA_PIP_PACKAGES"
    names = {normalized(re.match(r"[A-Za-z0-9_.-]+", spec).group()) for spec in  # type: ignore[union-attr]
             [*dependencies, *extras.group(1).split()]}
    missing = names - set(locked())
    assert not missing, f"docker/constraints.txt lacks {sorted(missing)}: rerun tools/container/lock.sh"


def test_the_image_holds_exactly_the_locked_set(image: str) -> None:
    # pip list, not freeze: freeze names naiad by the wheel's file URL. pip, setuptools and wheel are the base
    # image's tooling, not the runtime set.
    listed = json.loads(run(["docker", "run", "--rm", "--entrypoint", "pip", image, "list", "--format=json"]).stdout)
    installed = {normalized(p["name"]): p["version"] for p in listed
                 if normalized(p["name"]) not in {"pip", "setuptools", "wheel"}}
    assert installed.pop("naiad") == tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert installed == locked()
    # The server needs tritonclient's generated modules only; its clients (aiohttp, gevent, ...) are no runtime
    # dependency any more, so nothing beyond the lock may bring them.
    modules = "tritonclient.grpc.service_pb2, tritonclient.grpc.service_pb2_grpc, tritonclient.grpc.model_config_pb2"
    run(["docker", "run", "--rm", "--entrypoint", "python", image, "-c", f"import {modules}"])


def test_single_model_endpoint_serves_a_python_model(image: str, started: list[DockerContainer],
                                                     tmp_path: Path) -> None:
    model = tmp_path / "model"
    shutil.copytree(EXAMPLES / "add_sub", model / "add_sub")
    container = DockerContainer(image, {model: "/opt/ml/model"})
    started.append(container)
    container.wait_ping()
    assert "naiad sagemaker serve" in container.pid1()  # as SageMaker runs it: no --init in front
    status, body = request(container.port, "POST", "/invocations", ADD_SUB)
    assert status == 200, body
    assert outputs(body) == ADD_SUB_OUTPUTS
    code, _ = container.stop()
    assert code == 0, container.logs()


def test_multi_model_endpoint_loads_and_invokes_python_models(image: str, started: list[DockerContainer],
                                                              tmp_path: Path) -> None:
    models = tmp_path / "models"
    keys = ("a1b2", "c3d4")
    for key in keys:
        shutil.copytree(EXAMPLES / "add_sub", models / key / "model")
    container = DockerContainer(image, {models: "/opt/ml/models"}, {"SAGEMAKER_MULTI_MODEL": "true"})
    started.append(container)
    container.wait_ping()
    for key in keys:
        status, body = request(container.port, "POST", "/models",
                               {"model_name": key, "url": f"/opt/ml/models/{key}/model"})
        assert status == 200, body
    for key in keys:
        status, body = request(container.port, "POST", f"/models/{key}/invoke", ADD_SUB)
        assert status == 200, body
        assert outputs(body) == ADD_SUB_OUTPUTS
    code, _ = container.stop()
    assert code == 0, container.logs()


def test_docker_stop_answers_the_request_in_flight_and_exits_0_within_the_grace(
        image: str, started: list[DockerContainer], tmp_path: Path) -> None:
    model = tmp_path / "model"
    slow_model(model / "slow", "slow", seconds=3.0)
    container = DockerContainer(image, {model: "/opt/ml/model"})
    started.append(container)
    container.wait_ping()
    answers: list[tuple[int, bytes]] = []
    client = threading.Thread(target=lambda: answers.append(request(
        container.port, "POST", "/invocations",
        {"inputs": [{"name": "INPUT0", "shape": [2], "datatype": "FP32", "data": [1, 2]}]})))
    client.start()
    time.sleep(1.0)  # the request is in the model's execute
    code, took = container.stop()
    client.join(10)
    # Past the grace docker would have sent SIGKILL: exit code 137, and the stop would take >= 10 s.
    assert code == 0, container.logs()
    assert took < DOCKER_STOP_GRACE, f"docker stop took {took:.1f} s"
    assert answers and answers[0][0] == 200, answers
    assert outputs(answers[0][1]) == {"OUTPUT0": [1.0, 2.0]}


class RefusingProxy:
    """A loopback listener that records and refuses every call made to it: botocore's (AWS_ENDPOINT_URL points
    here) and anything that honours HTTPS_PROXY (the SDK's telemetry uses requests). Nothing leaves the machine,
    and the test can say what would have."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(16)
        self.url = f"http://127.0.0.1:{self._sock.getsockname()[1]}"
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            with conn:
                conn.settimeout(5)
                try:
                    head = conn.recv(65536).decode(errors="replace")
                except OSError:
                    head = ""
                # The request line, and for AWS calls the service in the signature's credential scope.
                scope = re.search(r"Credential=[^/]+/\d+/([^/]+)/([^/]+)/", head)
                line = head.split("\r\n", 1)[0]
                self.calls.append(f"{line} ({scope.group(2)} in {scope.group(1)})" if scope else line)
                conn.sendall(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")

    def close(self) -> None:
        self._sock.close()


def compose_available() -> bool:
    """What the SDK's local mode runs the endpoint with: ``docker compose`` v2 or ``docker-compose``."""
    if shutil.which("docker-compose"):
        return True
    probe = subprocess.run(["docker", "compose", "version"], capture_output=True, text=True, check=False)
    return probe.returncode == 0 and "v2" in probe.stdout


def test_sagemaker_sdk_local_mode_deploys_invokes_and_deletes(image: str, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    if not compose_available():
        pytest.skip("the SDK's local mode needs docker compose (apt-get install docker-compose)")
    proxy = RefusingProxy()
    # Dummy credentials and a region (LocalSession insists on one); every AWS endpoint and every proxied
    # request is the refusing listener above, so nothing reaches AWS whatever the SDK tries.
    for key, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                       "AWS_DEFAULT_REGION": "us-east-1", "AWS_ENDPOINT_URL": proxy.url,
                       "AWS_EC2_METADATA_DISABLED": "true", "AWS_MAX_ATTEMPTS": "1",
                       "HTTPS_PROXY": proxy.url, "HTTP_PROXY": proxy.url, "NO_PROXY": "localhost,127.0.0.1",
                       "SAGEMAKER_SUPPRESS_V2_WARNING": "1"}.items():
        monkeypatch.setenv(key, value)
    for key in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "https_proxy", "http_proxy", "no_proxy"):
        monkeypatch.delenv(key, raising=False)
    pytest.importorskip("sagemaker", reason="the SDK is the container extra: pip install -e '.[container]'")
    from sagemaker.deserializers import JSONDeserializer
    from sagemaker.local import LocalSession
    from sagemaker.model import Model
    from sagemaker.predictor import Predictor
    from sagemaker.serializers import JSONSerializer

    data = tmp_path / "data"
    data.mkdir()
    with tarfile.open(data / "model.tar.gz", "w:gz") as archive:  # model.tar.gz, as a training job leaves it
        archive.add(EXAMPLES / "add_sub", arcname="add_sub")
    # The SDK's telemetry would call STS GetCallerIdentity and GET a telemetry URL on S3 after each step;
    # opting out is what a CI user does, and the listener shows it stays that way.
    session = LocalSession(sagemaker_config={
        "SchemaVersion": "1.0", "SageMaker": {"PythonSDK": {"Modules": {"TelemetryOptOut": True}}}})
    port = free_port()
    session.config = {"local": {"local_code": True, "serving_port": port, "container_root": str(tmp_path)}}
    model = Model(image_uri=image, model_data=f"file://{data / 'model.tar.gz'}",
                  role="arn:aws:iam::111111111111:role/SageMakerRole",  # an ARN: no IAM lookup of a role name
                  sagemaker_session=session, predictor_cls=Predictor)
    try:
        # wait=False: local mode's create_endpoint already returns only once /ping answers; waiting again polls
        # describe_endpoint after a fixed 30 s sleep.
        predictor = model.deploy(initial_instance_count=1, instance_type="local", wait=False,
                                 serializer=JSONSerializer(), deserializer=JSONDeserializer())
        try:
            answer = predictor.predict(ADD_SUB)
            assert {out["name"]: out["data"] for out in answer["outputs"]} == ADD_SUB_OUTPUTS
        finally:
            predictor.delete_endpoint()
        left = run(["docker", "ps", "-q", "--filter", f"ancestor={image}", "--filter", "publish=" + str(port)])
        assert left.stdout.strip() == "", "delete_endpoint left the container running"
        assert proxy.calls == [], f"local mode tried to leave the machine: {proxy.calls}"
    finally:
        proxy.close()
        # Whatever went wrong, no container of this endpoint outlives the test.
        stray = run(["docker", "ps", "-aq", "--filter", f"ancestor={image}", "--filter", "name=-algo-"],
                    check=False).stdout.split()
        if stray:
            run(["docker", "rm", "-f", *stray], check=False)
