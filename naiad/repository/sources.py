"""Where model files come from besides a local folder: S3 (through boto3, with the standard AWS configuration)
and ``.tar.gz`` archives.

Two users: SageMaker's model data url (``--sagemaker-model-data-url``, a folder or ``s3://bucket/prefix/`` of
model archives fetched one at a time on demand) and ``--model-repository`` given as ``s3://bucket/prefix`` or
as an archive, made into a local folder before the server starts. Credentials, region and endpoint are boto3's
own business (environment, profile, ``AWS_ENDPOINT_URL`` / ``AWS_ENDPOINT_URL_S3``), so the code path against
an S3-compatible store is the one against AWS. boto3 is imported only when S3 is used.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import shutil
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from naiad.core.errors import InferError, invalid, not_found, unavailable

log = logging.getLogger("naiad.sources")

_SCHEME = "s3://"
# Bucket names are lower case today; older buckets may have capitals and underscores.
_BUCKET = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{1,254}$")
_LARGE = 16 << 20  # downloads from this size on log their progress
_ARCHIVE_SUFFIXES = (".tar.gz", ".tgz", ".tar")


# --- s3:// urls and the client ------------------------------------------------------------------------------------


def is_s3(url: str) -> bool:
    return url.startswith(_SCHEME)


def split_s3(url: str) -> tuple[str, str]:
    """``s3://bucket/key/or/prefix`` -> (bucket, key); the key may be empty (the whole bucket)."""
    if not is_s3(url):
        raise invalid(f"'{url}' is not an s3:// url (expected s3://bucket/prefix)")
    bucket, _, key = url[len(_SCHEME):].partition("/")
    if not bucket:
        raise invalid(f"s3 url '{url}' names no bucket (expected s3://bucket/prefix)")
    if ":" in bucket:  # Triton's s3://host:port/bucket/... form
        raise invalid(f"s3 url '{url}' names an endpoint ('{bucket}'); naiad takes the endpoint from the AWS "
                      f"configuration instead: set AWS_ENDPOINT_URL=http://{bucket} and use s3://<bucket>/<prefix>")
    if not _BUCKET.match(bucket):
        raise invalid(f"s3 url '{url}' has an invalid bucket name '{bucket}'")
    return bucket, key


NO_BOTO3 = "s3:// urls need boto3, which is not installed: pip install 'naiad[s3]'"


def require_boto3(what: str) -> None:
    """Refuse at start-up an ``s3://`` url that could never be read, rather than failing every later load."""
    try:
        import boto3  # noqa: F401 - only whether it imports
    except ImportError:
        raise invalid(f"{what}: {NO_BOTO3}") from None


_client_lock = threading.Lock()
_client: tuple[int, Any] | None = None  # (pid, client): a forked child makes its own


def s3_client() -> Any:
    """The process's S3 client (boto3 clients are thread-safe), made on first use from the standard AWS
    configuration: environment, shared config / credentials files and profile, ``AWS_ENDPOINT_URL[_S3]``."""
    global _client
    with _client_lock:
        if _client is None or _client[0] != os.getpid():
            try:
                import boto3
                from botocore.config import Config
            except ImportError:
                raise unavailable(NO_BOTO3) from None
            # Several on-demand loads may download at once, each with s3transfer's parallel range requests.
            config = Config(max_pool_connections=32, user_agent_extra="naiad")
            _client = (os.getpid(), boto3.session.Session().client("s3", config=config))
        return _client[1]


def reset_s3_client() -> None:
    """Forget the client, so the next use reads the AWS configuration again (tests change it)."""
    global _client
    with _client_lock:
        _client = None


def _s3_failure(exc: Exception, missing: str, action: str) -> InferError:
    """botocore's error as ours: a missing key or bucket is NOT_FOUND (``missing``), anything else
    (credentials, permissions, an endpoint that does not answer) UNAVAILABLE with botocore's message."""
    if isinstance(exc, InferError):
        return exc
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        code = str(response.get("Error", {}).get("Code", ""))
        status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        if code in ("404", "NoSuchKey", "NotFound", "NoSuchBucket") or status == 404:
            return not_found(missing)
    return unavailable(f"{action}: {exc}")


# --- relative paths ------------------------------------------------------------------------------------------------


