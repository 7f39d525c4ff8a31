"""On-demand loads of a multi-model endpoint under concurrency, driven by boto3's ``sagemaker-runtime``: loads of
different archives run side by side up to --model-load-thread-count, concurrent misses on one archive share one
load, and a load (or a download) slower than --model-load-timeout-secs fails only the requests waiting for it."""

from __future__ import annotations

import json
import socket
import tarfile
import threading
import time
from pathlib import Path
from typing import Any

import boto3
import botocore.config
import psutil
import pytest

from tests.models import IDENTITY_FP32, IDENTITY_PY, write_model
from tests.server import RunningServer

IDENTITY = {"inputs": [{"name": "INPUT0", "shape": [2], "datatype": "FP32", "data": [1.5, 2.5]}]}

# Writes when its initialize() starts and ends, to the file the test names (workers inherit the environment).
MARKED_PY = """
    import os
    import time
    import triton_python_backend_utils as pb_utils

    def mark(what, name):
        with open(os.environ["NAIAD_TEST_MARKS"], "a") as f:
            f.write(f"{{what}} {{name}} {{time.time()}}\\n")

    class TritonPythonModel:
        def initialize(self, args):
            mark("start", args["model_name"])
            time.sleep({delay})
            mark("end", args["model_name"])

        def execute(self, requests):
            return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", r.inputs()[0].as_numpy())])
                    for r in requests]
"""


def runtime(server: RunningServer):  # noqa: ANN201 - boto3 clients have no importable type
    config = botocore.config.Config(read_timeout=120, retries={"total_max_attempts": 1})
    return boto3.client("sagemaker-runtime", endpoint_url=server.sagemaker_url, region_name="us-east-1",
                        aws_access_key_id="local", aws_secret_access_key="local", config=config)


def invoke(server: RunningServer, target: str) -> dict[str, Any]:
    """The answer's status, body or error, and when it came (time.time())."""
    try:
        answer = runtime(server).invoke_endpoint(EndpointName="local", TargetModel=target,
                                                 ContentType="application/json", Body=json.dumps(IDENTITY))
        return {"status": 200, "body": json.loads(answer["Body"].read()), "at": time.time()}
    except Exception as exc:  # botocore's ClientError subclasses, made per client
        response = getattr(exc, "response", {})
        return {"status": response.get("ResponseMetadata", {}).get("HTTPStatusCode"), "error": response,
                "at": time.time()}


