#!/usr/bin/env python3
"""Capture golden answers from real NVIDIA Triton 2.51 in SageMaker mode.

Starts the real tritonserver (through the peer script, see --peer) with
`--allow-sagemaker=true` the way Triton's docker/sagemaker/serve script does,
in several configurations (single-model endpoints with various default models,
a multi-model endpoint, runs that crash or hang on purpose), sends a fixed list
of requests with the standard library's http.client (one connection per
request), and writes one JSON file per request under
tests/golden/triton-2.51-sagemaker/<session>/... plus the server logs, a
sessions.json (flags and environment of every run) and a summary.md.

Triton 2.51 only accepts multi-model urls shaped like
/opt/ml/models/<hash>/model[/<subdir>], so the script lays models out under
/opt/ml (it must run as root): /opt/ml/model is the single-model repository
(as SageMaker mounts it) and /opt/ml/models/<hash>/model the multi-model
archives. It refuses to touch an /opt/ml it did not create (marker file
/opt/ml/.naiad-golden-capture) and removes what it made when done.

Usage (from the repository root):

    python3 tools/capture_sagemaker_golden.py [--peer PATH] [--out DIR] [--port-base N]

Record format: as tools/capture_triton_golden.py ("description", "request",
"status", "reason", "headers", "all_headers", "body", "body_text"), except
that "headers" keeps only content-type, binary responses are split at the
json-header-size=N of their Content-Type ("body_json_part",
"body_json_part_text", "body_binary_part_base64"), and:
    "setup"         multi-model cases only: the model folders that must exist,
                    a list of {"url", "layout": "single" | "repository" |
                    "absent", "source" (single) or "models" (repository: each
                    {"name", "source"})}; sources are repository-relative.
                    Every file of a sequence folder carries the whole
                    sequence's setup.
    "client_error"  instead of a status when the server closed the connection
                    without answering (crash) or did not answer in time
                    (with "client_timeout_s").
    "server_exit_code", "server_alive_after"
                    on the requests that crash the server.
Files named `NN_step.json` in a folder form a sequence: replay them in order.
The script is re-runnable: it rebuilds every session folder and overwrites
its top-level files; README.md in the output folder is left alone.
"""

from __future__ import annotations

import argparse
import base64
import gzip
import http.client
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from capture_triton_golden import (  # noqa: E402  (sibling script, shared helpers)
    ADD_SUB_IN0,
    ADD_SUB_IN1,
    TritonRun,
    add_sub_body,
    binary_body,
    encode_body_for_record,
    fp32_input,
    pack_bytes_elements,
    pack_fp32,
    start_triton,
    stop_triton,
)

REPO_ROOT = Path(__file__).resolve().parents[1]
GOLDEN_MODELS = REPO_ROOT / "tests" / "golden_models"
GOLDEN_BAD_MODELS = REPO_ROOT / "tests" / "golden_bad_models"
SAGEMAKER_MODELS = REPO_ROOT / "tests" / "golden_sagemaker_models"
DEFAULT_OUT = REPO_ROOT / "tests" / "golden" / "triton-2.51-sagemaker"
DEFAULT_PEER = Path("/work/shared/peers/triton.sh")

OPT_ML = Path("/opt/ml")
OPT_ML_MARKER = OPT_ML / ".naiad-golden-capture"
SME_REPOSITORY = OPT_ML / "model"  # where SageMaker mounts a single-model archive
MODELS_ROOT = OPT_ML / "models"  # where SageMaker puts multi-model archives
# Fixed (not tempfile-based) paths: they show up in recorded bodies.
OUTSIDE_ROOT = Path("/tmp/naiad-golden-sagemaker-outside")
EMPTY_REPOSITORY = Path("/tmp/naiad-golden-sagemaker-empty")

STARTED_MARKER = "Started Sagemaker HTTPService"
BINARY_MIME = "application/vnd.sagemaker-triton.binary+json;json-header-size="
TARGET_HEADER = "X-Amzn-SageMaker-Target-Model"
CLIENT_TIMEOUT_S = 60.0
HANG_TIMEOUT_S = 15.0

Json = Any


# --------------------------------------------------------------------------
# Server runs
# --------------------------------------------------------------------------


def serve_flags(sagemaker_port: int, *, load_model: str | None = None,
                namespacing: bool = True, extra: Sequence[str] = ()) -> list[str]:
    """The flags docker/sagemaker/serve (2.51) passes with its defaults, minus
    --model-repository (the peer script passes it)."""
    flags = [
        "--allow-sagemaker=true", "--allow-http=false", "--model-control-mode=explicit",
        f"--model-namespacing={'true' if namespacing else 'false'}",
        f"--sagemaker-port={sagemaker_port}",
        "--allow-grpc=false", "--allow-metrics=false", "--log-verbose=true",
        "--backend-config=python,shm-default-byte-size=16777216",
        "--backend-config=python,shm-growth-byte-size=1048576",
    ]
    if load_model is not None:
        flags.append(f"--load-model={load_model}")
    return [*flags, *extra]


@dataclass
class SessionSpec:
    """How one tritonserver run is started (also written to sessions.json)."""

    name: str
    description: str
    repository: Path
    env: dict[str, str]
    load_model: str | None = None
    namespacing: bool = True
    extra_flags: tuple[str, ...] = ()

    def flags(self, sagemaker_port: int) -> list[str]:
        return serve_flags(sagemaker_port, load_model=self.load_model,
                           namespacing=self.namespacing, extra=self.extra_flags)

    def describe(self, sagemaker_port: int) -> dict[str, Any]:
        repo: dict[str, Any] = {"path": str(self.repository)}
        if self.repository == SME_REPOSITORY:
            repo["models"] = {name: rel(src) for name, src in SME_MODELS.items()}
        return {
            "description": self.description,
            "flags": [f"--model-repository={self.repository}", *self.flags(sagemaker_port)],
            "env": self.env,
            "repository": repo,
        }