def _relative_parts(relative: str, what: str) -> list[str]:
    """A path below a url, as components; refused when absolute or when it climbs out with ``..``."""
    if not relative or "\x00" in relative:
        raise invalid(f"{what} '{relative}' is not a valid path")
    if relative.startswith("/"):
        raise invalid(f"{what} '{relative}' must be a relative path, not an absolute one")
    parts = [p for p in relative.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise invalid(f"{what} '{relative}' must not contain '..'")
    if not parts:
        raise invalid(f"{what} '{relative}' is not a valid path")
    return parts


class _Progress:
    """boto3's download callback (called from s3transfer's threads): a line every 25% for large objects."""

    def __init__(self, what: str, total: int) -> None:
        self.what = what
        self.total = total
        self.done = 0
        self.mark = 0.25
        self.started = time.perf_counter()
        self.lock = threading.Lock()
        self.loud = total >= _LARGE
        if self.loud:
            log.info("downloading %s (%.1f MB)", what, total / 1e6)

    def __call__(self, count: int) -> None:
        with self.lock:
            self.done += count
            while self.loud and self.mark < 1 and self.done >= self.mark * self.total:
                log.info("downloading %s: %d%% (%.1f of %.1f MB, %.1f MB/s)", self.what, round(self.mark * 100),
                         self.done / 1e6, self.total / 1e6, self.rate())
                self.mark += 0.25

    def rate(self) -> float:
        return self.done / 1e6 / max(time.perf_counter() - self.started, 1e-6)

    def finish(self) -> None:
        level = logging.INFO if self.loud else logging.DEBUG
        log.log(level, "downloaded %s: %.1f MB in %.2f s (%.1f MB/s)", self.what, self.done / 1e6,
                time.perf_counter() - self.started, self.rate())


# --- a store of model archives -------------------------------------------------------------------------------------


class ModelDataSource:
    """A local folder or ``s3://bucket/prefix/`` holding model archives, fetched one at a time by their path
    below it (SageMaker's ModelDataUrl is one: invocations name the archive as ``TargetModel``)."""

    def __init__(self, url: str) -> None:
        self.url = url
        if is_s3(url):
            self.bucket, prefix = split_s3(url)
            self.prefix = prefix if not prefix or prefix.endswith("/") else prefix + "/"
            self.folder: Path | None = None
            self.shown = f"{_SCHEME}{self.bucket}/{self.prefix}"
        else:
            self.bucket, self.prefix = "", ""
            self.folder = Path(url.removeprefix("file://")).expanduser()
            self.shown = url

    def __repr__(self) -> str:
        return f"ModelDataSource({self.shown!r})"

    def fetch(self, relative: str, dest: Path) -> int:
        """Copy or download ``<url>/<relative>`` to the file ``dest`` (replaced if it exists); return its
        size. NOT_FOUND when there is no such archive, INVALID_ARG for an absolute path or ``..``,
        UNAVAILABLE when S3 cannot be reached or refuses (botocore's message)."""
        parts = _relative_parts(relative, "model archive")
        missing = f"model archive '{relative}' not found under '{self.shown}'"
        if self.folder is not None:
            source = self.folder.joinpath(*parts)
            if not source.is_file():
                raise not_found(missing)
            started = time.perf_counter()
            try:
                shutil.copyfile(source, dest)
            except OSError as exc:
                raise unavailable(f"cannot copy model archive '{relative}' from '{self.shown}': {exc}") from None
            size = Path(dest).stat().st_size
            log.log(logging.INFO if size >= _LARGE else logging.DEBUG, "copied %s: %.1f MB in %.2f s",
                    source, size / 1e6, time.perf_counter() - started)
            return size
        key = self.prefix + "/".join(parts)
        action = f"cannot download model archive '{relative}' from '{self.shown}'"
        client = s3_client()
        try:
            head = client.head_object(Bucket=self.bucket, Key=key)
            progress = _Progress(f"{_SCHEME}{self.bucket}/{key}", int(head.get("ContentLength", 0)))
            # Two 8 MiB parts at a time: the default (10 threads) holds far more in the server than a model
            # download is worth, outside --model-memory-limit.
            client.download_file(self.bucket, key, str(dest), Callback=progress, Config=_transfer_config())
        except Exception as exc:  # botocore's, s3transfer's and boto3's errors have no common base
            raise _s3_failure(exc, missing, action) from None
        progress.finish()
        return Path(dest).stat().st_size


# --- --model-repository s3://... or archive ----------------------------------------------------------------------


def materialize_repository(spec: str, cache_root: Path, archive_limits: tuple[int, int] | None = None) -> Path:
    """A model repository as a local folder: a folder is itself; an archive is extracted (safely) under
    ``cache_root``, the repository being its top or its one top-level folder; ``s3://bucket/prefix`` is mirrored
    object by object under ``cache_root`` (archives in it stay archives). Copies are named by what they hold
    (archive path, size and mtime; the listing's keys, sizes and ETags), so a restart with the same contents
    reuses its copy. ``archive_limits``: (bytes, members) an archive may hold (default: archive.py's)."""
    if is_s3(spec):
        return _mirror_s3(spec, Path(cache_root))
    path = Path(spec).expanduser()
    if path.is_dir():
        return path.resolve()
    if path.is_file():
        return _unpack(path, Path(cache_root), archive_limits)
    if spec.endswith(_ARCHIVE_SUFFIXES):
        raise not_found(f"model repository archive '{spec}' not found")
    return path.resolve()  # a missing folder: the repository reports it as Triton does


def _safe_name(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("._")[:64] or "repository"


def _publish(staging: Path, folder: Path) -> None:
    """Move a finished copy into place; when another process got there first, keep theirs."""
    try:
        os.rename(staging, folder)
    except OSError:
        shutil.rmtree(staging, ignore_errors=True)
        if not folder.is_dir():
            raise


def _unpack(archive: Path, cache_root: Path, limits: tuple[int, int] | None) -> Path:
    from naiad.repository.archive import extract_archive

    stat = archive.stat()
    identity = f"{archive.resolve()}\0{stat.st_size}\0{stat.st_mtime_ns}"
    stem = archive.name
    for suffix in _ARCHIVE_SUFFIXES:
        stem = stem.removesuffix(suffix)
    folder = cache_root / f"archive-{_safe_name(stem)}-{hashlib.sha256(identity.encode()).hexdigest()[:16]}"
    if folder.is_dir():
        log.info("model repository %s: using the copy extracted before in %s", archive, folder)
    else:
        cache_root.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=cache_root))
        size = extract_archive(archive, staging, *(limits or ()), label=str(archive))
        _publish(staging, folder)
        log.info("model repository %s: extracted %.1f MB into %s", archive, size / 1e6, folder)
    return _repository_root(folder)