def in_parallel(server: RunningServer, targets: list[str]) -> list[dict[str, Any]]:
    results: list[dict[str, Any]] = [{} for _ in targets]

    def call(i: int) -> None:
        results[i] = invoke(server, targets[i])

    threads = [threading.Thread(target=call, args=(i,)) for i in range(len(targets))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


def marks(path: Path) -> dict[str, list[tuple[str, float]]]:
    found: dict[str, list[tuple[str, float]]] = {}
    for line in path.read_text().splitlines() if path.exists() else []:
        what, name, at = line.split()
        found.setdefault(name, []).append((what, float(at)))
    return found


def make_archive(data: Path, name: str, delay: float) -> None:
    source = data.parent / "sources" / name
    write_model(source.parent, name, IDENTITY_FP32.format(name=name), MARKED_PY.format(delay=delay))
    with tarfile.open(data / f"{name}.tar.gz", "w:gz") as tar:
        tar.add(source, arcname=".")  # config.pbtxt at the archive's top


def mme(tmp_path: Path, data_url: str, *extra: str, env: dict[str, str] | None = None) -> RunningServer:
    (tmp_path / "empty").mkdir(exist_ok=True)
    return RunningServer([tmp_path / "empty"], "--allow-sagemaker=true", "--allow-grpc=false",
                         "--model-control-mode=explicit", f"--sagemaker-models-root={tmp_path / 'models'}",
                         f"--sagemaker-model-data-url={data_url}", *extra,
                         env={"SAGEMAKER_MULTI_MODEL": "true", "NAIAD_TEST_MARKS": str(tmp_path / "marks"),
                              **(env or {})})


@pytest.mark.parametrize("threads", [1, 2])
def test_misses_on_two_archives_load_side_by_side_and_share_per_archive(tmp_path: Path, threads: int) -> None:
    data = tmp_path / "data"
    data.mkdir()
    for name in ("slow_a", "slow_b"):
        make_archive(data, name, delay=1.5)
    server = mme(tmp_path, str(data), f"--model-load-thread-count={threads}")
    try:
        results = in_parallel(server, ["slow_a.tar.gz", "slow_b.tar.gz"] * 3)
        assert [r["status"] for r in results] == [200] * 6, results
        assert {r["body"]["model_name"] for r in results} == {"slow_a.tar.gz", "slow_b.tar.gz"}
        seen = marks(tmp_path / "marks")
        # Three misses on each archive, one load of each: one download, one initialize().
        assert sorted(seen) == ["slow_a.tar.gz", "slow_b.tar.gz"]
        assert all([what for what, _ in seen[name]] == ["start", "end"] for name in seen), seen
        for name in seen:
            assert server.log().count(f"fetched '{name}'") == 1
        (start_a, end_a), (start_b, end_b) = ([at for _, at in seen[name]] for name in sorted(seen))
        overlapped = start_a < end_b and start_b < end_a
        # One load thread: one after the other (as every load ran before); two: side by side.
        assert overlapped == (threads == 2), seen
    finally:
        server.stop()


def test_a_load_past_the_timeout_fails_only_its_own_requests(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    make_archive(data, "hang", delay=60)
    make_archive(data, "fast", delay=0)
    server = mme(tmp_path, str(data), "--model-load-timeout-secs=2", "--model-load-thread-count=2")
    try:
        hung: list[dict[str, Any]] = []
        waiting = [threading.Thread(target=lambda: hung.append(invoke(server, "hang.tar.gz"))) for _ in range(2)]
        for thread in waiting:
            thread.start()
        deadline = time.monotonic() + 30
        while "hang.tar.gz" not in marks(tmp_path / "marks"):
            assert time.monotonic() < deadline, server.log()
            time.sleep(0.05)
        # The other archive loads and answers while the hung one is still loading.
        fast = invoke(server, "fast.tar.gz")
        assert fast["status"] == 200, fast
        assert all(thread.is_alive() for thread in waiting), hung
        for thread in waiting:
            thread.join(60)
        assert len(hung) == 2 and all(r["at"] > fast["at"] for r in hung)
        for result in hung:
            assert result["status"] == 424, result  # the container's failure, as ModelError
            assert "within 2 s (--model-load-timeout-secs)" in result["error"]["OriginalMessage"]
        assert [what for what, _ in marks(tmp_path / "marks")["hang.tar.gz"]] == ["start"]  # never finished
        # Its worker was stopped; the server keeps serving the other model.
        names = [" ".join(p.cmdline()) for p in psutil.Process(server.proc.pid).children(recursive=True)]
        assert not any("hang" in name for name in names), names
        assert invoke(server, "fast.tar.gz")["status"] == 200
    finally:
        server.stop()


def test_a_download_past_the_timeout_fails_only_its_own_requests(tmp_path: Path) -> None:
    # An S3 endpoint that accepts connections and never answers: the download hangs in botocore.
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(16)
    env = {"AWS_ENDPOINT_URL": f"http://127.0.0.1:{silent.getsockname()[1]}", "AWS_ACCESS_KEY_ID": "local",
           "AWS_SECRET_ACCESS_KEY": "local", "AWS_DEFAULT_REGION": "us-east-1"}
    server = mme(tmp_path, "s3://models/prod/", "--model-load-timeout-secs=2", env=env)
    try:
        started = time.monotonic()
        results = in_parallel(server, ["a.tar.gz", "a.tar.gz", "b.tar.gz"])
        assert time.monotonic() - started < 30
        for result in results:
            assert result["status"] == 503, result
            assert result["error"]["Error"]["Code"] == "ServiceUnavailable"
            assert "did not finish within 2 s (--model-load-timeout-secs)" in result["error"]["Error"]["Message"]
        assert server.sagemaker("GET", "/ping")[0] == 200
        assert server.log().count("download of 'a.tar.gz' did not finish") == 1  # one shared download
        # The hung downloads don't hold up a graceful stop (threads of an executor would: it killed at 30 s).
        stopping = time.monotonic()
        assert server.stop() == 0 and time.monotonic() - stopping < 20
    finally:
        server.stop()
        silent.close()


# Holds ~100 MB of its own, so its worker's memory is mostly this model's.
HEAVY_PY = """
    import numpy as np
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def initialize(self, args):
            self.weights = np.ones(100 * 1024 * 1024 // 8)

        def execute(self, requests):
            return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", r.inputs()[0].as_numpy())])
                    for r in requests]
"""


def model_workers(server: psutil.Process) -> list[int]:
    """The server's child processes but its front-end processes (``--frontend-processes N``), which the limit
    does not cover: what the models hold, as with one process."""
    pids = []
    for child in server.children(recursive=True):
        try:
            if "naiad.processes" not in child.cmdline():
                pids.append(child.pid)
        except psutil.Error:  # gone meanwhile
            pass
    return pids


def test_parallel_loads_stay_under_the_memory_limit(tmp_path: Path) -> None:
    from naiad.repository.memory import processes_memory

    data = tmp_path / "data"
    data.mkdir()
    names = ["h1", "h2", "h3"]
    for name in names:
        source = tmp_path / "sources" / name
        write_model(source.parent, name, IDENTITY_FP32.format(name=name), HEAVY_PY)
        with tarfile.open(data / f"{name}.tar.gz", "w:gz") as tar:
            tar.add(source, arcname=".")
    server = mme(tmp_path, str(data), "--model-memory-limit=300M", "--model-load-thread-count=3")
    try:
        # One at a time first: the server learns what each model takes.
        for name in names:
            assert invoke(server, f"{name}.tar.gz")["status"] == 200
        parent = psutil.Process(server.proc.pid)
        peak = 0
        done = threading.Event()

        def sample() -> None:
            nonlocal peak
            while not done.is_set():
                peak = max(peak, processes_memory(model_workers(parent)))
                time.sleep(0.02)

        sampler = threading.Thread(target=sample)
        sampler.start()
        try:
            for _ in range(2):  # two rounds of three misses at once: each load waits for room, then holds it
                for model in json.loads(server.sagemaker("GET", "/models")[2])["models"]:
                    server.sagemaker("DELETE", f"/models/{model['modelName']}")
                results = in_parallel(server, [f"{name}.tar.gz" for name in names])
                assert [r["status"] for r in results] == [200] * 3, results
        finally:
            done.set()
            sampler.join()
        assert peak <= 300 * 1024 * 1024 * 1.1, f"workers held {peak / 2**20:.0f} MiB at the peak"
        assert len([m for m in json.loads(server.sagemaker("GET", "/models")[2])["models"] if m]) <= 2
    finally:
        server.stop()


@pytest.mark.parametrize("processes", [1, 2])
def test_invocations_of_two_models_that_evict_each_other_are_all_answered(tmp_path: Path, processes: int) -> None:
    """A limit that holds one of two models, and both invoked at once, round after round: each load evicts the
    other model just as its requests are let through. One process queues those within the hit or the load that let
    them through; front-end processes send them after it, and the host loads the model again for any that an
    eviction overtook. Every invocation is answered, none with "has no available versions"."""
    data = tmp_path / "data"
    data.mkdir()
    for name in ("ha", "hb"):
        source = tmp_path / "sources" / name
        write_model(source.parent, name, IDENTITY_FP32.format(name=name), HEAVY_PY)
        with tarfile.open(data / f"{name}.tar.gz", "w:gz") as tar:
            tar.add(source, arcname=".")
    server = mme(tmp_path, str(data), "--model-memory-limit=200M", "--model-load-thread-count=2",
                 f"--frontend-processes={processes}")
    try:
        for name in ("ha", "hb"):  # one at a time first: the server learns what each model takes
            assert invoke(server, f"{name}.tar.gz")["status"] == 200
        for _ in range(4):
            results = in_parallel(server, ["ha.tar.gz", "hb.tar.gz"] * 4)  # a new connection each: any front end
            assert [r["status"] for r in results] == [200] * 8, [r for r in results if r["status"] != 200]
            assert {r["body"]["model_name"] for r in results} == {"ha.tar.gz", "hb.tar.gz"}
        assert server.log().count("evicting '") >= 4  # the models did take turns
    finally:
        server.stop()