def wait_started(run: TritonRun, timeout_s: float = 180.0) -> str:
    """Wait until the SageMaker HTTP service is up: "started", "exited" or "timeout"."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if run.process.poll() is not None:
            return "exited"
        if STARTED_MARKER in run.log_text():
            time.sleep(0.5)
            return "started"
        time.sleep(0.25)
    return "timeout"


def start_session(peer: Path, spec: SessionSpec, port_base: int, out: Path) -> TritonRun:
    # HTTP/GRPC/metrics ports are passed (the peer script wants them) but disabled.
    return start_triton(peer, spec.repository, port_base, out / f"{spec.name}_log.txt",
                        extra_flags=spec.flags(port_base + 3), env_extra=spec.env)


@contextmanager
def sagemaker_triton(peer: Path, spec: SessionSpec, port_base: int,
                     out: Path) -> Iterator[TritonRun]:
    run = start_session(peer, spec, port_base, out)
    outcome = wait_started(run)
    if outcome != "started":
        stop_triton(run)
        raise RuntimeError(f"tritonserver {outcome} before serving SageMaker HTTP, "
                           f"see {out / (spec.name + '_log.txt')}")
    try:
        yield run
        if run.process.poll() is not None:
            raise RuntimeError(f"tritonserver exited during session {spec.name}")
    finally:
        stop_triton(run)


# --------------------------------------------------------------------------
# Model layouts under /opt/ml
# --------------------------------------------------------------------------


def rel(path: Path) -> str:
    return str(path.relative_to(REPO_ROOT))


def copy_model(source: Path, dest: Path) -> None:
    # Copies, not links: tracebacks in bodies then name /opt/ml paths.
    shutil.copytree(source, dest, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))


@dataclass(frozen=True)
class Layout:
    """A model folder at a multi-model url, as a SageMaker archive extracts."""

    url: str
    layout: str  # "single" | "repository" | "absent"
    source: Path | None = None  # single: the model folder copied to url
    models: tuple[tuple[str, Path], ...] = ()  # repository: (folder name, source)

    def record(self) -> dict[str, Any]:
        item: dict[str, Any] = {"url": self.url, "layout": self.layout}
        if self.layout == "single" and self.source is not None:
            item["source"] = rel(self.source)
        if self.layout == "repository":
            item["models"] = [{"name": n, "source": rel(s)} for n, s in self.models]
        return item

    def materialize(self) -> None:
        target = Path(self.url)
        if target.exists():
            shutil.rmtree(target)
        if self.layout == "single" and self.source is not None:
            target.parent.mkdir(parents=True, exist_ok=True)
            copy_model(self.source, target)
        elif self.layout == "repository":
            target.mkdir(parents=True)
            for name, source in self.models:
                copy_model(source, target / name)


def url_for(model_hash: str) -> str:
    return f"{MODELS_ROOT}/{model_hash}/model"


def single(model_hash: str, source: Path) -> Layout:
    return Layout(url_for(model_hash), "single", source=source)


def repository(url: str, *models: tuple[str, Path]) -> Layout:
    return Layout(url, "repository", models=tuple(models))


ADD_SUB = GOLDEN_MODELS / "add_sub"
ENSEMBLE_REPO = SAGEMAKER_MODELS / "sm_ensemble_repo"
ENSEMBLE_MODELS = tuple((name, ENSEMBLE_REPO / name)
                        for name in ("sm_ensemble", "sm_offset", "sm_scale"))

SME_MODELS: dict[str, Path] = {
    "add_sub": ADD_SUB,
    "identity_bytes": GOLDEN_MODELS / "identity_bytes",
    "sm_identity_fp32": SAGEMAKER_MODELS / "sm_identity_fp32",
    "sm_raw_bytes": SAGEMAKER_MODELS / "sm_raw_bytes",
    "sm_errors": SAGEMAKER_MODELS / "sm_errors",
    "sm_init_raises": SAGEMAKER_MODELS / "sm_init_raises",
}


def prepare_opt_ml() -> None:
    """Create /opt/ml/model (SME repository) and an empty /opt/ml/models."""
    if OPT_ML.exists() and any(OPT_ML.iterdir()) and not OPT_ML_MARKER.exists():
        raise SystemExit(f"{OPT_ML} exists and was not made by this script "
                         f"(no {OPT_ML_MARKER}); not touching it")
    OPT_ML.mkdir(parents=True, exist_ok=True)
    OPT_ML_MARKER.write_text("made by tools/capture_sagemaker_golden.py\n")
    for path in (SME_REPOSITORY, MODELS_ROOT, OUTSIDE_ROOT, EMPTY_REPOSITORY):
        if path.exists():
            shutil.rmtree(path)
    SME_REPOSITORY.mkdir()
    for name, source in SME_MODELS.items():
        copy_model(source, SME_REPOSITORY / name)
    MODELS_ROOT.mkdir()
    EMPTY_REPOSITORY.mkdir()


def cleanup_opt_ml() -> None:
    for path in (SME_REPOSITORY, MODELS_ROOT, OUTSIDE_ROOT, EMPTY_REPOSITORY):
        shutil.rmtree(path, ignore_errors=True)
    OPT_ML_MARKER.unlink(missing_ok=True)
    if OPT_ML.exists() and not any(OPT_ML.iterdir()):
        OPT_ML.rmdir()


# --------------------------------------------------------------------------
# Requests and recording
# --------------------------------------------------------------------------


def parse_response(status: int, reason: str, headers: list[tuple[str, str]],
                   body: bytes) -> dict[str, Any]:
    lower = {k.lower(): v for k, v in headers}
    content_type = lower.get("content-type")
    result: dict[str, Any] = {
        "status": status,
        "reason": reason,
        "headers": {"content-type": content_type} if content_type is not None else {},
        "all_headers": [[k, v] for k, v in headers],
    }
    header_len: int | None = None
    if content_type is not None and content_type.startswith(BINARY_MIME):
        match = re.match(r"\d+", content_type[len(BINARY_MIME):])
        header_len = int(match.group()) if match else None
    parsed: Any = None
    is_json = False
    if header_len is None:
        try:
            parsed = json.loads(body.decode("utf-8"))
            is_json = True
        except (UnicodeDecodeError, ValueError):
            pass
    result["body"] = parsed if is_json else base64.b64encode(body).decode("ascii")
    try:
        result["body_text"] = body.decode("utf-8")
    except UnicodeDecodeError:
        pass
    if header_len is not None:
        json_part = body[:header_len]
        try:
            result["body_json_part"] = json.loads(json_part.decode("utf-8"))
            result["body_json_part_text"] = json_part.decode("utf-8")
        except (UnicodeDecodeError, ValueError):
            result["body_json_part_base64"] = base64.b64encode(json_part).decode("ascii")
        result["body_binary_part_base64"] = base64.b64encode(body[header_len:]).decode("ascii")
    return result


def do_request(port: int, method: str, path: str, body: bytes | None,
               headers: dict[str, str], timeout_s: float) -> dict[str, Any]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout_s)
    try:
        conn.request(method, path, body=body, headers=headers)
        resp = conn.getresponse()
        data = resp.read()
        return parse_response(resp.status, resp.reason, resp.getheaders(), data)
    except TimeoutError:
        return {"status": None, "headers": {}, "body": None, "client_error": "TimeoutError",
                "client_timeout_s": timeout_s}
    except (OSError, http.client.HTTPException) as exc:
        # The class name only: the errno text of a reset varies with timing.
        return {"status": None, "headers": {}, "body": None,
                "client_error": type(exc).__name__}
    finally:
        conn.close()


def encode_payload(body: bytes | str | Json | None) -> bytes | None:
    if body is None or isinstance(body, bytes):
        return body
    if isinstance(body, str):
        return body.encode("utf-8")
    return json.dumps(body, separators=(",", ":")).encode("utf-8")


@dataclass
class Recorder:
    """Sends requests to one server and writes one golden file per request."""

    out_dir: Path
    port: int
    setup: list[Layout] | None = None  # multi-model sessions: written in every file

    def request(self, name: str, description: str, method: str, path: str,
                body: bytes | str | Json | None = None,
                headers: dict[str, str] | None = None,
                timeout_s: float = CLIENT_TIMEOUT_S,
                extra: dict[str, Any] | None = None) -> dict[str, Any]:
        payload = encode_payload(body)
        sent_headers = dict(headers or {})
        response = do_request(self.port, method, path, payload, sent_headers, timeout_s)
        request_record: dict[str, Any] = {"method": method, "path": path,
                                          "headers": sent_headers}
        request_record.update(encode_body_for_record(payload))
        record: dict[str, Any] = {"description": description, "request": request_record}
        if self.setup is not None:
            record["setup"] = [layout.record() for layout in self.setup]
        record.update(response)
        record.update(extra or {})
        self.write(name, record)
        return record

    def write(self, name: str, record: dict[str, Any]) -> None:
        path = self.out_dir / f"{name}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(record, indent=2, ensure_ascii=False) + "\n")

    def sequence(self, folder: str, setup: Sequence[Layout] = ()) -> SequenceRecorder:
        for layout in setup:
            layout.materialize()
        return SequenceRecorder(Recorder(self.out_dir / folder, self.port, list(setup)))


@dataclass
class SequenceRecorder:
    """Numbers the files of an ordered sequence: 00_<step>.json, 01_..."""

    rec: Recorder
    count: int = field(default=0)

    def step(self, name: str, description: str, method: str, path: str,
             body: bytes | str | Json | None = None,
             headers: dict[str, str] | None = None, **kwargs: Any) -> dict[str, Any]:
        record = self.rec.request(f"{self.count:02d}_{name}", description, method, path,
                                  body, headers, **kwargs)
        self.count += 1
        return record


# --------------------------------------------------------------------------
# Request builders
# --------------------------------------------------------------------------


def sm_binary_headers(header_len: int | str) -> dict[str, str]:
    return {"Content-Type": f"{BINARY_MIME}{header_len}"}


def add_sub_binary(**extra: Any) -> tuple[bytes, int]:
    header: dict[str, Any] = {"inputs": [
        {"name": "INPUT0", "shape": [4], "datatype": "FP32",
         "parameters": {"binary_data_size": 16}},
        {"name": "INPUT1", "shape": [4], "datatype": "FP32",
         "parameters": {"binary_data_size": 16}},
    ]}
    header.update(extra)
    return binary_body(header, [pack_fp32(ADD_SUB_IN0), pack_fp32(ADD_SUB_IN1)])


def mode_body(mode: int) -> dict[str, Any]:
    return {"inputs": [{"name": "MODE", "shape": [1], "datatype": "INT32", "data": [mode]}]}


def int32_raw(value: int) -> bytes:
    return value.to_bytes(4, "little", signed=True)


def load_body(model_hash: str, url: str) -> dict[str, str]:
    return {"model_name": model_hash, "url": url}


def target(name: str) -> dict[str, str]:
    return {TARGET_HEADER: name}


ENSEMBLE_INPUT = {"inputs": [fp32_input("INPUT", ADD_SUB_IN0)]}


# --------------------------------------------------------------------------
# Single-model endpoint (SME) captures
# --------------------------------------------------------------------------


def capture_sme_ping(rec: Recorder) -> None:
    d = "ping"
    rec.request(f"{d}/get_ping", "GET /ping (ping mode ready, default model loaded)",
                "GET", "/ping")
    rec.request(f"{d}/post_ping", "POST /ping", "POST", "/ping", body="")
    rec.request(f"{d}/put_ping", "PUT /ping", "PUT", "/ping", body="")
    rec.request(f"{d}/delete_ping", "DELETE /ping", "DELETE", "/ping")
    rec.request(f"{d}/head_ping", "HEAD /ping", "HEAD", "/ping")
    rec.request(f"{d}/get_ping_trailing_slash", "GET /ping/ (the route is an exact match)",
                "GET", "/ping/")
    rec.request(f"{d}/get_ping_query", "GET /ping?probe=1 (the query is not part of the path)",
                "GET", "/ping?probe=1")
    rec.request(f"{d}/get_ping_double_slash", "GET //ping", "GET", "//ping")
    rec.request(f"{d}/get_ping_upper_case", "GET /PING", "GET", "/PING")


def capture_sme_invocations(rec: Recorder) -> None:
    d = "invocations"
    url = "/invocations"
    rec.request(f"{d}/json_ok", "add_sub KServe JSON without Content-Type", "POST", url,
                body=add_sub_body())
    rec.request(f"{d}/json_ok_content_type_json", "add_sub JSON with Content-Type: application/json",
                "POST", url, body=add_sub_body(), headers={"Content-Type": "application/json"})
    rec.request(f"{d}/json_with_id", 'request "id" is echoed', "POST", url,
                body=add_sub_body(id="sm-request-1"))
    rec.request(f"{d}/json_binary_data_output", 'parameters {"binary_data_output": true}: '
                "the response Content-Type carries json-header-size", "POST", url,
                body=add_sub_body(parameters={"binary_data_output": True}))
    rec.request(f"{d}/json_per_output_binary", "OUTPUT0 binary_data true, OUTPUT1 JSON",
                "POST", url,
                body=add_sub_body(outputs=[{"name": "OUTPUT0", "parameters": {"binary_data": True}},
                                           {"name": "OUTPUT1"}]))
    rec.request(f"{d}/json_output_subset", "only OUTPUT1 requested", "POST", url,
                body=add_sub_body(outputs=[{"name": "OUTPUT1"}]))
    body, hlen = add_sub_binary()
    rec.request(f"{d}/binary_json_ok", f"binary+json with json-header-size={hlen} (correct), "
                "both inputs binary, JSON outputs", "POST", url, body=body,
                headers=sm_binary_headers(hlen))
    body, hlen = add_sub_binary(parameters={"binary_data_output": True})
    rec.request(f"{d}/binary_json_binary_output", "binary+json inputs and binary_data_output",
                "POST", url, body=body, headers=sm_binary_headers(hlen))
    header = {"inputs": [{"name": "INPUT0", "shape": [4], "datatype": "FP32",
                          "parameters": {"binary_data_size": 16}},
                         fp32_input("INPUT1", ADD_SUB_IN1)]}
    mixed, mixed_len = binary_body(header, [pack_fp32(ADD_SUB_IN0)])
    rec.request(f"{d}/binary_json_mixed", "INPUT0 binary, INPUT1 JSON data", "POST", url,
                body=mixed, headers=sm_binary_headers(mixed_len))
    body, hlen = add_sub_binary()
    rec.request(f"{d}/binary_json_n_charset_suffix",
                "binary+json with ';charset=utf-8' after N (atoi stops at ';')", "POST", url,
                body=body, headers={"Content-Type": f"{BINARY_MIME}{hlen};charset=utf-8"})
    rec.request(f"{d}/binary_json_n_trailing_text", "json-header-size=<N>abc (atoi reads N)",
                "POST", url, body=body, headers=sm_binary_headers(f"{hlen}abc"))
    rec.request(f"{d}/binary_json_n_leading_space", "json-header-size= <N> (atoi skips spaces)",
                "POST", url, body=body, headers=sm_binary_headers(f" {hlen}"))
    plain = json.dumps(add_sub_body(), separators=(",", ":")).encode()
    rec.request(f"{d}/binary_json_n_equals_body", "plain JSON body, N = whole body length",
                "POST", url, body=plain, headers=sm_binary_headers(len(plain)))
    rec.request(f"{d}/binary_json_n0_two_inputs",
                "N=0: the whole body is a raw input, but add_sub has two inputs", "POST", url,
                body=pack_fp32(ADD_SUB_IN0) + pack_fp32(ADD_SUB_IN1), headers=sm_binary_headers(0))
    rec.request(f"{d}/binary_json_n_negative", "json-header-size=-5", "POST", url, body=body,
                headers=sm_binary_headers(-5))
    rec.request(f"{d}/binary_json_n_too_large", "json-header-size larger than the body",
                "POST", url, body=body, headers=sm_binary_headers(len(body) + 10))
    rec.request(f"{d}/binary_json_n_not_a_number", "json-header-size=abc (atoi gives 0: raw)",
                "POST", url, body=body, headers=sm_binary_headers("abc"))
    rec.request(f"{d}/binary_json_n_empty", "json-header-size= (empty: atoi gives 0: raw)",
                "POST", url, body=body, headers=sm_binary_headers(""))
    rec.request(f"{d}/binary_json_n_into_json", "N cuts the JSON header short", "POST", url,
                body=body, headers=sm_binary_headers(hlen - 5))
    short_header = {"inputs": [
        {"name": "INPUT0", "shape": [4], "datatype": "FP32", "parameters": {"binary_data_size": 16}},
        {"name": "INPUT1", "shape": [4], "datatype": "FP32", "parameters": {"binary_data_size": 16}}]}
    truncated, trunc_len = binary_body(short_header, [pack_fp32(ADD_SUB_IN0), pack_fp32([1.0])])
    rec.request(f"{d}/binary_json_blobs_truncated", "binary_data_size 16+16, only 16+4 bytes sent",
                "POST", url, body=truncated, headers=sm_binary_headers(trunc_len))
    rec.request(f"{d}/binary_json_mime_not_at_start",
                "Content-Type foo/application/vnd.sagemaker-triton.binary+json;json-header-size=N",
                "POST", url, body=body, headers={"Content-Type": f"foo/{BINARY_MIME}{hlen}"})
    rec.request(f"{d}/binary_json_mime_with_space",
                "'...binary+json; json-header-size=N' (space: not Triton's mime, body read as JSON)",
                "POST", url, body=body,
                headers={"Content-Type": BINARY_MIME.replace(";", "; ") + str(hlen)})
    rec.request(f"{d}/binary_json_mime_upper_case", "mime type in upper case", "POST", url,
                body=body, headers={"Content-Type": (BINARY_MIME + str(hlen)).upper()})
    rec.request(f"{d}/octet_stream_inference_header",
                "KServe binary: application/octet-stream + Inference-Header-Content-Length "
                "(not read in SageMaker mode)", "POST", url, body=body,
                headers={"Content-Type": "application/octet-stream",
                         "Inference-Header-Content-Length": str(hlen)})
    rec.request(f"{d}/gzip_body", "Content-Encoding: gzip (SageMaker mode ignores it)", "POST",
                url, body=gzip.compress(plain, mtime=0), headers={"Content-Encoding": "gzip"})
    rec.request(f"{d}/accept_gzip", "Accept-Encoding: gzip (response stays identity)", "POST",
                url, body=plain, headers={"Accept-Encoding": "gzip"})
    rec.request(f"{d}/malformed_json", "invalid JSON body '{'", "POST", url, body="{")
    rec.request(f"{d}/empty_body", "POST with an empty body (length 0: raw input path)",
                "POST", url, body=b"")
    rec.request(f"{d}/json_array", "body []", "POST", url, body="[]")
    rec.request(f"{d}/json_no_inputs", "body {}", "POST", url, body={})
    rec.request(f"{d}/unknown_input_name", "INPUT0 and NOPE", "POST", url,
                body={"inputs": [fp32_input("INPUT0", ADD_SUB_IN0), fp32_input("NOPE", ADD_SUB_IN1)]})
    rec.request(f"{d}/missing_input", "only INPUT0", "POST", url,
                body={"inputs": [fp32_input("INPUT0", ADD_SUB_IN0)]})
    rec.request(f"{d}/wrong_shape", "shape [2,2] for a [4] input", "POST", url,
                body={"inputs": [fp32_input("INPUT0", ADD_SUB_IN0, [2, 2]),
                                 fp32_input("INPUT1", ADD_SUB_IN1, [2, 2])]})
    rec.request(f"{d}/wrong_datatype", "INT32 for an FP32 input", "POST", url,
                body={"inputs": [{"name": "INPUT0", "shape": [4], "datatype": "INT32",
                                  "data": [1, 2, 3, 4]}, fp32_input("INPUT1", ADD_SUB_IN1)]})
    rec.request(f"{d}/data_count_mismatch", "3 values for shape [4]", "POST", url,
                body={"inputs": [fp32_input("INPUT0", [1.0, 2.0, 3.0], [4]),
                                 fp32_input("INPUT1", ADD_SUB_IN1)]})
    rec.request(f"{d}/unknown_output", "outputs [NOPE]", "POST", url,
                body=add_sub_body(outputs=[{"name": "NOPE"}]))
    rec.request(f"{d}/get_invocations", "GET /invocations", "GET", url)
    rec.request(f"{d}/put_invocations", "PUT /invocations", "PUT", url, body=add_sub_body())
    rec.request(f"{d}/delete_invocations", "DELETE /invocations", "DELETE", url)
    rec.request(f"{d}/invocations_trailing_slash", "POST /invocations/", "POST",
                "/invocations/", body=add_sub_body())
    rec.request(f"{d}/invocations_subpath", "POST /invocations/x", "POST", "/invocations/x",
                body=add_sub_body())
    rec.request(f"{d}/invocations_query", "POST /invocations?x=1", "POST", "/invocations?x=1",
                body=add_sub_body())
    rec.request(f"{d}/target_model_header_in_sme",
                f"{TARGET_HEADER} on /invocations (ignored by Triton)", "POST", url,
                body=add_sub_body(), headers=target("other.tar.gz"))


def capture_sme_routes(rec: Recorder) -> None:
    d = "routes"
    rec.request(f"{d}/get_root", "GET /", "GET", "/")
    rec.request(f"{d}/get_foo", "GET /foo", "GET", "/foo")
    rec.request(f"{d}/post_foo", "POST /foo", "POST", "/foo", body="{}")
    rec.request(f"{d}/get_v2", "GET /v2 (KServe route, not served on the SageMaker port)",
                "GET", "/v2")
    rec.request(f"{d}/get_v2_health_ready", "GET /v2/health/ready", "GET", "/v2/health/ready")
    rec.request(f"{d}/post_v2_infer", "POST /v2/models/add_sub/infer", "POST",
                "/v2/models/add_sub/infer", body=add_sub_body())
    rec.request(f"{d}/get_metrics", "GET /metrics", "GET", "/metrics")
    rec.request(f"{d}/get_models", "GET /models (the multi-model list route also answers in SME)",
                "GET", "/models")
    rec.request(f"{d}/get_models_add_sub", "GET /models/add_sub (not a multi-model hash)", "GET",
                "/models/add_sub")
    rec.request(f"{d}/post_models_add_sub_invoke", "POST /models/add_sub/invoke", "POST",
                "/models/add_sub/invoke", body=add_sub_body())
    rec.request(f"{d}/get_models_unknown_subroute", "GET /models/add_sub/foo", "GET",
                "/models/add_sub/foo")


def capture_sme_mme_routes(rec: Recorder) -> None:
    """The multi-model routes are not switched off in a single-model endpoint."""
    layout = single("h_in_sme", ADD_SUB)
    seq = rec.sequence("mme_routes_in_sme", [layout])
    seq.step("list", "GET /models", "GET", "/models")
    seq.step("load", "POST /models in SME mode", "POST", "/models",
             body=load_body("h_in_sme", layout.url))
    seq.step("list_after_load", "GET /models", "GET", "/models")
    seq.step("invoke", "POST /models/h_in_sme/invoke", "POST", "/models/h_in_sme/invoke",
             body=add_sub_body())
    seq.step("invocations_still_default", "POST /invocations still reaches add_sub", "POST",
             "/invocations", body=add_sub_body())
    seq.step("delete", "DELETE /models/h_in_sme", "DELETE", "/models/h_in_sme")
    seq.step("list_after_delete", "GET /models", "GET", "/models")


def capture_sme_raw_fp32(rec: Recorder) -> None:
    url = "/invocations"
    values = [1.5, -2.0, 3.25, 1e-7]
    rec.request("raw_16_bytes", "N=0, 16 raw bytes: INPUT0 shape deduced as [4]", "POST", url,
                body=pack_fp32(values), headers=sm_binary_headers(0))
    rec.request("raw_6_bytes", "N=0, 6 raw bytes (not a multiple of 4)", "POST", url,
                body=b"\x00\x00\x80\x3f\x00\x00", headers=sm_binary_headers(0))
    rec.request("raw_0_bytes", "N=0, empty body", "POST", url, body=b"",
                headers=sm_binary_headers(0))
    rec.request("raw_empty_no_content_type", "empty body without Content-Type (length 0: raw)",
                "POST", url, body=b"")
    rec.request("raw_n_not_a_number", "json-header-size=abc with 8 raw bytes", "POST", url,
                body=pack_fp32([1.0, 2.0]), headers=sm_binary_headers("abc"))
    rec.request("raw_no_content_type", "16 raw bytes without Content-Type (read as JSON)",
                "POST", url, body=pack_fp32(values))
    rec.request("raw_octet_stream", "16 raw bytes, Content-Type: application/octet-stream",
                "POST", url, body=pack_fp32(values),
                headers={"Content-Type": "application/octet-stream"})
    rec.request("json_ok", "JSON request", "POST", url,
                body={"inputs": [fp32_input("INPUT0", values)]})
    rec.request("json_binary_output", "JSON request, binary_data_output", "POST", url,
                body={"inputs": [fp32_input("INPUT0", values)],
                      "parameters": {"binary_data_output": True}})


def capture_sme_raw_bytes(rec: Recorder) -> None:
    url = "/invocations"
    rec.request("raw_text", "N=0, UTF-8 text body: one BYTES element", "POST", url,
                body="hello sagemaker ✓", headers=sm_binary_headers(0))
    rec.request("raw_non_utf8", "N=0, non-UTF-8 bytes", "POST", url,
                body=b"\x00\xff\xfe raw", headers=sm_binary_headers(0))
    rec.request("raw_empty", "N=0, empty body", "POST", url, body=b"",
                headers=sm_binary_headers(0))
    rec.request("json_ok", "JSON BYTES request", "POST", url,
                body={"inputs": [{"name": "INPUT0", "shape": [1], "datatype": "BYTES",
                                  "data": ["abc"]}]})
    element = pack_bytes_elements([b"xyz"])
    header = {"inputs": [{"name": "INPUT0", "shape": [1], "datatype": "BYTES",
                          "parameters": {"binary_data_size": len(element)}}],
              "parameters": {"binary_data_output": True}}
    body, hlen = binary_body(header, [element])
    rec.request("binary_json_binary_output", "binary+json BYTES in, binary out", "POST", url,
                body=body, headers=sm_binary_headers(hlen))


def capture_sme_raw_bytes_batched(rec: Recorder) -> None:
    url = "/invocations"
    rec.request("raw_text", "N=0 to a BYTES model with dims [-1] and max_batch_size 8", "POST",
                url, body="hello", headers=sm_binary_headers(0))
    rec.request("json_ok", "JSON BYTES request shape [1,2]", "POST", url,
                body={"inputs": [{"name": "INPUT0", "shape": [1, 2], "datatype": "BYTES",
                                  "data": ["a", "bc"]}]})


def capture_sme_errors(rec: Recorder) -> None:
    url = "/invocations"
    rec.request("json_mode0_ok", "MODE 0: echo", "POST", url, body=mode_body(0))
    rec.request("json_mode1_error_response", "MODE 1: the model returns a TritonError", "POST",
                url, body=mode_body(1))
    rec.request("json_mode2_execute_raises", "MODE 2: execute raises ValueError", "POST", url,
                body=mode_body(2))
    rec.request("json_mode3_execute_memory_error", "MODE 3: execute raises MemoryError", "POST",
                url, body=mode_body(3))
    rec.request("json_mode4_error_out_of_memory",
                "MODE 4: a TritonError saying 'out of memory'", "POST", url, body=mode_body(4))
    rec.request("raw_mode0", "N=0 raw 4-byte INT32 0", "POST", url, body=int32_raw(0),
                headers=sm_binary_headers(0))
    rec.request("raw_mode2", "N=0 raw 4-byte INT32 2 (execute raises)", "POST", url,
                body=int32_raw(2), headers=sm_binary_headers(0))
    rec.request("raw_wrong_size", "N=0 raw 2 bytes for an INT32 [1] input", "POST", url,
                body=b"\x01\x00", headers=sm_binary_headers(0))


def capture_sme_minimal(rec: Recorder) -> None:
    rec.request("get_ping", "GET /ping", "GET", "/ping")
    rec.request("post_invocations", "POST /invocations with add_sub JSON", "POST",
                "/invocations", body=add_sub_body())
    rec.request("get_models", "GET /models", "GET", "/models")


# --------------------------------------------------------------------------
# Multi-model endpoint (MME) captures
# --------------------------------------------------------------------------


def capture_mme_empty(rec: Recorder) -> None:
    """Independent requests while no model is loaded."""
    empty = Recorder(rec.out_dir / "empty", rec.port, [])
    empty.request("get_ping", "GET /ping (ping mode live)", "GET", "/ping")
    empty.request("post_ping", "POST /ping", "POST", "/ping", body="")
    empty.request("get_models", "GET /models with nothing loaded", "GET", "/models")
    empty.request("get_models_trailing_slash", "GET /models/", "GET", "/models/")
    empty.request("get_models_unknown", "GET /models/nosuch", "GET", "/models/nosuch")
    empty.request("get_models_unknown_invoke", "GET /models/nosuch/invoke (a GET model route)",
                  "GET", "/models/nosuch/invoke")
    empty.request("post_invoke_unknown", "POST /models/nosuch/invoke", "POST",
                  "/models/nosuch/invoke", body=add_sub_body())
    empty.request("post_invoke_unknown_with_target", "POST /models/nosuch/invoke with target header",
                  "POST", "/models/nosuch/invoke", body=add_sub_body(),
                  headers=target("add_sub.tar.gz"))
    empty.request("delete_unknown", "DELETE /models/nosuch", "DELETE", "/models/nosuch")
    empty.request("delete_models", "DELETE /models", "DELETE", "/models")
    empty.request("put_models", "PUT /models", "PUT", "/models", body="{}")
    empty.request("put_models_hash", "PUT /models/nosuch", "PUT", "/models/nosuch", body="{}")
    empty.request("patch_models", "PATCH /models", "PATCH", "/models", body="{}")
    empty.request("get_models_unknown_subroute", "GET /models/nosuch/foo", "GET",
                  "/models/nosuch/foo")
    empty.request("post_models_unknown_subroute", "POST /models/nosuch/foo", "POST",
                  "/models/nosuch/foo", body="{}")
    empty.request("post_invoke_trailing_slash", "POST /models/nosuch/invoke/", "POST",
                  "/models/nosuch/invoke/", body=add_sub_body())
    empty.request("post_invocations", "POST /invocations in MME mode (no default model)",
                  "POST", "/invocations", body=add_sub_body())
    empty.request("get_root", "GET /", "GET", "/")
    empty.request("get_v2_health_live", "GET /v2/health/live", "GET", "/v2/health/live")


def capture_mme_single(rec: Recorder) -> None:
    h = "h_single"
    layout = single(h, ADD_SUB)
    seq = rec.sequence("single", [layout])
    base = f"/models/{h}"
    seq.step("list_before", "GET /models before loading", "GET", "/models")
    seq.step("load", f"load add_sub (config.pbtxt at the url) as {h}, no target header",
             "POST", "/models", body=load_body(h, layout.url))
    seq.step("list", "GET /models", "GET", "/models")
    seq.step("get", f"GET {base}", "GET", base)
    seq.step("get_invoke_path", f"GET {base}/invoke (GET ignores /invoke: model description)",
             "GET", f"{base}/invoke")
    seq.step("invoke_json", "KServe JSON invoke", "POST", f"{base}/invoke", body=add_sub_body())
    body, hlen = add_sub_binary()
    seq.step("invoke_binary_json", "binary+json invoke", "POST", f"{base}/invoke", body=body,
             headers=sm_binary_headers(hlen))
    out_body, out_len = add_sub_binary(parameters={"binary_data_output": True})
    seq.step("invoke_binary_output", "binary+json invoke with binary_data_output", "POST",
             f"{base}/invoke", body=out_body, headers=sm_binary_headers(out_len))
    seq.step("invoke_malformed_json", "invalid JSON", "POST", f"{base}/invoke", body="{")
    seq.step("invoke_wrong_shape", "wrong shape", "POST", f"{base}/invoke",
             body={"inputs": [fp32_input("INPUT0", ADD_SUB_IN0, [2, 2]),
                              fp32_input("INPUT1", ADD_SUB_IN1, [2, 2])]})
    seq.step("invoke_unknown_input", "unknown input name", "POST", f"{base}/invoke",
             body={"inputs": [fp32_input("INPUT0", ADD_SUB_IN0), fp32_input("NOPE", ADD_SUB_IN1)]})
    seq.step("invoke_n0_two_inputs", "N=0 raw body to a two-input model", "POST",
             f"{base}/invoke", body=pack_fp32(ADD_SUB_IN0), headers=sm_binary_headers(0))
    seq.step("invoke_n_too_large", "json-header-size larger than the body", "POST",
             f"{base}/invoke", body=body, headers=sm_binary_headers(len(body) + 1))
    seq.step("invoke_mime_not_at_start", "mime type not at the start of Content-Type", "POST",
             f"{base}/invoke", body=body, headers={"Content-Type": f"x;{BINARY_MIME}{hlen}"})
    plain = json.dumps(add_sub_body(), separators=(",", ":")).encode()
    seq.step("invoke_gzip", "Content-Encoding: gzip (ignored)", "POST", f"{base}/invoke",
             body=gzip.compress(plain, mtime=0), headers={"Content-Encoding": "gzip"})
    seq.step("invoke_put", f"PUT {base}/invoke", "PUT", f"{base}/invoke", body=add_sub_body())
    seq.step("invoke_trailing_slash", f"POST {base}/invoke/", "POST", f"{base}/invoke/",
             body=add_sub_body())
    seq.step("invoke_unknown_subroute", f"POST {base}/foo", "POST", f"{base}/foo",
             body=add_sub_body())
    seq.step("load_again", "the same load again", "POST", "/models",
             body=load_body(h, layout.url))
    seq.step("load_same_url_other_hash", "another hash with the same url", "POST", "/models",
             body=load_body("h_single_copy", layout.url))
    seq.step("load_same_hash_other_url", "the same hash with another (missing) url", "POST",
             "/models", body=load_body(h, url_for("h_single_elsewhere")))
    seq.step("load_via_hash_path", f"POST {base} with the load body (the path's hash is ignored)",
             "POST", base, body=load_body(h, layout.url))
    seq.step("delete", f"DELETE {base}", "DELETE", base)
    seq.step("list_after_delete", "GET /models", "GET", "/models")
    seq.step("get_after_delete", f"GET {base}", "GET", base)
    seq.step("invoke_after_delete", "invoke after delete", "POST", f"{base}/invoke",
             body=add_sub_body())
    seq.step("delete_again", "DELETE again", "DELETE", base)
    seq.step("load_after_delete", "load again after delete", "POST", "/models",
             body=load_body(h, layout.url))
    seq.step("invoke_after_reload", "invoke after reloading", "POST", f"{base}/invoke",
             body=add_sub_body())
    seq.step("delete_via_invoke_path", f"DELETE {base}/invoke (unloads the model)", "DELETE",
             f"{base}/invoke")
    seq.step("list_at_end", "GET /models", "GET", "/models")


def capture_mme_target_header(rec: Recorder) -> None:
    h, h2, name = "h_target", "h_target_two", "add_sub.tar.gz"
    layout, layout2 = single(h, ADD_SUB), single(h2, ADD_SUB)
    seq = rec.sequence("target_header", [layout, layout2])
    base = f"/models/{h}"
    seq.step("load_with_target", f"load {h} with {TARGET_HEADER}: {name} (the Triton model name)",
             "POST", "/models", body=load_body(h, layout.url), headers=target(name))
    seq.step("list", "GET /models: the hash is listed only if a model named like it is ready",
             "GET", "/models")
    seq.step("get", f"GET {base}", "GET", base)
    seq.step("invoke_with_target", "invoke with the target header", "POST", f"{base}/invoke",
             body=add_sub_body(), headers=target(name))
    seq.step("invoke_without_target", "invoke without the header: the hash is the model name",
             "POST", f"{base}/invoke", body=add_sub_body())
    seq.step("invoke_other_target", "invoke naming a model that is not loaded", "POST",
             f"{base}/invoke", body=add_sub_body(), headers=target("other.tar.gz"))
    seq.step("load_other_hash_same_target", f"load {h2} with the same target header", "POST",
             "/models", body=load_body(h2, layout2.url), headers=target(name))
    seq.step("invoke_other_hash", f"invoke {h2} (not loaded)", "POST", f"/models/{h2}/invoke",
             body=add_sub_body(), headers=target(name))
    seq.step("delete_with_target", "DELETE with the target header", "DELETE", base,
             headers=target(name))
    seq.step("list_after_delete", "GET /models", "GET", "/models")
    seq.step("invoke_after_delete", "invoke with the target header after delete", "POST",
             f"{base}/invoke", body=add_sub_body(), headers=target(name))


def capture_mme_repository(rec: Recorder) -> None:
    h = "h_repo"
    layout = repository(url_for(h), ("add_sub", ADD_SUB))
    seq = rec.sequence("repository", [layout])
    base = f"/models/{h}"
    seq.step("load", "load a repository layout (url/add_sub/config.pbtxt)", "POST", "/models",
             body=load_body(h, layout.url))
    seq.step("get", f"GET {base}: modelUrl is the url itself", "GET", base)
    seq.step("list", "GET /models", "GET", "/models")
    seq.step("invoke", "invoke: the model is served as the hash", "POST", f"{base}/invoke",
             body=add_sub_body())
    seq.step("invoke_folder_name", "invoke with target header = the folder name add_sub",
             "POST", f"{base}/invoke", body=add_sub_body(), headers=target("add_sub"))
    seq.step("load_again", "the same load again", "POST", "/models",
             body=load_body(h, layout.url))
    seq.step("delete", f"DELETE {base}", "DELETE", base)
    seq.step("list_after_delete", "GET /models", "GET", "/models")


def capture_mme_ensemble(rec: Recorder) -> None:
    h = "h_ensemble"
    layout = repository(url_for(h), *ENSEMBLE_MODELS)
    seq = rec.sequence("ensemble", [layout])
    base = f"/models/{h}"
    seq.step("load", "load a repository with an ensemble and its two steps: the ensemble is "
             "the model served as the hash", "POST", "/models", body=load_body(h, layout.url))
    seq.step("list", "GET /models", "GET", "/models")
    seq.step("invoke", "invoke the ensemble (INPUT*2+1)", "POST", f"{base}/invoke",
             body=ENSEMBLE_INPUT)
    seq.step("invoke_step_by_target", "target header sm_scale: a composing model by name",
             "POST", f"{base}/invoke", body=ENSEMBLE_INPUT, headers=target("sm_scale"))
    seq.step("invoke_ensemble_folder_name", "target header sm_ensemble (renamed to the hash)",
             "POST", f"{base}/invoke", body=ENSEMBLE_INPUT, headers=target("sm_ensemble"))
    seq.step("delete", f"DELETE {base} (unloads the dependents too)", "DELETE", base)
    seq.step("list_after_delete", "GET /models", "GET", "/models")
    seq.step("load_again", "load again after delete", "POST", "/models",
             body=load_body(h, layout.url))
    seq.step("invoke_after_reload", "invoke after reloading", "POST", f"{base}/invoke",
             body=ENSEMBLE_INPUT)
    seq.step("delete_at_end", f"DELETE {base}", "DELETE", base)


def capture_mme_invoke_errors(rec: Recorder) -> None:
    h = "h_errors"
    layout = single(h, SAGEMAKER_MODELS / "sm_errors")
    seq = rec.sequence("invoke_errors", [layout])
    inv = f"/models/{h}/invoke"
    seq.step("load", "load sm_errors", "POST", "/models", body=load_body(h, layout.url))
    seq.step("mode0_ok", "MODE 0: echo", "POST", inv, body=mode_body(0))
    seq.step("mode1_error_response", "MODE 1: TritonError response", "POST", inv,
             body=mode_body(1))
    seq.step("mode2_execute_raises", "MODE 2: execute raises ValueError", "POST", inv,
             body=mode_body(2))
    seq.step("mode3_execute_memory_error", "MODE 3: execute raises MemoryError", "POST", inv,
             body=mode_body(3))
    seq.step("mode4_error_out_of_memory", "MODE 4: TritonError 'out of memory'", "POST", inv,
             body=mode_body(4))
    seq.step("raw_mode0", "N=0 raw INT32 0", "POST", inv, body=int32_raw(0),
             headers=sm_binary_headers(0))
    seq.step("raw_mode3", "N=0 raw INT32 3 (MemoryError)", "POST", inv, body=int32_raw(3),
             headers=sm_binary_headers(0))
    seq.step("get_invoke", f"GET {inv}", "GET", inv)
    seq.step("delete", f"DELETE /models/{h}", "DELETE", f"/models/{h}")


def capture_mme_load_errors(rec: Recorder) -> None:
    """Loads that fail; none of them leaves anything loaded."""
    oom = single("h_init_oom", SAGEMAKER_MODELS / "sm_init_oom")
    raises = single("h_init_raises", SAGEMAKER_MODELS / "sm_init_raises")
    outside_single = Layout(str(OUTSIDE_ROOT / "single"), "single", source=ADD_SUB)
    subdir = repository(url_for("h_subdir"), ("add_sub", ADD_SUB))
    missing = Layout(url_for("h_missing"), "absent")
    outside_missing = Layout(str(OUTSIDE_ROOT / "missing"), "absent")
    seq = rec.sequence("load_errors", [oom, raises, outside_single, subdir, missing,
                                       outside_missing])
    seq.step("init_memory_error", "initialize raises MemoryError", "POST", "/models",
             body=load_body("h_init_oom", oom.url))
    seq.step("init_memory_error_again", "the same load again (not 409: failed loads are "
             "unregistered)", "POST", "/models", body=load_body("h_init_oom", oom.url))
    seq.step("init_raises", "initialize raises ValueError", "POST", "/models",
             body=load_body("h_init_raises", raises.url))
    seq.step("no_url", "body without url", "POST", "/models", body={"model_name": "h_no_url"})
    seq.step("empty_object", "body {}", "POST", "/models", body={})
    seq.step("empty_body", "no body", "POST", "/models", body=b"")
    seq.step("url_empty_string", 'url ""', "POST", "/models", body=load_body("h_empty_url", ""))
    seq.step("url_missing", "url under /opt/ml/models that does not exist", "POST", "/models",
             body=load_body("h_missing", missing.url))
    seq.step("url_outside_missing", f"url {outside_missing.url} (does not exist)", "POST",
             "/models", body=load_body("h_outside_missing", outside_missing.url))
    seq.step("url_outside_single", f"url {outside_single.url} holding add_sub's config.pbtxt",
             "POST", "/models", body=load_body("h_outside_single", outside_single.url))
    seq.step("url_dev", "url /dev/shm", "POST", "/models", body=load_body("h_dev", "/dev/shm"))
    seq.step("url_proc", "url /proc/self/fd", "POST", "/models",
             body=load_body("h_proc", "/proc/self/fd"))
    seq.step("url_sys", "url /sys/fs", "POST", "/models", body=load_body("h_sys", "/sys/fs"))
    seq.step("url_customer_subdir", "url .../model/add_sub (the model folder inside the archive)",
             "POST", "/models", body=load_body("h_subdir", f"{subdir.url}/add_sub"))
    seq.step("url_relative", 'url "h_subdir/model" (relative)', "POST", "/models",
             body=load_body("h_relative", "h_subdir/model"))
    seq.step("model_name_empty", 'model_name "" with a missing url', "POST", "/models",
             body=load_body("", missing.url))
    seq.step("list_after", "GET /models: nothing loaded", "GET", "/models")


def capture_mme_url_variants(rec: Recorder) -> None:
    """Urls that Triton accepts although they are not plain /opt/ml/models/<hash>/model."""
    slash = single("h_slash", ADD_SUB)
    seq = rec.sequence("url_trailing_slash", [slash])
    seq.step("load", "url with a trailing slash", "POST", "/models",
             body=load_body("h_slash", slash.url + "/"))
    seq.step("get", "GET /models/h_slash", "GET", "/models/h_slash")
    seq.step("invoke", "invoke", "POST", "/models/h_slash/invoke", body=add_sub_body())
    seq.step("delete", "DELETE /models/h_slash", "DELETE", "/models/h_slash")

    outside = repository(str(OUTSIDE_ROOT / "repo"), ("add_sub", ADD_SUB))
    seq = rec.sequence("url_outside_repository", [outside])
    seq.step("load", f"url {outside.url} (outside /opt/ml/models, repository layout)", "POST",
             "/models", body=load_body("h_outside", outside.url))
    seq.step("get", "GET /models/h_outside", "GET", "/models/h_outside")
    seq.step("invoke", "invoke", "POST", "/models/h_outside/invoke", body=add_sub_body())
    seq.step("delete", "DELETE /models/h_outside", "DELETE", "/models/h_outside")

    anchor = single("h_anchor", ADD_SUB)
    outside2 = repository(str(OUTSIDE_ROOT / "traversal"), ("add_sub", ADD_SUB))
    traversal = f"{anchor.url}/../../../../..{outside2.url}"
    seq = rec.sequence("url_traversal", [anchor, outside2])
    seq.step("load", f"url {traversal} ('..' out of /opt/ml/models)", "POST", "/models",
             body=load_body("h_traversal", traversal))
    seq.step("get", "GET /models/h_traversal", "GET", "/models/h_traversal")
    seq.step("invoke", "invoke", "POST", "/models/h_traversal/invoke", body=add_sub_body())
    seq.step("delete", "DELETE /models/h_traversal", "DELETE", "/models/h_traversal")


def capture_mme_two_models(rec: Recorder) -> None:
    """Two hashes loaded at once: list order and independent invokes."""
    a, b = single("h_first", ADD_SUB), single("h_second", SAGEMAKER_MODELS / "sm_errors")
    seq = rec.sequence("two_models", [a, b])
    seq.step("load_first", "load h_first (add_sub)", "POST", "/models",
             body=load_body("h_first", a.url))
    seq.step("load_second", "load h_second (sm_errors)", "POST", "/models",
             body=load_body("h_second", b.url))
    seq.step("list", "GET /models with two models", "GET", "/models")
    seq.step("invoke_first", "invoke h_first", "POST", "/models/h_first/invoke",
             body=add_sub_body())
    seq.step("invoke_second", "invoke h_second", "POST", "/models/h_second/invoke",
             body=mode_body(0))
    seq.step("invoke_first_via_second_target",
             "POST /models/h_second/invoke with target header h_first", "POST",
             "/models/h_second/invoke", body=add_sub_body(), headers=target("h_first"))
    seq.step("delete_first", "DELETE /models/h_first", "DELETE", "/models/h_first")
    seq.step("list_after_first_delete", "GET /models", "GET", "/models")
    seq.step("delete_second", "DELETE /models/h_second", "DELETE", "/models/h_second")


def capture_mme_no_namespacing(rec: Recorder) -> None:
    h = "h_nons"
    layout, raises = single(h, ADD_SUB), single("h_nons_raises", SAGEMAKER_MODELS / "sm_init_raises")
    t1, t2 = single("h_nons_t1", ADD_SUB), single("h_nons_t2", ADD_SUB)
    seq = rec.sequence("sequence", [layout, raises, t1, t2])
    seq.step("load", "load add_sub as h_nons", "POST", "/models", body=load_body(h, layout.url))
    seq.step("invoke", "invoke", "POST", f"/models/{h}/invoke", body=add_sub_body())
    seq.step("invoke_wrong_shape", "wrong shape", "POST", f"/models/{h}/invoke",
             body={"inputs": [fp32_input("INPUT0", ADD_SUB_IN0, [2, 2]),
                              fp32_input("INPUT1", ADD_SUB_IN1, [2, 2])]})
    seq.step("load_init_raises", "initialize raises: error text without namespace", "POST",
             "/models", body=load_body("h_nons_raises", raises.url))
    seq.step("load_t1_target", "load h_nons_t1 with target header add_sub.tar.gz", "POST",
             "/models", body=load_body("h_nons_t1", t1.url), headers=target("add_sub.tar.gz"))
    seq.step("load_t2_same_target", "load h_nons_t2 with the same target header", "POST",
             "/models", body=load_body("h_nons_t2", t2.url), headers=target("add_sub.tar.gz"))
    seq.step("delete_t1", "DELETE /models/h_nons_t1 with the target header", "DELETE",
             "/models/h_nons_t1", headers=target("add_sub.tar.gz"))
    seq.step("delete", "DELETE /models/h_nons", "DELETE", f"/models/{h}")
    seq.step("list", "GET /models", "GET", "/models")


# --------------------------------------------------------------------------
# Sessions
# --------------------------------------------------------------------------

MME_ENV = {"SAGEMAKER_MULTI_MODEL": "true", "SAGEMAKER_TRITON_PING_MODE": "live"}


def sme_spec(name: str, description: str, default: str | None, *,
             load_model: str | None = None, ping_mode: str | None = None,
             extra_flags: tuple[str, ...] = ()) -> SessionSpec:
    env: dict[str, str] = {}
    if default is not None:
        env["SAGEMAKER_TRITON_DEFAULT_MODEL_NAME"] = default
    if ping_mode is not None:
        env["SAGEMAKER_TRITON_PING_MODE"] = ping_mode
    return SessionSpec(name, description, SME_REPOSITORY, env,
                       load_model=load_model or default, extra_flags=extra_flags)


SME_SESSIONS: list[tuple[SessionSpec, Any]] = [
    (sme_spec("sme", "single-model endpoint, default model add_sub (two FP32 [4] inputs)",
              "add_sub"),
     lambda rec: (capture_sme_ping(rec), capture_sme_invocations(rec),
                  capture_sme_routes(rec), capture_sme_mme_routes(rec))),
    (sme_spec("sme_raw_fp32", "default model sm_identity_fp32 (one FP32 [-1] input)",
              "sm_identity_fp32"), capture_sme_raw_fp32),
    (sme_spec("sme_raw_bytes", "default model sm_raw_bytes (one BYTES [1] input)",
              "sm_raw_bytes"), capture_sme_raw_bytes),
    (sme_spec("sme_raw_bytes_batched",
              "default model identity_bytes (one BYTES [-1] input, max_batch_size 8)",
              "identity_bytes"), capture_sme_raw_bytes_batched),
    (sme_spec("sme_errors", "default model sm_errors (execute fails on demand)", "sm_errors"),
     capture_sme_errors),
    (sme_spec("sme_no_default_name",
              "SAGEMAKER_TRITON_DEFAULT_MODEL_NAME unset, --load-model=add_sub", None,
              load_model="add_sub"), capture_sme_minimal),
    (sme_spec("sme_load_fails", "default model sm_init_raises fails to load; "
              "--exit-on-error=false; ping mode ready", "sm_init_raises",
              extra_flags=("--exit-on-error=false",)), capture_sme_minimal),
    (sme_spec("sme_load_fails_ping_live", "as sme_load_fails with SAGEMAKER_TRITON_PING_MODE=live",
              "sm_init_raises", ping_mode="live", extra_flags=("--exit-on-error=false",)),
     capture_sme_minimal),
]

MME_SPEC = SessionSpec("mme", "multi-model endpoint: empty model repository, models loaded "
                       "through POST /models", EMPTY_REPOSITORY, MME_ENV)
MME_NO_NAMESPACING_SPEC = SessionSpec(
    "mme_no_namespacing", "multi-model endpoint with --model-namespacing=false",
    EMPTY_REPOSITORY, MME_ENV, namespacing=False)


def run_recorded_session(peer: Path, spec: SessionSpec, port_base: int, out: Path,
                         capture: Any, setup: list[Layout] | None = None) -> None:
    shutil.rmtree(out / spec.name, ignore_errors=True)
    with sagemaker_triton(peer, spec, port_base, out):
        capture(Recorder(out / spec.name, port_base + 3, setup))


def session_mme(peer: Path, port_base: int, out: Path) -> None:
    def capture(rec: Recorder) -> None:
        capture_mme_empty(rec)
        capture_mme_single(rec)
        capture_mme_target_header(rec)
        capture_mme_repository(rec)
        capture_mme_ensemble(rec)
        capture_mme_invoke_errors(rec)
        capture_mme_load_errors(rec)
        capture_mme_url_variants(rec)
        capture_mme_two_models(rec)
    run_recorded_session(peer, MME_SPEC, port_base, out, capture, setup=[])


def session_mme_no_namespacing(peer: Path, port_base: int, out: Path) -> None:
    run_recorded_session(peer, MME_NO_NAMESPACING_SPEC, port_base, out,
                         capture_mme_no_namespacing, setup=[])


# Requests that make tritonserver 2.51 abort (std::out_of_range from an
# unchecked map lookup after the JSON error reply): one server run each.
CRASH_CASES: list[tuple[str, str, bytes | str | Json]] = [
    ("bad_json", "POST /models with invalid JSON '{'", "{"),
    ("model_name_not_string", 'POST /models with "model_name": 42',
     {"model_name": 42, "url": url_for("h_crash")}),
    ("url_not_string", 'POST /models with "url": ["x"]', {"model_name": "h_crash", "url": ["x"]}),
]


def session_mme_crashes(peer: Path, port_base: int, out: Path) -> None:
    folder = out / "mme_crash"
    shutil.rmtree(folder, ignore_errors=True)
    for case, description, body in CRASH_CASES:
        spec = SessionSpec(f"mme_crash_{case}", f"multi-model endpoint: {description}",
                           EMPTY_REPOSITORY, MME_ENV)
        run = start_session(peer, spec, port_base, out)
        try:
            if wait_started(run) != "started":
                raise RuntimeError(f"tritonserver did not start for {spec.name}")
            rec = Recorder(folder, port_base + 3, [])
            record = rec.request(case, description, "POST", "/models", body=body)
            try:
                code = run.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                code = None
            record["server_alive_after"] = code is None
            record["server_exit_code"] = code
            rec.write(case, record)
        finally:
            stop_triton(run)
        SESSIONS_INFO[spec.name] = spec.describe(port_base + 3)


def session_mme_hangs(peer: Path, port_base: int, out: Path) -> None:
    """Requests Triton never answers (within HANG_TIMEOUT_S); one server run each."""
    folder = out / "mme_hang"
    shutil.rmtree(folder, ignore_errors=True)

    def no_model_name(rec: Recorder) -> None:
        layout, other = single("h_hang", ADD_SUB), single("h_after_hang", ADD_SUB)
        seq = rec.sequence("load_without_model_name", [layout, other])
        seq.step("load", "POST /models with a url but no model_name", "POST", "/models",
                 body={"url": layout.url}, timeout_s=HANG_TIMEOUT_S)
        seq.step("ping", "GET /ping while that load hangs", "GET", "/ping")
        seq.step("list", "GET /models while that load hangs", "GET", "/models")
        seq.step("load_other", "load another model while the first load hangs", "POST",
                 "/models", body=load_body("h_after_hang", other.url), timeout_s=HANG_TIMEOUT_S)

    def delete_without_target(rec: Recorder) -> None:
        layout = single("h_hang", ADD_SUB)
        name = "add_sub.tar.gz"
        seq = rec.sequence("delete_without_target_header", [layout])
        seq.step("load_with_target", f"load with {TARGET_HEADER}: {name}", "POST", "/models",
                 body=load_body("h_hang", layout.url), headers=target(name))
        seq.step("delete_without_target", "DELETE without the header: Triton waits (up to "
                 "350 s) for a model named h_hang to unload", "DELETE", "/models/h_hang",
                 timeout_s=HANG_TIMEOUT_S)
        seq.step("list", "GET /models", "GET", "/models")
        seq.step("invoke_with_target", "invoke still works", "POST", "/models/h_hang/invoke",
                 body=add_sub_body(), headers=target(name))
        seq.step("delete_with_target", "DELETE with the header", "DELETE", "/models/h_hang",
                 headers=target(name))
        seq.step("list_after", "GET /models", "GET", "/models")

    for case, capture in (("load_without_model_name", no_model_name),
                          ("delete_without_target_header", delete_without_target)):
        spec = SessionSpec(f"mme_hang_{case}", f"multi-model endpoint: {case}",
                           EMPTY_REPOSITORY, MME_ENV)
        with sagemaker_triton(peer, spec, port_base, out):
            capture(Recorder(folder, port_base + 3, []))
        SESSIONS_INFO[spec.name] = spec.describe(port_base + 3)


SLOW_TIMEOUT_S = 420.0


def session_mme_slow(peer: Path, port_base: int, out: Path) -> None:
    """The hang of mme_hang/delete_without_target_header waited out (about 6 minutes)."""
    folder = out / "mme_slow"
    shutil.rmtree(folder, ignore_errors=True)
    spec = SessionSpec("mme_slow", "multi-model endpoint: DELETE without the target header, "
                       "waited out", EMPTY_REPOSITORY, MME_ENV)
    name = "add_sub.tar.gz"
    with sagemaker_triton(peer, spec, port_base, out):
        layout = single("h_slow", ADD_SUB)
        seq = Recorder(folder, port_base + 3, []).sequence(
            "delete_without_target_header", [layout])
        seq.step("load_with_target", f"load with {TARGET_HEADER}: {name}", "POST", "/models",
                 body=load_body("h_slow", layout.url), headers=target(name))
        seq.step("delete_without_target", "DELETE without the header: answered after Triton's "
                 "350 s unload wait", "DELETE", "/models/h_slow", timeout_s=SLOW_TIMEOUT_S)
        seq.step("list", "GET /models", "GET", "/models")
        seq.step("get", "GET /models/h_slow", "GET", "/models/h_slow")
        seq.step("invoke_with_target", "invoke with the target header", "POST",
                 "/models/h_slow/invoke", body=add_sub_body(), headers=target(name))
        seq.step("load_again_with_target", "load the same url and target again", "POST",
                 "/models", body=load_body("h_slow", layout.url), headers=target(name))
        seq.step("invoke_again", "invoke with the target header", "POST",
                 "/models/h_slow/invoke", body=add_sub_body(), headers=target(name))
        seq.step("delete_with_target", "DELETE with the header", "DELETE", "/models/h_slow",
                 headers=target(name))
        seq.step("list_after", "GET /models", "GET", "/models")
    SESSIONS_INFO[spec.name] = spec.describe(port_base + 3)


def session_sme_exit_on_error(peer: Path, port_base: int, out: Path) -> None:
    """serve's flags (no --exit-on-error=false) with a default model that fails to load."""
    spec = sme_spec("sme_load_fails_exit_on_error", "default model sm_init_raises, default "
                    "--exit-on-error (as docker/sagemaker/serve runs it)", "sm_init_raises")
    run = start_session(peer, spec, port_base, out)
    outcome = wait_started(run, timeout_s=120)
    ping = do_request(port_base + 3, "GET", "/ping", None, {}, 5.0)
    code = stop_triton(run)
    record = {"description": spec.description, "outcome": outcome,
              "ping_after": {k: ping.get(k) for k in ("status", "client_error")},
              "exit_code": code, "log_file": f"{spec.name}_log.txt"}
    (out / f"{spec.name}.json").write_text(json.dumps(record, indent=2) + "\n")
    SESSIONS_INFO[spec.name] = spec.describe(port_base + 3)


