from __future__ import annotations

import io
import logging
import socket
import tarfile
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from naiad.core.errors import Code, InferError
from naiad.repository import sources
from naiad.repository.archive import extract_archive
from naiad.repository.sources import ModelDataSource, is_s3, materialize_repository, reset_s3_client, split_s3
from tests.s3 import S3Server

CONFIG = b'name: "add_sub"\nbackend: "python"\n'
MODEL = b"import triton_python_backend_utils as pb_utils\n"


@pytest.fixture
def aws(s3_server: S3Server, monkeypatch: pytest.MonkeyPatch) -> Iterator[S3Server]:
    """boto3's standard configuration pointed at the loopback store, for naiad's own client."""
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ROLE_ARN", "AWS_WEB_IDENTITY_TOKEN_FILE"):
        monkeypatch.delenv(name, raising=False)
    for name, value in s3_server.env().items():
        monkeypatch.setenv(name, value)
    reset_s3_client()
    yield s3_server
    reset_s3_client()


@pytest.fixture
def bucket(aws: S3Server) -> str:
    name = f"naiad-{uuid.uuid4().hex[:12]}"  # the store is shared by the session
    aws.client().create_bucket(Bucket=name)
    return name


def put(server: S3Server, bucket: str, key: str, data: bytes) -> None:
    server.client().put_object(Bucket=bucket, Key=key, Body=data)


def tar_gz(path: Path, files: dict[str, bytes]) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def code_of(call: Any) -> tuple[Code, str]:
    with pytest.raises(InferError) as raised:
        call()
    return raised.value.code, raised.value.message


# --- urls ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("url", "expected"), [
    ("s3://bucket", ("bucket", "")),
    ("s3://bucket/", ("bucket", "")),
    ("s3://bucket/prefix/", ("bucket", "prefix/")),
    ("s3://my.bucket-1/a/b/model.tar.gz", ("my.bucket-1", "a/b/model.tar.gz")),
])
def test_split_s3(url: str, expected: tuple[str, str]) -> None:
    assert is_s3(url)
    assert split_s3(url) == expected


@pytest.mark.parametrize(("url", "says"), [
    ("s3://", "names no bucket"),
    ("s3:///key", "names no bucket"),
    ("s3://localhost:9000/bucket/key", "set AWS_ENDPOINT_URL=http://localhost:9000"),
    ("s3://bad bucket/key", "invalid bucket name 'bad bucket'"),
    ("/local/folder", "is not an s3:// url"),
])
def test_split_s3_malformed(url: str, says: str) -> None:
    code, message = code_of(lambda: split_s3(url))
    assert code == Code.INVALID_ARG
    assert says in message, message


def test_boto3_is_imported_only_for_s3(tmp_path: Path) -> None:
    import subprocess
    import sys

    (tmp_path / "m.tar.gz").write_bytes(b"x")
    script = ("import sys; from pathlib import Path; from naiad.repository.sources import ModelDataSource; "
              f"ModelDataSource({str(tmp_path)!r}).fetch('m.tar.gz', Path({str(tmp_path / 'copy')!r})); "
              "assert 'boto3' not in sys.modules and 'botocore' not in sys.modules, 'imported'")
    subprocess.run([sys.executable, "-c", script], check=True, cwd=Path(__file__).parents[2])


# --- the model data url: a local folder ---------------------------------------------------------------------------


def test_local_folder_source(tmp_path: Path) -> None:
    data = tmp_path / "data"
    (data / "team").mkdir(parents=True)
    tar_gz(data / "team/add_sub.tar.gz", {"add_sub/config.pbtxt": CONFIG})
    source = ModelDataSource(str(data))
    dest = tmp_path / "download.tar.gz"
    dest.write_bytes(b"stale")
    size = source.fetch("team/add_sub.tar.gz", dest)
    assert size == dest.stat().st_size == (data / "team/add_sub.tar.gz").stat().st_size
    assert source.fetch("./team//add_sub.tar.gz", dest) == size
    code, message = code_of(lambda: source.fetch("team/other.tar.gz", dest))
    assert code == Code.NOT_FOUND
    assert message == f"model archive 'team/other.tar.gz' not found under '{data}'"
    assert code_of(lambda: source.fetch("team", dest))[0] == Code.NOT_FOUND  # a folder is not an archive


