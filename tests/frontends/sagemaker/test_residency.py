"""Residency naiad owns: models loaded on demand (boto3's ``invoke_endpoint`` with ``TargetModel``) under
--model-memory-limit. A model is unloaded only for a load that can then fit, and one whose size is known (its
archive's member list, an earlier load) is refused before anything is evicted, extracted or downloaded; a request
in flight on a model being evicted is answered first. ``GET /models/<archive>`` finds a model filed under the
hash of its name."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
import threading
import time
from pathlib import Path

import pytest

from tests.frontends.sagemaker.test_multi_model import HEAVY_PY
from tests.frontends.sagemaker.test_parallel_loads import invoke, mme
from tests.models import IDENTITY_FP32, write_model

MIB = 1 << 20


class _Zeros(io.RawIOBase):
    """``size`` zero bytes, read without holding them: a large member that compresses to almost nothing."""

    def __init__(self, size: int) -> None:
        self.left = size

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:  # noqa: ANN001 - a writable buffer
        count = min(len(buffer), self.left)
        buffer[:count] = bytes(count)
        self.left -= count
        return count


def heavy_archive(tmp_path: Path, data: Path, name: str, mb: int, delay: float = 0.0, weights: int = 0) -> None:
    """A model holding ``mb`` MiB once loaded, with a ``weights``-MiB file beside it (zeros)."""
    source = tmp_path / "sources" / name
    write_model(source.parent, name, IDENTITY_FP32.format(name=name), HEAVY_PY.format(mb=mb, delay=delay))
    data.mkdir(exist_ok=True)
    with tarfile.open(data / f"{name}.tar.gz", "w:gz", compresslevel=1) as tar:
        tar.add(source, arcname=".")
        if weights:
            info = tarfile.TarInfo("1/weights.bin")
            info.size = weights * MIB
            tar.addfile(info, io.BufferedReader(_Zeros(info.size), MIB))


def refused(answer: dict) -> bool:
    """Answered as the runtime answers a 507 from the container: ModelError, OriginalStatusCode 507."""
    return answer["status"] == 424 and answer["error"].get("OriginalStatusCode") == 507


def keys(server) -> list[str]:  # noqa: ANN001 - RunningServer
    return sorted(m["modelName"] for m in json.loads(server.sagemaker("GET", "/models")[2])["models"] if m)


def key(target: str) -> str:
    return hashlib.md5(target.encode()).hexdigest()


def test_known_sizes_are_refused_before_anything_is_evicted_or_extracted(tmp_path: Path) -> None:
    data = tmp_path / "data"
    heavy_archive(tmp_path, data, "small", 100)
    heavy_archive(tmp_path, data, "wide", 1, weights=300)  # its member list says 300 MiB
    heavy_archive(tmp_path, data, "huge", 400)  # small files, 400 MiB once loaded
    server = mme(tmp_path, str(data), "--model-memory-limit=250M")
    try:
        assert invoke(server, "small.tar.gz")["status"] == 200
        answer = invoke(server, "wide.tar.gz")
        assert refused(answer), answer
        assert "Out of memory: model 'wide.tar.gz' needs 300.0 MiB" in json.dumps(answer["error"])
        assert keys(server) == [key("small.tar.gz")]
        assert "fetched 'wide.tar.gz'" not in server.log()  # not extracted
        assert not (tmp_path / "models" / key("wide.tar.gz")).exists()

        # huge's size is unknown until it loads (its files are small): small goes for it, then it measures over
        # the limit and is answered 507. Measured once, it is refused before its download, and small stays.
        assert refused(invoke(server, "huge.tar.gz"))
        assert invoke(server, "small.tar.gz")["status"] == 200
        evictions = server.log().count("evicting '")
        started = time.monotonic()
        answer = invoke(server, "huge.tar.gz")
        assert refused(answer) and time.monotonic() - started < 2, answer
        assert server.log().count("evicting '") == evictions
        assert server.log().count("fetched 'huge.tar.gz'") == 1  # not downloaded again
        assert keys(server) == [key("small.tar.gz")]
        assert invoke(server, "small.tar.gz")["status"] == 200
    finally:
        server.stop()


def test_eviction_waits_for_in_flight_requests(tmp_path: Path) -> None:
    data = tmp_path / "data"
    heavy_archive(tmp_path, data, "slow", 150, delay=1.5)
    heavy_archive(tmp_path, data, "other", 150)
    server = mme(tmp_path, str(data), "--model-memory-limit=250M")
    try:
        assert invoke(server, "slow.tar.gz")["status"] == 200
        answers: list[dict] = []
        thread = threading.Thread(target=lambda: answers.append(invoke(server, "slow.tar.gz")))
        thread.start()
        time.sleep(0.4)  # the request is executing when the load below has to evict its model
        assert invoke(server, "other.tar.gz")["status"] == 200
        thread.join()
        assert answers and answers[0]["status"] == 200, answers
        assert keys(server) == [key("other.tar.gz")]
        assert "evicting 'slow.tar.gz'" in server.log()
    finally:
        server.stop()


@pytest.mark.parametrize("processes", [1, 2])
def test_get_answers_for_the_archive_name(tmp_path: Path, processes: int) -> None:
    data = tmp_path / "data"
    heavy_archive(tmp_path, data, "add", 1)
    server = mme(tmp_path, str(data), f"--frontend-processes={processes}")
    try:
        assert invoke(server, "add.tar.gz")["status"] == 200
        status, _, body = server.sagemaker("GET", "/models/add.tar.gz")
        assert status == 200, body
        assert json.loads(body) == {"modelName": key("add.tar.gz"),
                                    "modelUrl": str(tmp_path / "models" / key("add.tar.gz"))}
        assert server.sagemaker("GET", f"/models/{key('add.tar.gz')}")[2] == body
        assert server.sagemaker("GET", "/models/other.tar.gz")[:3:2] == (404, b"")
    finally:
        server.stop()