SESSIONS_INFO: dict[str, Any] = {}


# --------------------------------------------------------------------------
# Summary
# --------------------------------------------------------------------------


def body_summary(record: dict[str, Any]) -> str:
    if record.get("status") is None and "client_error" in record:
        extra = ""
        if "server_exit_code" in record:
            extra = f", server exit code {record['server_exit_code']}"
        elif "client_timeout_s" in record:
            extra = f" after {record['client_timeout_s']:.0f} s"
        return f"(no answer: {record['client_error']}{extra})"
    if "body_binary_part_base64" in record:
        binary = base64.b64decode(record["body_binary_part_base64"])
        return (record.get("body_json_part_text", "(non-JSON header)")
                + f" + {len(binary)} binary bytes")
    if "body_text" in record:
        return record["body_text"]
    return "(base64) " + str(record.get("body"))


def write_summary(out: Path) -> None:
    lines = [
        "# Triton 2.51 SageMaker-mode golden cases "
        "(generated by tools/capture_sagemaker_golden.py)",
        "",
        "Bodies longer than 300 characters are cut here; the JSON files hold them whole. "
        "`NN_` prefixes are sequences (replay in order).",
        "",
    ]
    for session_dir in sorted(p for p in out.iterdir() if p.is_dir()):
        lines += [f"## {session_dir.name}", "",
                  "| case | request | status | content-type | body |",
                  "| --- | --- | --- | --- | --- |"]
        for path in sorted(session_dir.rglob("*.json")):
            record = json.loads(path.read_text())
            req = record.get("request", {})
            body = body_summary(record)
            body = "".join(c if c >= " " else f"\\x{ord(c):02x}" for c in body)
            if len(body) > 300:
                body = body[:300] + "…"
            req_headers = "".join(f" [{k}: {v}]" for k, v in req.get("headers", {}).items())
            cells = [
                str(path.relative_to(session_dir).with_suffix("")),
                f"{req.get('method', '')} {req.get('path', '')}{req_headers}",
                str(record.get("status")),
                record.get("headers", {}).get("content-type", ""),
                "`" + body.replace("|", "\\|").replace("`", "'") + "`" if body else "",
            ]
            lines.append("| " + " | ".join(c.replace("|", "\\|") if i < 2 else c
                                           for i, c in enumerate(cells)) + " |")
        lines.append("")
    (out / "summary.md").write_text("\n".join(lines))