@pytest.mark.parametrize("url", ["LOCAL", "s3://nowhere-needed/prefix/"])
@pytest.mark.parametrize("relative", ["/etc/passwd", "../secret.tar.gz", "a/../../secret.tar.gz", "", ".", "a/.."])
def test_bad_relative_paths(tmp_path: Path, url: str, relative: str) -> None:
    """Refused before anything is read (so no S3 endpoint is needed)."""
    (tmp_path / "secret.tar.gz").write_bytes(b"secret")
    source = ModelDataSource(str(tmp_path / "data") if url == "LOCAL" else url)
    code, message = code_of(lambda: source.fetch(relative, tmp_path / "dest"))
    assert code == Code.INVALID_ARG
    assert f"model archive '{relative}'" in message
    assert not (tmp_path / "dest").exists()


# --- the model data url: S3 ---------------------------------------------------------------------------------------


def test_fetch_from_s3(aws: S3Server, bucket: str, tmp_path: Path) -> None:
    archive = tar_gz(tmp_path / "add_sub.tar.gz", {"add_sub/config.pbtxt": CONFIG, "add_sub/1/model.py": MODEL})
    put(aws, bucket, "prod/models/add_sub.tar.gz", archive.read_bytes())
    for url in (f"s3://{bucket}/prod/", f"s3://{bucket}/prod"):
        dest = tmp_path / "download.tar.gz"
        dest.write_bytes(b"")  # a temporary file made beforehand, as the caller does
        assert ModelDataSource(url).fetch("models/add_sub.tar.gz", dest) == archive.stat().st_size
        assert dest.read_bytes() == archive.read_bytes()
    extract_archive(dest, tmp_path / "model")
    assert (tmp_path / "model/add_sub/1/model.py").read_bytes() == MODEL


def test_fetch_from_a_whole_bucket(aws: S3Server, bucket: str, tmp_path: Path) -> None:
    put(aws, bucket, "m.tar.gz", b"abc")
    assert ModelDataSource(f"s3://{bucket}").fetch("m.tar.gz", tmp_path / "d") == 3


def test_missing_archive_and_bucket(aws: S3Server, bucket: str, tmp_path: Path) -> None:
    put(aws, bucket, "prod/a.tar.gz", b"abc")
    code, message = code_of(lambda: ModelDataSource(f"s3://{bucket}/prod/").fetch("b.tar.gz", tmp_path / "d"))
    assert code == Code.NOT_FOUND
    assert message == f"model archive 'b.tar.gz' not found under 's3://{bucket}/prod/'"
    code, message = code_of(lambda: ModelDataSource("s3://no-such-bucket-here/p/").fetch("a.tar.gz", tmp_path / "d"))
    assert code == Code.NOT_FOUND
    assert "not found under 's3://no-such-bucket-here/p/'" in message