def _looks_like_model(folder: Path) -> bool:
    """A Triton model folder: a config.pbtxt, or numeric version folders (auto-completed configs)."""
    if (folder / "config.pbtxt").is_file():
        return True
    return any(child.is_dir() and child.name.isdigit() for child in folder.iterdir())


def _repository_root(folder: Path) -> Path:
    """The folder that holds model folders: the archive's top, or its one top-level folder."""
    subdirs = [c for c in folder.iterdir() if c.is_dir() and not c.name.startswith(".") and c.name != "__MACOSX"]
    if any(_looks_like_model(d) for d in subdirs):
        return folder
    if len(subdirs) == 1 and any(_looks_like_model(d) for d in subdirs[0].iterdir() if d.is_dir()):
        return subdirs[0]
    return folder  # no model folders anywhere: the repository says so when it loads


def _mirror_s3(spec: str, cache_root: Path) -> Path:
    bucket, key = split_s3(spec)
    prefix = key if not key or key.endswith("/") else key + "/"
    where = f"{_SCHEME}{bucket}/{prefix}"
    client = s3_client()
    listing: list[tuple[str, int, str]] = []  # (key, size, etag)
    try:
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
            listing.extend((o["Key"], int(o.get("Size", 0)), str(o.get("ETag", ""))) for o in page.get("Contents", []))
    except Exception as exc:
        raise _s3_failure(exc, f"model repository '{spec}' not found: bucket '{bucket}' does not exist",
                          f"cannot list model repository '{spec}'") from None
    if not listing:
        raise not_found(f"model repository '{spec}' not found: there are no objects under '{where}'")

    files: dict[str, str] = {}  # relative path -> key
    folders: set[str] = set()
    for object_key, _, _ in listing:
        relative = object_key[len(prefix):]
        if not relative.strip("/"):
            continue  # the prefix's own folder marker
        parts = _relative_parts(relative, f"model repository '{spec}': object")
        folders.update("/".join(parts[:i]) for i in range(1, len(parts)))
        if object_key.endswith("/"):
            folders.add("/".join(parts))  # a folder marker (what the console's "create folder" makes)
        else:
            files["/".join(parts)] = object_key
    clash = sorted(set(files) & folders)
    if clash:
        raise invalid(f"model repository '{spec}': '{where}{clash[0]}' is both an object and a folder")

    digest = hashlib.sha256(repr((client.meta.endpoint_url, bucket, prefix, sorted(listing))).encode())
    folder = cache_root / f"s3-{_safe_name(bucket)}-{_safe_name(prefix)}-{digest.hexdigest()[:16]}"
    if folder.is_dir():
        log.info("model repository %s: unchanged, using the copy in %s", spec, folder)
        return folder
    cache_root.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=cache_root))
    try:
        for name in folders:
            staging.joinpath(*name.split("/")).mkdir(parents=True, exist_ok=True)
        started = time.perf_counter()
        _download_all(client, bucket, {staging.joinpath(*name.split("/")): k for name, k in files.items()}, spec)
        size = sum(size for _, size, _ in listing)
        log.info("model repository %s: %d files, %.1f MB in %.2f s into %s", spec, len(files), size / 1e6,
                 time.perf_counter() - started, folder)
        _publish(staging, folder)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return folder


def _download_all(client: Any, bucket: str, targets: dict[Path, str], spec: str) -> None:
    """Every object at once through one s3transfer manager (its threads, its range requests for large ones)."""
    from boto3.s3.transfer import TransferConfig, create_transfer_manager

    with create_transfer_manager(client, TransferConfig()) as manager:
        futures = [(key, manager.download(bucket, key, str(path))) for path, key in targets.items()]
        for key, future in futures:
            try:
                future.result()
            except Exception as exc:
                raise _s3_failure(exc, f"model repository '{spec}': object '{key}' disappeared while downloading",
                                  f"cannot download '{_SCHEME}{bucket}/{key}' of model repository '{spec}'") from None


def _transfer_config() -> Any:
    from boto3.s3.transfer import TransferConfig

    return TransferConfig(max_concurrency=2, multipart_chunksize=8 << 20, max_io_queue=16)