# --------------------------------------------------------------------------
# Main
# --------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--peer", type=Path,
                        default=Path(os.environ.get("NAIAD_TRITON_PEER", DEFAULT_PEER)),
                        help="peer script that runs tritonserver (default: %(default)s)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--port-base", type=int, default=18300,
                        help="HTTP port (disabled); GRPC, metrics and SageMaker use the next three")
    parser.add_argument("--keep-layout", action="store_true",
                        help="leave /opt/ml and the /tmp folders in place afterwards")
    parser.add_argument("--only", nargs="*", default=None,
                        help="run only these sessions: sme..., mme, mme_no_namespacing, "
                             "mme_crash, mme_hang, mme_slow")
    parser.add_argument("--slow", action="store_true",
                        help="also run mme_slow (waits out Triton's 350 s unload loop)")
    opts = parser.parse_args(argv)
    if os.geteuid() != 0:
        raise SystemExit("run as root: Triton 2.51 only accepts /opt/ml/models/<hash>/model urls")
    out: Path = opts.out
    out.mkdir(parents=True, exist_ok=True)
    port = opts.port_base
    sm_port = port + 3
    sessions: list[tuple[str, Any]] = []
    for spec, capture in SME_SESSIONS:
        sessions.append((spec.name, lambda spec=spec, capture=capture:
                         run_recorded_session(opts.peer, spec, port, out, capture)))
        SESSIONS_INFO[spec.name] = spec.describe(sm_port)
    sessions += [
        ("sme_load_fails_exit_on_error", lambda: session_sme_exit_on_error(opts.peer, port, out)),
        ("mme", lambda: session_mme(opts.peer, port, out)),
        ("mme_no_namespacing", lambda: session_mme_no_namespacing(opts.peer, port, out)),
        ("mme_crash", lambda: session_mme_crashes(opts.peer, port, out)),
        ("mme_hang", lambda: session_mme_hangs(opts.peer, port, out)),
    ]
    if opts.slow or (opts.only is not None and "mme_slow" in opts.only):
        sessions.append(("mme_slow", lambda: session_mme_slow(opts.peer, port, out)))
    SESSIONS_INFO[MME_SPEC.name] = MME_SPEC.describe(sm_port)
    SESSIONS_INFO[MME_NO_NAMESPACING_SPEC.name] = MME_NO_NAMESPACING_SPEC.describe(sm_port)
    prepare_opt_ml()
    try:
        for name, run_session in sessions:
            if opts.only is not None and name not in opts.only:
                continue
            print(f"[capture] session {name} ...", file=sys.stderr, flush=True)
            run_session()
    finally:
        if not opts.keep_layout:
            cleanup_opt_ml()
    # Merged with the previous file: runs with --only (or without --slow) keep the
    # descriptions of the sessions they did not rerun.
    sessions_path = out / "sessions.json"
    known = json.loads(sessions_path.read_text()) if sessions_path.exists() else {}
    known.update(SESSIONS_INFO)
    sessions_path.write_text(json.dumps(dict(sorted(known.items())), indent=2) + "\n")
    write_summary(out)
    count = sum(1 for d in out.iterdir() if d.is_dir() for _ in d.rglob("*.json"))
    print(f"[capture] {count} case files under {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