def test_endpoint_down_is_unavailable(aws: S3Server, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{sock.getsockname()[1]}"
    monkeypatch.setenv("AWS_ENDPOINT_URL", closed)
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", closed)
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    reset_s3_client()
    code, message = code_of(lambda: ModelDataSource("s3://models/p/").fetch("a.tar.gz", tmp_path / "d"))
    assert code == Code.UNAVAILABLE
    assert message.startswith("cannot download model archive 'a.tar.gz' from 's3://models/p/': ")
    assert closed in message, message  # botocore's "Could not connect to the endpoint URL"


def test_bad_credentials_are_unavailable(aws: S3Server, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    reset_s3_client()
    code, message = code_of(lambda: ModelDataSource("s3://models/p/").fetch("a.tar.gz", tmp_path / "d"))
    assert code == Code.UNAVAILABLE
    assert "Unable to locate credentials" in message, message


def test_large_downloads_log_progress(aws: S3Server, bucket: str, tmp_path: Path,
                                      monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(sources, "_LARGE", 1000)
    put(aws, bucket, "big.tar.gz", b"0" * 200_000)
    with caplog.at_level(logging.INFO, logger="naiad.sources"):
        ModelDataSource(f"s3://{bucket}/").fetch("big.tar.gz", tmp_path / "d")
    lines = [r.getMessage() for r in caplog.records]
    assert f"downloading s3://{bucket}/big.tar.gz (0.2 MB)" in lines
    assert any(line.startswith(f"downloading s3://{bucket}/big.tar.gz: 50% (") and "MB/s)" in line
               for line in lines), lines
    assert any(line.startswith(f"downloaded s3://{bucket}/big.tar.gz: 0.2 MB in ") for line in lines), lines


def test_concurrent_fetches_share_the_client(aws: S3Server, bucket: str, tmp_path: Path) -> None:
    for i in range(8):
        put(aws, bucket, f"m{i}.tar.gz", bytes([i]) * (1000 + i))
    source = ModelDataSource(f"s3://{bucket}/")
    with ThreadPoolExecutor(8) as pool:
        sizes = list(pool.map(lambda i: source.fetch(f"m{i}.tar.gz", tmp_path / f"d{i}"), range(8)))
    assert sizes == [1000 + i for i in range(8)]
    assert all((tmp_path / f"d{i}").read_bytes() == bytes([i]) * (1000 + i) for i in range(8))


# --- --model-repository s3://... or an archive --------------------------------------------------------------------


def test_materialize_s3_prefix(aws: S3Server, bucket: str, tmp_path: Path) -> None:
    put(aws, bucket, "triton/add_sub/config.pbtxt", CONFIG)
    put(aws, bucket, "triton/add_sub/1/model.py", MODEL)
    put(aws, bucket, "triton/add_sub/2/", b"")  # a folder marker
    put(aws, bucket, "triton/envs/env.tar.gz", b"not expanded")
    put(aws, bucket, "tritonx/other/config.pbtxt", b"outside the prefix")
    folder = materialize_repository(f"s3://{bucket}/triton", tmp_path / "cache")
    assert folder.parent == tmp_path / "cache"
    assert sorted(str(p.relative_to(folder)) for p in folder.rglob("*")) == [
        "add_sub", "add_sub/1", "add_sub/1/model.py", "add_sub/2", "add_sub/config.pbtxt", "envs",
        "envs/env.tar.gz"]
    assert (folder / "add_sub/config.pbtxt").read_bytes() == CONFIG
    assert (folder / "envs/env.tar.gz").read_bytes() == b"not expanded"
    assert materialize_repository(f"s3://{bucket}/triton/", tmp_path / "cache") == folder  # unchanged: reused
    put(aws, bucket, "triton/add_sub/1/model.py", MODEL + b"# changed\n")
    changed = materialize_repository(f"s3://{bucket}/triton", tmp_path / "cache")
    assert changed != folder
    assert (changed / "add_sub/1/model.py").read_bytes().endswith(b"# changed\n")
    assert [p.name for p in (tmp_path / "cache").iterdir() if p.name.startswith(".")] == []  # no staging left


def test_materialize_s3_missing_or_empty(aws: S3Server, bucket: str, tmp_path: Path) -> None:
    put(aws, bucket, "elsewhere/x", b"x")
    code, message = code_of(lambda: materialize_repository(f"s3://{bucket}/triton", tmp_path / "cache"))
    assert code == Code.NOT_FOUND
    assert message == (f"model repository 's3://{bucket}/triton' not found: there are no objects under "
                       f"'s3://{bucket}/triton/'")
    code, message = code_of(lambda: materialize_repository("s3://no-such-bucket-here/triton", tmp_path / "cache"))
    assert code == Code.NOT_FOUND
    assert "bucket 'no-such-bucket-here' does not exist" in message


def test_materialize_s3_keys_that_climb_out(aws: S3Server, bucket: str, tmp_path: Path) -> None:
    put(aws, bucket, "triton/a/../../../evil", b"x")
    code, message = code_of(lambda: materialize_repository(f"s3://{bucket}/triton", tmp_path / "cache"))
    assert code == Code.INVALID_ARG
    assert "must not contain '..'" in message
    assert not list(tmp_path.rglob("evil"))


@pytest.mark.parametrize("top", ["", "repository/"])
def test_materialize_archive(tmp_path: Path, top: str) -> None:
    archive = tar_gz(tmp_path / "repo.tar.gz", {f"{top}add_sub/config.pbtxt": CONFIG,
                                                 f"{top}add_sub/1/model.py": MODEL,
                                                 f"{top}onnx_model/1/model.onnx": b"onnx"})
    folder = materialize_repository(str(archive), tmp_path / "cache")
    assert sorted(p.name for p in folder.iterdir()) == ["add_sub", "onnx_model"]
    assert (folder / "add_sub/1/model.py").read_bytes() == MODEL
    assert materialize_repository(str(archive), tmp_path / "cache") == folder


def test_materialize_bad_archive(tmp_path: Path) -> None:
    archive = tar_gz(tmp_path / "repo.tar.gz", {"add_sub/config.pbtxt": CONFIG, "../evil": b"x"})
    code, message = code_of(lambda: materialize_repository(str(archive), tmp_path / "cache"))
    assert code == Code.INVALID_ARG
    assert message == f"archive '{archive}' is not valid: member '../evil' leaves the target folder"
    assert not (tmp_path / "evil").exists()
    assert list((tmp_path / "cache").iterdir()) == []


def test_materialize_local_folder_and_missing_archive(tmp_path: Path) -> None:
    assert materialize_repository(str(tmp_path), tmp_path / "cache") == tmp_path.resolve()
    code, message = code_of(lambda: materialize_repository(str(tmp_path / "nope.tar.gz"), tmp_path / "cache"))
    assert code == Code.NOT_FOUND
    assert "nope.tar.gz" in message
