#!/usr/bin/env python3
"""Capture golden HTTP answers from real NVIDIA Triton 2.51.

Starts the real tritonserver (through the peer script, see --peer) on the
repositories tests/golden_models and tests/golden_bad_models, sends a fixed
list of requests with the standard library's http.client, and writes one JSON
file per request under tests/golden/triton-2.51/ plus the server logs.

Usage (from the repository root):

    python3 tools/capture_triton_golden.py [--peer PATH] [--out DIR] [--port-base N]

Every golden JSON file has at least the keys
    "status"   HTTP status code (int)
    "headers"  only content-type, inference-header-content-length and
               content-encoding, when present (lower-case names)
    "body"     the parsed JSON body when the body is JSON, else base64 of the
               raw body bytes
and in addition
    "reason"       the HTTP reason phrase
    "all_headers"  every response header as [name, value] pairs, in order
    "body_text"    the raw body decoded as UTF-8 (when it decodes), so that
                   exact byte formatting (float digits, key order) is kept
    "body_json_part", "body_json_part_text", "body_binary_part_base64"
                   for binary-tensor responses (split at
                   Inference-Header-Content-Length)
    "request"      what was sent: method, path, the explicit headers (http.client
                   adds Host, Accept-Encoding: identity and Content-Length) and
                   the body as "body_text" (UTF-8) or "body_base64"
    "description"  what the case checks
The script is re-runnable: it rebuilds the per-case folders (good/, alt_config/,
bad_repo/, bad_repo_nonstrict/) and overwrites its top-level files; a README.md
in the output folder is left alone.
"""

from __future__ import annotations

import argparse
import base64
import gzip
import http.client
import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
GOOD_REPO = REPO_ROOT / "tests" / "golden_models"
BAD_REPO = REPO_ROOT / "tests" / "golden_bad_models"
DEFAULT_OUT = REPO_ROOT / "tests" / "golden" / "triton-2.51"
DEFAULT_PEER = Path("/work/shared/peers/triton.sh")

KEPT_HEADERS = ("content-type", "inference-header-content-length", "content-encoding")
STARTED_MARKER = "Started HTTPService"

Json = Any


# --------------------------------------------------------------------------
# Server process handling
# --------------------------------------------------------------------------


@dataclass
class TritonRun:
    """A running tritonserver started through the peer script."""

    process: subprocess.Popen[bytes]
    log_path: Path
    http_port: int

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")


def clean_environment() -> dict[str, str]:
    """The caller's environment minus anything that points an embedded Python
    elsewhere: the stub links the system libpython and needs the system numpy,
    so pyenv/venv entries on PATH and PYTHON* variables are dropped."""
    env = {
        k: v for k, v in os.environ.items()
        if not k.startswith(("PYTHON", "PYENV", "VIRTUAL_ENV", "CONDA"))
    }
    path = [p for p in env.get("PATH", "").split(os.pathsep)
            if p and ".pyenv" not in p and "/venv" not in p and "/.venv" not in p]
    env["PATH"] = os.pathsep.join(path or ["/usr/local/bin", "/usr/bin", "/bin"])
    return env


def start_triton(
    peer: Path,
    repo: Path,
    port_base: int,
    log_path: Path,
    extra_flags: Sequence[str] = (),
    env_extra: dict[str, str] | None = None,
) -> TritonRun:
    """Start Triton in the background (use wait_started to wait for HTTP)."""
    env = clean_environment()
    env.update(env_extra or {})
    cmd = [
        str(peer), "run", str(repo),
        str(port_base), str(port_base + 1), str(port_base + 2),
        *extra_flags,
    ]
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log_file = open(log_path, "wb")
    # The peer script execs tritonserver, so this PID is the server itself.
    # Run from a neutral directory: the Python backend stub puts its working
    # directory on sys.path, and the repository root holds naiad's own
    # triton_python_backend_utils.py shim, which must not shadow the real one.
    process = subprocess.Popen(
        cmd, stdout=log_file, stderr=subprocess.STDOUT, env=env,
        cwd=tempfile.gettempdir(), start_new_session=True,
    )
    log_file.close()
    return TritonRun(process, log_path, port_base)


def wait_started(run: TritonRun, timeout_s: float = 180.0) -> str:
    """Wait until HTTP is served: returns "started", "exited" or "timeout"."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if run.process.poll() is not None:
            return "exited"
        if STARTED_MARKER in run.log_text():
            time.sleep(0.5)
            return "started"
        time.sleep(0.25)
    return "timeout"


def stop_triton(run: TritonRun, timeout_s: float = 60.0) -> int | None:
    """Stop the server started by start_triton (by its PID only)."""
    if run.process.poll() is None:
        run.process.send_signal(signal.SIGTERM)
        try:
            run.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            run.process.kill()
            run.process.wait()
    return run.process.returncode


@contextmanager
def triton(
    peer: Path,
    repo: Path,
    port_base: int,
    log_path: Path,
    extra_flags: Sequence[str] = (),
    env_extra: dict[str, str] | None = None,
) -> Iterator[TritonRun]:
    run = start_triton(peer, repo, port_base, log_path, extra_flags, env_extra)
    outcome = wait_started(run)
    if outcome != "started":
        stop_triton(run)
        raise RuntimeError(f"tritonserver {outcome} before serving HTTP, see {log_path}")
    try:
        yield run
    finally:
        stop_triton(run)


# --------------------------------------------------------------------------
# Requests and recording
# --------------------------------------------------------------------------


def encode_body_for_record(body: bytes | None) -> dict[str, Any]:
    if body is None:
        return {}
    try:
        return {"body_text": body.decode("utf-8")}
    except UnicodeDecodeError:
        return {"body_base64": base64.b64encode(body).decode("ascii")}


def parse_response(
    status: int, reason: str, headers: list[tuple[str, str]], body: bytes
) -> dict[str, Any]:
    lower = {k.lower(): v for k, v in headers}
    result: dict[str, Any] = {
        "status": status,
        "reason": reason,
        "headers": {k: lower[k] for k in KEPT_HEADERS if k in lower},
        "all_headers": [[k, v] for k, v in headers],
    }
    raw = body
    if lower.get("content-encoding") in ("gzip", "deflate"):
        result["body_compressed_base64"] = base64.b64encode(body).decode("ascii")
        raw = gzip.decompress(body) if lower["content-encoding"] == "gzip" else body
    header_len = lower.get("inference-header-content-length")
    parsed: Any = None
    is_json = False
    if header_len is None:
        try:
            parsed = json.loads(raw.decode("utf-8"))
            is_json = True
        except (UnicodeDecodeError, ValueError):
            pass
    result["body"] = parsed if is_json else base64.b64encode(raw).decode("ascii")
    try:
        result["body_text"] = raw.decode("utf-8")
    except UnicodeDecodeError:
        pass
    if header_len is not None:
        n = int(header_len)
        json_part = raw[:n]
        try:
            result["body_json_part"] = json.loads(json_part.decode("utf-8"))
            result["body_json_part_text"] = json_part.decode("utf-8")
        except (UnicodeDecodeError, ValueError):
            result["body_json_part_base64"] = base64.b64encode(json_part).decode("ascii")
        result["body_binary_part_base64"] = base64.b64encode(raw[n:]).decode("ascii")
    return result


def do_request(
    port: int,
    method: str,
    path: str,
    body: bytes | None = None,
    headers: dict[str, str] | None = None,
    timeout_s: float = 60.0,
) -> dict[str, Any]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout_s)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        resp = conn.getresponse()
        data = resp.read()
        return parse_response(resp.status, resp.reason, resp.getheaders(), data)
    except (OSError, http.client.HTTPException) as exc:
        return {"status": None, "headers": {}, "body": None, "client_error": repr(exc)}
    finally:
        conn.close()


@dataclass
class Recorder:
    """Sends requests to one server and writes one golden file per request."""

    out_dir: Path
    port: int
    index: dict[str, Any] = field(default_factory=dict)

    def request(
        self,
        name: str,
        description: str,
        method: str,
        path: str,
        body: bytes | str | Json | None = None,
        headers: dict[str, str] | None = None,
        record_body: bool = True,
    ) -> dict[str, Any]:
        """Send a request and write `<out_dir>/<name>.json`.

        `body` may be bytes (sent as is), str (UTF-8) or any other JSON value
        (serialized compactly)."""
        if body is None:
            payload = None
        elif isinstance(body, bytes):
            payload = body
        elif isinstance(body, str):
            payload = body.encode("utf-8")
        else:
            payload = json.dumps(body, separators=(",", ":")).encode("utf-8")
        sent_headers = dict(headers or {})
        response = do_request(self.port, method, path, payload, sent_headers)
        request_record: dict[str, Any] = {"method": method, "path": path, "headers": sent_headers}
        if record_body:
            request_record.update(encode_body_for_record(payload))
        elif payload is not None:
            request_record["body_omitted"] = f"{len(payload)} bytes, see the description"
        record = {"description": description, "request": request_record, **response}
        self.write(name, record)
        return record

    def write(self, name: str, record: dict[str, Any]) -> None:
        path = self.out_dir / f"{name}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(record, indent=2, ensure_ascii=False) + "\n")
        self.index[str(path.relative_to(self.out_dir.parent))] = {
            "description": record.get("description", ""),
            "status": record.get("status"),
        }


# --------------------------------------------------------------------------
# Request builders
# --------------------------------------------------------------------------


def fp32_input(name: str, data: list[Any], shape: list[int] | None = None) -> dict[str, Any]:
    return {"name": name, "shape": shape if shape is not None else [len(data)],
            "datatype": "FP32", "data": data}


ADD_SUB_IN0 = [1.0, 2.0, 3.0, 4.0]
ADD_SUB_IN1 = [0.5, 0.25, 0.125, 2.0]


def add_sub_body(**extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "inputs": [fp32_input("INPUT0", ADD_SUB_IN0), fp32_input("INPUT1", ADD_SUB_IN1)]
    }
    body.update(extra)
    return body


def pack_fp32(values: Sequence[float]) -> bytes:
    return struct.pack(f"<{len(values)}f", *values)


def pack_bytes_elements(elements: Sequence[bytes]) -> bytes:
    return b"".join(struct.pack("<I", len(e)) + e for e in elements)


def binary_body(header: dict[str, Any], blobs: Sequence[bytes]) -> tuple[bytes, int]:
    head = json.dumps(header, separators=(",", ":")).encode("utf-8")
    return head + b"".join(blobs), len(head)


def binary_headers(header_len: int | str) -> dict[str, str]:
    return {
        "Content-Type": "application/octet-stream",
        "Inference-Header-Content-Length": str(header_len),
    }


def add_sub_binary(
    sizes: tuple[int, int] = (16, 16),
    blobs: tuple[bytes, bytes] | None = None,
    **extra: Any,
) -> tuple[bytes, int]:
    header: dict[str, Any] = {
        "inputs": [
            {"name": "INPUT0", "shape": [4], "datatype": "FP32",
             "parameters": {"binary_data_size": sizes[0]}},
            {"name": "INPUT1", "shape": [4], "datatype": "FP32",
             "parameters": {"binary_data_size": sizes[1]}},
        ]
    }
    header.update(extra)
    if blobs is None:
        blobs = (pack_fp32(ADD_SUB_IN0), pack_fp32(ADD_SUB_IN1))
    return binary_body(header, blobs)


# --------------------------------------------------------------------------
# Capture sessions
# --------------------------------------------------------------------------

GOOD_MODEL_VERSIONS: dict[str, list[str]] = {
    "add_sub": ["1"],
    "batch_auto_complete": ["1"],
    "nobatch_auto_complete": ["1"],
    "identity_bytes": ["1"],
    "identity_fp16": ["1"],
    "identity_bool": ["1"],
    "identity_int8": ["1"],
    "identity_dtypes": ["1"],
    # version folders 1, 2, 3 exist; policy latest 2 loads 2 and 3;
    # "abc" and "01" are folders Triton ignores.
    "kitchen_sink": ["1", "2", "3", "abc", "01"],
    "specific_versions": ["1", "2", "3"],
    "all_versions": ["1", "2"],
    "custom_name": ["1"],
    "execute_error": ["1"],
    "minimal_config": ["1"],
}
UNAVAILABLE_VERSION = "99"


def capture_server_endpoints(rec: Recorder, prefix: str) -> None:
    rec.request(f"{prefix}/server_metadata", "GET /v2", "GET", "/v2")
    rec.request(f"{prefix}/health_live", "GET /v2/health/live", "GET", "/v2/health/live")
    rec.request(f"{prefix}/health_ready", "GET /v2/health/ready", "GET", "/v2/health/ready")
    rec.request(f"{prefix}/post_health_live", "POST on a GET-only route", "POST",
                "/v2/health/live", body="")
    rec.request(f"{prefix}/post_server_metadata", "POST /v2", "POST", "/v2", body="")
    rec.request(f"{prefix}/repository_index", "POST /v2/repository/index, no body",
                "POST", "/v2/repository/index")
    rec.request(f"{prefix}/repository_index_empty_object",
                "POST /v2/repository/index with body {}", "POST",
                "/v2/repository/index", body={})
    rec.request(f"{prefix}/repository_index_ready_true",
                'POST /v2/repository/index with {"ready": true}', "POST",
                "/v2/repository/index", body={"ready": True})
    rec.request(f"{prefix}/repository_index_ready_false",
                'POST /v2/repository/index with {"ready": false}', "POST",
                "/v2/repository/index", body={"ready": False})
    rec.request(f"{prefix}/repository_index_get", "GET on the POST-only index route",
                "GET", "/v2/repository/index")


def capture_model_endpoints(rec: Recorder, model: str, versions: list[str]) -> None:
    base = f"/v2/models/{model}"
    d = f"models/{model}"
    rec.request(f"{d}/metadata", f"GET {base}", "GET", base)
    rec.request(f"{d}/config", f"GET {base}/config", "GET", f"{base}/config")
    rec.request(f"{d}/ready", f"GET {base}/ready", "GET", f"{base}/ready")
    for v in [*versions, UNAVAILABLE_VERSION]:
        vb = f"{base}/versions/{v}"
        rec.request(f"{d}/version_{v}_metadata", f"GET {vb}", "GET", vb)
        rec.request(f"{d}/version_{v}_ready", f"GET {vb}/ready", "GET", f"{vb}/ready")
        rec.request(f"{d}/version_{v}_config", f"GET {vb}/config", "GET", f"{vb}/config")


def capture_stats_sequence(rec: Recorder) -> None:
    """add_sub statistics before/after a known number of successes and failures."""
    d = "stats/add_sub_sequence"
    path = "/v2/models/add_sub/stats"
    rec.request(f"{d}/0_initial", "add_sub stats before any inference", "GET", path)
    for i in range(3):
        rec.request(f"{d}/1_infer_ok_{i}", "successful add_sub inference", "POST",
                    "/v2/models/add_sub/infer", body=add_sub_body())
    rec.request(f"{d}/2_after_3_ok", "add_sub stats after 3 successful inferences",
                "GET", path)
    bad_shape = {"inputs": [fp32_input("INPUT0", [1.0, 2.0], [2]),
                            fp32_input("INPUT1", [1.0, 2.0], [2])]}
    rec.request(f"{d}/3_infer_bad_shape", "add_sub inference failing on shape (core check)",
                "POST", "/v2/models/add_sub/infer", body=bad_shape)
    rec.request(f"{d}/3_infer_bad_output", "add_sub inference asking an unknown output",
                "POST", "/v2/models/add_sub/infer",
                body=add_sub_body(outputs=[{"name": "NOPE"}]))
    rec.request(f"{d}/3_infer_bad_json", "add_sub inference with invalid JSON",
                "POST", "/v2/models/add_sub/infer", body="{")
    rec.request(f"{d}/4_after_failures",
                "add_sub stats after 3 successes and 3 failed requests", "GET", path)
    rec.request(f"{d}/5_version_1", "GET /v2/models/add_sub/versions/1/stats", "GET",
                "/v2/models/add_sub/versions/1/stats")


def capture_infer_success(rec: Recorder) -> None:
    d = "infer"
    url = "/v2/models/add_sub/infer"
    rec.request(f"{d}/add_sub_json", "add_sub, JSON in, JSON out", "POST", url,
                body=add_sub_body())
    rec.request(f"{d}/add_sub_json_decimals",
                "add_sub with decimal inputs: shows float formatting of FP32 outputs",
                "POST", url,
                body={"inputs": [fp32_input("INPUT0", [0.1, 0.2, 0.3, 1e-7]),
                                 fp32_input("INPUT1", [3.3, 1e10, -0.0, 123456.789])]})
    rec.request(f"{d}/add_sub_json_int_literals", "FP32 inputs given as JSON integers",
                "POST", url,
                body={"inputs": [fp32_input("INPUT0", [1, 2, 3, 4]),
                                 fp32_input("INPUT1", [1, 1, 1, 1])]})
    rec.request(f"{d}/add_sub_json_nested_data", "data given as nested arrays [[1,2],[3,4]]",
                "POST", url,
                body={"inputs": [fp32_input("INPUT0", [[1.0, 2.0], [3.0, 4.0]], [4]),
                                 fp32_input("INPUT1", [[1.0, 1.0], [1.0, 1.0]], [4])]})
    rec.request(f"{d}/add_sub_id_echo", 'request "id" is echoed in the response',
                "POST", url, body=add_sub_body(id="my-request-42"))
    rec.request(f"{d}/add_sub_empty_id", 'request "id": "" ', "POST", url,
                body=add_sub_body(id=""))
    rec.request(f"{d}/add_sub_request_parameters",
                "request-level custom parameters (are they echoed?)", "POST", url,
                body=add_sub_body(parameters={"custom_key": "custom_value", "n": 3,
                                              "flag": True}))
    rec.request(f"{d}/add_sub_binary_data_output",
                'parameters {"binary_data_output": true}', "POST", url,
                body=add_sub_body(parameters={"binary_data_output": True}))
    rec.request(f"{d}/add_sub_binary_data_output_false",
                'parameters {"binary_data_output": false}', "POST", url,
                body=add_sub_body(parameters={"binary_data_output": False}))
    rec.request(f"{d}/add_sub_per_output_binary",
                "OUTPUT0 binary_data true, OUTPUT1 JSON", "POST", url,
                body=add_sub_body(outputs=[{"name": "OUTPUT0", "parameters": {"binary_data": True}},
                                           {"name": "OUTPUT1"}]))
    rec.request(f"{d}/add_sub_per_output_binary_overrides_global",
                "binary_data_output true globally, OUTPUT1 binary_data false", "POST", url,
                body=add_sub_body(parameters={"binary_data_output": True},
                                  outputs=[{"name": "OUTPUT0"},
                                           {"name": "OUTPUT1", "parameters": {"binary_data": False}}]))
    rec.request(f"{d}/add_sub_output_subset", "only OUTPUT1 requested", "POST", url,
                body=add_sub_body(outputs=[{"name": "OUTPUT1"}]))
    rec.request(f"{d}/add_sub_output_order_reversed", "outputs requested as OUTPUT1, OUTPUT0",
                "POST", url, body=add_sub_body(outputs=[{"name": "OUTPUT1"}, {"name": "OUTPUT0"}]))
    rec.request(f"{d}/add_sub_outputs_empty_list", '"outputs": []', "POST", url,
                body=add_sub_body(outputs=[]))
    rec.request(f"{d}/add_sub_version_in_url", "POST /v2/models/add_sub/versions/1/infer",
                "POST", "/v2/models/add_sub/versions/1/infer", body=add_sub_body())
    rec.request(f"{d}/add_sub_inputs_reversed", "inputs in order INPUT1, INPUT0", "POST",
                url, body={"inputs": [fp32_input("INPUT1", ADD_SUB_IN1),
                                      fp32_input("INPUT0", ADD_SUB_IN0)]})
    rec.request(f"{d}/add_sub_no_content_type", "JSON body without any Content-Type header",
                "POST", url, body=add_sub_body())
    rec.request(f"{d}/add_sub_unknown_top_level_key", 'extra top-level key "foo"', "POST",
                url, body=add_sub_body(foo="bar"))
    rec.request(f"{d}/add_sub_input_parameters_unknown",
                "input-level unknown parameter", "POST", url,
                body={"inputs": [{**fp32_input("INPUT0", ADD_SUB_IN0),
                                  "parameters": {"whatever": 1}},
                                 fp32_input("INPUT1", ADD_SUB_IN1)]})
    body, hlen = add_sub_binary()
    rec.request(f"{d}/add_sub_binary_inputs", "binary tensor inputs, JSON outputs", "POST",
                url, body=body, headers=binary_headers(hlen))
    body, hlen = add_sub_binary(parameters={"binary_data_output": True})
    rec.request(f"{d}/add_sub_binary_inputs_binary_outputs",
                "binary tensor inputs and binary_data_output", "POST", url, body=body,
                headers=binary_headers(hlen))
    header = {"inputs": [
        {"name": "INPUT0", "shape": [4], "datatype": "FP32",
         "parameters": {"binary_data_size": 16}},
        fp32_input("INPUT1", ADD_SUB_IN1)]}
    body, hlen = binary_body(header, [pack_fp32(ADD_SUB_IN0)])
    rec.request(f"{d}/add_sub_mixed_binary_and_json_inputs",
                "INPUT0 binary, INPUT1 JSON data", "POST", url, body=body,
                headers=binary_headers(hlen))
    body = json.dumps(add_sub_body(), separators=(",", ":")).encode()
    rec.request(f"{d}/add_sub_header_length_equals_body",
                "Inference-Header-Content-Length equal to the whole JSON body", "POST", url,
                body=body, headers=binary_headers(len(body)))
    rec.request(f"{d}/add_sub_header_length_zero",
                "Inference-Header-Content-Length: 0 with a JSON body", "POST", url,
                body=body, headers=binary_headers(0))
    rec.request(f"{d}/add_sub_gzip_request", "Content-Encoding: gzip request body", "POST",
                url, body=gzip.compress(body, mtime=0), headers={"Content-Encoding": "gzip"})
    rec.request(f"{d}/add_sub_accept_gzip", "Accept-Encoding: gzip", "POST", url,
                body=body, headers={"Accept-Encoding": "gzip"})
    rec.request(f"{d}/add_sub_whitespace_json", "JSON with lots of whitespace/newlines",
                "POST", url, body=json.dumps(add_sub_body(), indent=4))

    # Batching models
    burl = "/v2/models/batch_auto_complete/infer"
    rec.request(f"{d}/batch_auto_complete_batch2", "batch of 2 ([2,4])", "POST", burl,
                body={"inputs": [fp32_input("INPUT0", ADD_SUB_IN0 * 2, [2, 4]),
                                 fp32_input("INPUT1", ADD_SUB_IN1 * 2, [2, 4])]})
    rec.request(f"{d}/batch_auto_complete_batch4", "batch of 4 (== max_batch_size)", "POST",
                burl, body={"inputs": [fp32_input("INPUT0", ADD_SUB_IN0 * 4, [4, 4]),
                                       fp32_input("INPUT1", ADD_SUB_IN1 * 4, [4, 4])]})
    rec.request(f"{d}/nobatch_auto_complete", "model without batching", "POST",
                "/v2/models/nobatch_auto_complete/infer", body=add_sub_body())

    # BYTES
    iurl = "/v2/models/identity_bytes/infer"
    rec.request(f"{d}/identity_bytes_json", "BYTES JSON in/out, shape [1,3]", "POST", iurl,
                body={"inputs": [{"name": "INPUT0", "shape": [1, 3], "datatype": "BYTES",
                                  "data": ["hello", "wörld ✓", ""]}]})
    rec.request(f"{d}/identity_bytes_json_batch2", "BYTES JSON, shape [2,2]", "POST", iurl,
                body={"inputs": [{"name": "INPUT0", "shape": [2, 2], "datatype": "BYTES",
                                  "data": ["a", "bb", "ccc", "dddd"]}]})
    elements = [b"hello", b"\x00\xff\xfe binary", b""]
    header = {"inputs": [{"name": "INPUT0", "shape": [1, 3], "datatype": "BYTES",
                          "parameters": {"binary_data_size": len(pack_bytes_elements(elements))}}]}
    body, hlen = binary_body(header, [pack_bytes_elements(elements)])
    rec.request(f"{d}/identity_bytes_binary_in_json_out",
                "BYTES binary input incl. non-UTF-8 bytes, JSON output", "POST", iurl,
                body=body, headers=binary_headers(hlen))
    header["parameters"] = {"binary_data_output": True}
    body, hlen = binary_body(header, [pack_bytes_elements(elements)])
    rec.request(f"{d}/identity_bytes_binary_in_binary_out",
                "BYTES binary input, binary output", "POST", iurl, body=body,
                headers=binary_headers(hlen))
    rec.request(f"{d}/identity_bytes_json_in_binary_out", "BYTES JSON in, binary out",
                "POST", iurl,
                body={"inputs": [{"name": "INPUT0", "shape": [1, 2], "datatype": "BYTES",
                                  "data": ["x", "yz"]}],
                      "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}]})
    rec.request(f"{d}/identity_bytes_json_escapes", "BYTES with quotes, backslash, control chars",
                "POST", iurl,
                body={"inputs": [{"name": "INPUT0", "shape": [1, 3], "datatype": "BYTES",
                                  "data": ['say "hi"', "back\\slash", "tab\tnl\n\u0001"]}]})

    # Other dtypes
    rec.request(f"{d}/identity_fp16_binary_in_json_out", "FP16 binary in, JSON out",
                "POST", "/v2/models/identity_fp16/infer",
                *_binary_one("INPUT0", "FP16", [3], struct.pack("<3e", 1.0, 0.1, -65504.0)))
    rec.request(f"{d}/identity_fp16_binary", "FP16 binary in/out", "POST",
                "/v2/models/identity_fp16/infer",
                *_binary_one("INPUT0", "FP16", [3], struct.pack("<3e", 1.0, 0.1, -65504.0),
                             binary_out=True))
    rec.request(f"{d}/identity_bool_json", "BOOL JSON true/false", "POST",
                "/v2/models/identity_bool/infer",
                body={"inputs": [{"name": "INPUT0", "shape": [3], "datatype": "BOOL",
                                  "data": [True, False, True]}]})
    rec.request(f"{d}/identity_bool_binary", "BOOL binary in, JSON out", "POST",
                "/v2/models/identity_bool/infer",
                *_binary_one("INPUT0", "BOOL", [3], bytes([1, 0, 1])))
    rec.request(f"{d}/identity_int8_json", "INT8 JSON extremes", "POST",
                "/v2/models/identity_int8/infer",
                body={"inputs": [{"name": "INPUT0", "shape": [3], "datatype": "INT8",
                                  "data": [-128, 0, 127]}]})
    rec.request(f"{d}/identity_int8_empty", "INT8 zero-element tensor shape [0]", "POST",
                "/v2/models/identity_int8/infer",
                body={"inputs": [{"name": "INPUT0", "shape": [0], "datatype": "INT8",
                                  "data": []}]})
    durl = "/v2/models/identity_dtypes/infer"
    dtype_data: dict[str, list[Any]] = {
        "BOOL": [True, False],
        "UINT8": [0, 255],
        "UINT16": [0, 65535],
        "UINT32": [0, 4294967295],
        "UINT64": [0, 18446744073709551615],
        "INT8": [-128, 127],
        "INT16": [-32768, 32767],
        "INT32": [-2147483648, 2147483647],
        "INT64": [-9223372036854775808, 9223372036854775807],
        "FP32": [3.4028234663852886e38, 1.1754943508222875e-38],
        "FP64": [1e300, 0.1],
        "BYTES": ["a", "b"],
    }
    all_inputs = [{"name": f"IN_{'STRING' if t == 'BYTES' else t}", "shape": [2],
                   "datatype": t, "data": v} for t, v in dtype_data.items()]
    rec.request(f"{d}/identity_dtypes_all_json",
                "all dtypes but FP16 (JSON FP16 input is rejected) at extremes, JSON in/out",
                "POST", durl, body={"inputs": all_inputs})
    rec.request(f"{d}/identity_dtypes_all_binary_out", "all dtypes but FP16, binary_data_output",
                "POST", durl, body={"inputs": all_inputs,
                                    "parameters": {"binary_data_output": True}})
    rec.request(f"{d}/identity_dtypes_one_optional", "only IN_INT32 sent (others optional)",
                "POST", durl,
                body={"inputs": [{"name": "IN_INT32", "shape": [2], "datatype": "INT32",
                                  "data": [1, 2]}]})
    rec.request(f"{d}/identity_dtypes_fp32_special_values",
                "FP32 NaN/Inf/-Inf/-0.0 sent binary, returned as JSON", "POST", durl,
                *_binary_one("IN_FP32", "FP32", [4],
                             struct.pack("<4f", float("nan"), float("inf"), float("-inf"), -0.0)))
    rec.request(f"{d}/identity_dtypes_fp64_special_values",
                "FP64 NaN/Inf sent binary, returned as JSON", "POST", durl,
                *_binary_one("IN_FP64", "FP64", [3],
                             struct.pack("<3d", float("nan"), float("inf"), 5e-324)))
    rec.request(f"{d}/identity_dtypes_requested_output_not_produced",
                "OUT_INT8 requested but IN_INT8 not sent (model produces no OUT_INT8)",
                "POST", durl,
                body={"inputs": [{"name": "IN_INT32", "shape": [2], "datatype": "INT32",
                                  "data": [1, 2]}], "outputs": [{"name": "OUT_INT8"}]})

    fp64_values = [0.1, 1 / 3, 2 / 3, 1e-7, 1e-6, 1e-5, 0.0001, 123456789.0, 1e15, 1e16,
                   1e20, 1e21, 1e22, 1.5e300, -2.5e-300, 9007199254740993.0, 5e-324,
                   1.7976931348623157e308, 100.0, -0.0, 3.14159265358979]
    rec.request(f"{d}/float_formatting_fp64", "FP64 JSON output formatting of many magnitudes",
                "POST", durl, body={"inputs": [{"name": "IN_FP64", "shape": [len(fp64_values)],
                                                "datatype": "FP64", "data": fp64_values}]})
    fp32_values = [0.1, 0.2, 0.3, 1 / 3, 1e-7, 1e-6, 1e-5, 1e-4, 16777217.0, 1e7, 1e8, 1e15,
                   1e16, 1e20, 1e21, 1e22, 1e38, 1.4e-45, 3.4028234663852886e38, 100.0,
                   2.5, 1234.5678]
    rec.request(f"{d}/float_formatting_fp32", "FP32 JSON output formatting of many magnitudes",
                "POST", durl, body={"inputs": [{"name": "IN_FP32", "shape": [len(fp32_values)],
                                                "datatype": "FP32", "data": fp32_values}]})
    rec.request(f"{d}/identity_dtypes_scalar_like_shape",
                "shape [1] INT32 (single element, still an array in JSON)", "POST", durl,
                body={"inputs": [{"name": "IN_INT32", "shape": [1], "datatype": "INT32",
                                  "data": [7]}]})
    rec.request(f"{d}/identity_dtypes_2d", "INT32 with shape [2,3] given flat", "POST", durl,
                body={"inputs": [{"name": "IN_INT32", "shape": [2, 3], "datatype": "INT32",
                                  "data": [1, 2, 3, 4, 5, 6]}]})

    # kitchen_sink: versions, optional input, reshape, classification
    kurl = "/v2/models/kitchen_sink/infer"
    k_in = [fp32_input("INPUT0", ADD_SUB_IN0, [1, 4]), fp32_input("SCALE", [2.0], [1, 1])]
    rec.request(f"{d}/kitchen_sink_default_version", "no version: latest loaded (3)",
                "POST", kurl, body={"inputs": k_in})
    rec.request(f"{d}/kitchen_sink_version_2", "explicit version 2", "POST",
                "/v2/models/kitchen_sink/versions/2/infer", body={"inputs": k_in})
    rec.request(f"{d}/kitchen_sink_optional_given", "OPTIONAL0 provided", "POST", kurl,
                body={"inputs": [*k_in, fp32_input("OPTIONAL0", [10.0] * 4, [1, 4])]})
    rec.request(f"{d}/kitchen_sink_batch3", "batch 3", "POST", kurl,
                body={"inputs": [fp32_input("INPUT0", ADD_SUB_IN0 * 3, [3, 4]),
                                 fp32_input("SCALE", [1.0, 2.0, 3.0], [3, 1])]})
    rec.request(f"{d}/kitchen_sink_classification_2", "OUTPUT0 classification: 2 (labels.txt)",
                "POST", kurl,
                body={"inputs": k_in,
                      "outputs": [{"name": "OUTPUT0", "parameters": {"classification": 2}}]})
    rec.request(f"{d}/kitchen_sink_classification_batch2",
                "classification: 3 with batch 2", "POST", kurl,
                body={"inputs": [fp32_input("INPUT0", [4.0, 1.0, 3.0, 2.0, 0.0, 9.0, 5.0, 7.0], [2, 4]),
                                 fp32_input("SCALE", [1.0, 1.0], [2, 1])],
                      "outputs": [{"name": "OUTPUT0", "parameters": {"classification": 3}}]})
    rec.request(f"{d}/kitchen_sink_classification_no_labels",
                "classification: 1 on VERSION output (no label file)", "POST", kurl,
                body={"inputs": k_in,
                      "outputs": [{"name": "VERSION", "parameters": {"classification": 1}}]})
    rec.request(f"{d}/kitchen_sink_classification_binary",
                "classification: 2 with binary_data true", "POST", kurl,
                body={"inputs": k_in,
                      "outputs": [{"name": "OUTPUT0",
                                   "parameters": {"classification": 2, "binary_data": True}}]})
    rec.request(f"{d}/kitchen_sink_scale_shape_1", "SCALE sent with shape [1] (no batch dim)",
                "POST", kurl,
                body={"inputs": [fp32_input("INPUT0", ADD_SUB_IN0, [1, 4]),
                                 fp32_input("SCALE", [2.0], [1])]})
    rec.request(f"{d}/specific_versions_default", "specific [1,3]: default version", "POST",
                "/v2/models/specific_versions/infer",
                body={"inputs": [fp32_input("INPUT0", ADD_SUB_IN0)]})
    rec.request(f"{d}/specific_versions_1", "specific [1,3]: version 1", "POST",
                "/v2/models/specific_versions/versions/1/infer",
                body={"inputs": [fp32_input("INPUT0", ADD_SUB_IN0)]})
    rec.request(f"{d}/all_versions_default", "all versions: default version", "POST",
                "/v2/models/all_versions/infer",
                body={"inputs": [fp32_input("INPUT0", ADD_SUB_IN0)]})
    rec.request(f"{d}/all_versions_1", "all versions: version 1", "POST",
                "/v2/models/all_versions/versions/1/infer",
                body={"inputs": [fp32_input("INPUT0", ADD_SUB_IN0)]})


def capture_execute_errors(rec: Recorder) -> None:
    """Model-side failures (response error / exception) and their stats effect."""
    d = "execute_error"
    url = "/v2/models/execute_error/infer"

    def body(mode: int) -> dict[str, Any]:
        return {"inputs": [{"name": "MODE", "shape": [1], "datatype": "INT32", "data": [mode]}]}

    rec.request(f"{d}/0_stats_initial", "stats before any request", "GET",
                "/v2/models/execute_error/stats")
    rec.request(f"{d}/1_ok", "MODE 0: success", "POST", url, body=body(0))
    rec.request(f"{d}/2_error_response", "MODE 1: InferenceResponse(error=TritonError(...))",
                "POST", url, body=body(1))
    rec.request(f"{d}/3_raises", "MODE 2: execute() raises ValueError", "POST", url,
                body=body(2))
    rec.request(f"{d}/4_ok_after_raise", "MODE 0 again: the model still works", "POST", url,
                body=body(0))
    rec.request(f"{d}/5_error_response_with_id", "MODE 1 with request id", "POST", url,
                body={**body(1), "id": "req-7"})
    rec.request(f"{d}/6_stats_after", "stats after 2 successes and 3 model failures", "GET",
                "/v2/models/execute_error/stats")


def _binary_one(
    name: str, datatype: str, shape: list[int], blob: bytes, binary_out: bool = False
) -> tuple[bytes, dict[str, str]]:
    """(body, headers) for a request with one binary input, as positional args."""
    header: dict[str, Any] = {"inputs": [{"name": name, "shape": shape, "datatype": datatype,
                                          "parameters": {"binary_data_size": len(blob)}}]}
    if binary_out:
        header["parameters"] = {"binary_data_output": True}
    body, hlen = binary_body(header, [blob])
    return body, binary_headers(hlen)


def capture_infer_errors(rec: Recorder) -> None:
    d = "errors"
    url = "/v2/models/add_sub/infer"
    in0 = fp32_input("INPUT0", ADD_SUB_IN0)
    in1 = fp32_input("INPUT1", ADD_SUB_IN1)

    # Unknown model / version
    rec.request(f"{d}/unknown_model_infer", "infer on a model that does not exist", "POST",
                "/v2/models/nosuch/infer", body=add_sub_body())
    rec.request(f"{d}/unknown_model_metadata", "GET /v2/models/nosuch", "GET", "/v2/models/nosuch")
    rec.request(f"{d}/unknown_model_config", "GET /v2/models/nosuch/config", "GET",
                "/v2/models/nosuch/config")
    rec.request(f"{d}/unknown_model_ready", "GET /v2/models/nosuch/ready", "GET",
                "/v2/models/nosuch/ready")
    rec.request(f"{d}/unknown_model_stats", "GET /v2/models/nosuch/stats", "GET",
                "/v2/models/nosuch/stats")
    rec.request(f"{d}/unknown_model_version_metadata", "GET /v2/models/nosuch/versions/1",
                "GET", "/v2/models/nosuch/versions/1")
    rec.request(f"{d}/unknown_version_infer", "infer on add_sub version 99", "POST",
                "/v2/models/add_sub/versions/99/infer", body=add_sub_body())
    rec.request(f"{d}/unknown_version_stats", "GET /v2/models/add_sub/versions/99/stats",
                "GET", "/v2/models/add_sub/versions/99/stats")
    rec.request(f"{d}/version_on_disk_not_loaded_infer",
                "kitchen_sink version 1 exists on disk but policy latest-2 did not load it",
                "POST", "/v2/models/kitchen_sink/versions/1/infer",
                body={"inputs": [fp32_input("INPUT0", ADD_SUB_IN0, [1, 4]),
                                 fp32_input("SCALE", [2.0], [1, 1])]})
    rec.request(f"{d}/specific_versions_2_infer", "specific [1,3]: version 2 infer", "POST",
                "/v2/models/specific_versions/versions/2/infer",
                body={"inputs": [fp32_input("INPUT0", ADD_SUB_IN0)]})
    rec.request(f"{d}/version_non_numeric", "GET /v2/models/add_sub/versions/abc", "GET",
                "/v2/models/add_sub/versions/abc")
    rec.request(f"{d}/version_negative", "GET /v2/models/add_sub/versions/-1", "GET",
                "/v2/models/add_sub/versions/-1")
    rec.request(f"{d}/version_zero", "GET /v2/models/add_sub/versions/0", "GET",
                "/v2/models/add_sub/versions/0")
    rec.request(f"{d}/version_leading_zero", "GET /v2/models/add_sub/versions/01", "GET",
                "/v2/models/add_sub/versions/01")
    rec.request(f"{d}/version_empty", "GET /v2/models/add_sub/versions/", "GET",
                "/v2/models/add_sub/versions/")
    rec.request(f"{d}/version_non_numeric_infer", "POST /v2/models/add_sub/versions/abc/infer",
                "POST", "/v2/models/add_sub/versions/abc/infer", body=add_sub_body())

    # Input set problems
    rec.request(f"{d}/missing_input", "only INPUT0 given", "POST", url, body={"inputs": [in0]})
    rec.request(f"{d}/extra_input", "unknown input INPUT2 in addition", "POST", url,
                body={"inputs": [in0, in1, fp32_input("INPUT2", ADD_SUB_IN0)]})
    rec.request(f"{d}/duplicate_input", "INPUT0 given twice", "POST", url,
                body={"inputs": [in0, in0, in1]})
    rec.request(f"{d}/wrong_datatype", "INPUT0 declared INT32 instead of FP32", "POST", url,
                body={"inputs": [{**in0, "datatype": "INT32", "data": [1, 2, 3, 4]}, in1]})
    rec.request(f"{d}/unknown_datatype", 'datatype "FP99"', "POST", url,
                body={"inputs": [{**in0, "datatype": "FP99"}, in1]})
    rec.request(f"{d}/lowercase_datatype", 'datatype "fp32"', "POST", url,
                body={"inputs": [{**in0, "datatype": "fp32"}, in1]})
    rec.request(f"{d}/wrong_shape_2x2", "shape [2,2] for dims [4]", "POST", url,
                body={"inputs": [{**in0, "shape": [2, 2]}, in1]})
    rec.request(f"{d}/wrong_shape_5", "shape [5] with 5 elements for dims [4]", "POST", url,
                body={"inputs": [fp32_input("INPUT0", ADD_SUB_IN0 + [5.0]), in1]})
    rec.request(f"{d}/wrong_shape_with_id", 'shape [2,2] with "id": "req-1"', "POST", url,
                body={"id": "req-1", "inputs": [{**in0, "shape": [2, 2]}, in1]})
    rec.request(f"{d}/missing_input_with_id", 'only INPUT0 with "id": "req-2"', "POST", url,
                body={"id": "req-2", "inputs": [in0]})
    rec.request(f"{d}/unknown_requested_output_with_id", 'unknown output with "id": "req-3"',
                "POST", url, body=add_sub_body(id="req-3", outputs=[{"name": "NOPE"}]))
    rec.request(f"{d}/shape_negative", "shape [-1]", "POST", url,
                body={"inputs": [{**in0, "shape": [-1]}, in1]})
    rec.request(f"{d}/shape_not_integer", 'shape ["4"]', "POST", url,
                body={"inputs": [{**in0, "shape": ["4"]}, in1]})
    rec.request(f"{d}/shape_float", "shape [4.0]", "POST", url,
                body={"inputs": [{**in0, "shape": [4.0]}, in1]})
    rec.request(f"{d}/json_too_few_elements", "shape [4] but 3 data elements", "POST", url,
                body={"inputs": [{**in0, "data": [1.0, 2.0, 3.0]}, in1]})
    rec.request(f"{d}/json_too_many_elements", "shape [4] but 5 data elements", "POST", url,
                body={"inputs": [{**in0, "data": [1.0, 2.0, 3.0, 4.0, 5.0]}, in1]})
    rec.request(f"{d}/json_data_string_in_fp32", "string element in FP32 data", "POST", url,
                body={"inputs": [{**in0, "data": [1.0, "2", 3.0, 4.0]}, in1]})
    rec.request(f"{d}/json_data_bool_in_fp32", "true element in FP32 data", "POST", url,
                body={"inputs": [{**in0, "data": [1.0, True, 3.0, 4.0]}, in1]})
    rec.request(f"{d}/json_data_null", "null element in FP32 data", "POST", url,
                body={"inputs": [{**in0, "data": [1.0, None, 3.0, 4.0]}, in1]})
    rec.request(f"{d}/json_data_not_array", "data is a number, not an array", "POST", url,
                body={"inputs": [{**in0, "data": 1.0}, in1]})
    rec.request(f"{d}/json_data_ragged_nested", "nested data [[1,2,3],[4]]", "POST", url,
                body={"inputs": [{**in0, "data": [[1.0, 2.0, 3.0], [4.0]]}, in1]})
    rec.request(f"{d}/input_missing_name", "input without name", "POST", url,
                body={"inputs": [{k: v for k, v in in0.items() if k != "name"}, in1]})
    rec.request(f"{d}/input_missing_shape", "input without shape", "POST", url,
                body={"inputs": [{k: v for k, v in in0.items() if k != "shape"}, in1]})
    rec.request(f"{d}/input_missing_datatype", "input without datatype", "POST", url,
                body={"inputs": [{k: v for k, v in in0.items() if k != "datatype"}, in1]})
    rec.request(f"{d}/input_missing_data", "input without data nor binary_data_size", "POST",
                url, body={"inputs": [{k: v for k, v in in0.items() if k != "data"}, in1]})
    rec.request(f"{d}/input_name_not_string", "input name is a number", "POST", url,
                body={"inputs": [{**in0, "name": 5}, in1]})
    rec.request(f"{d}/input_not_object", "inputs element is a string", "POST", url,
                body={"inputs": ["INPUT0", in1]})
    rec.request(f"{d}/inputs_missing", "body {} without inputs", "POST", url, body={})
    rec.request(f"{d}/inputs_not_array", '"inputs": {}', "POST", url, body={"inputs": {}})
    rec.request(f"{d}/inputs_empty", '"inputs": []', "POST", url, body={"inputs": []})
    rec.request(f"{d}/id_not_string", '"id": 42', "POST", url, body=add_sub_body(id=42))
    rec.request(f"{d}/parameters_not_object", '"parameters": []', "POST", url,
                body=add_sub_body(parameters=[]))
    rec.request(f"{d}/binary_data_output_not_bool", '"binary_data_output": "yes"', "POST",
                url, body=add_sub_body(parameters={"binary_data_output": "yes"}))
    rec.request(f"{d}/unknown_requested_output", 'outputs [{"name": "NOPE"}]', "POST", url,
                body=add_sub_body(outputs=[{"name": "NOPE"}]))
    rec.request(f"{d}/requested_output_missing_name", "outputs [{}]", "POST", url,
                body=add_sub_body(outputs=[{}]))
    rec.request(f"{d}/outputs_not_array", '"outputs": {}', "POST", url,
                body=add_sub_body(outputs={}))
    rec.request(f"{d}/classification_on_nonbatch_bad_value", 'classification: "two"', "POST",
                url, body=add_sub_body(outputs=[{"name": "OUTPUT0",
                                                 "parameters": {"classification": "two"}}]))

    # Reserved request parameters on a model without sequence batching
    rec.request(f"{d}/sequence_id_on_plain_model", 'parameters {"sequence_id": 5}', "POST",
                url, body=add_sub_body(parameters={"sequence_id": 5}))
    rec.request(f"{d}/sequence_start_on_plain_model",
                'parameters {"sequence_id": 5, "sequence_start": true}', "POST", url,
                body=add_sub_body(parameters={"sequence_id": 5, "sequence_start": True}))
    rec.request(f"{d}/priority_parameter", 'parameters {"priority": 1}', "POST", url,
                body=add_sub_body(parameters={"priority": 1}))
    rec.request(f"{d}/timeout_parameter", 'parameters {"timeout": 1000000}', "POST", url,
                body=add_sub_body(parameters={"timeout": 1000000}))
    rec.request(f"{d}/reserved_triton_parameter", 'parameters {"triton_x": 1}', "POST", url,
                body=add_sub_body(parameters={"triton_x": 1}))
    rec.request(f"{d}/priority_not_integer", 'parameters {"priority": "high"}', "POST", url,
                body=add_sub_body(parameters={"priority": "high"}))
    rec.request(f"{d}/binary_data_not_bool", 'output parameters {"binary_data": 1}', "POST",
                url, body=add_sub_body(outputs=[{"name": "OUTPUT0",
                                                 "parameters": {"binary_data": 1}}]))
    rec.request(f"{d}/unknown_shared_memory_region",
                "input parameters shared_memory_region naming an unregistered region",
                "POST", url,
                body={"inputs": [{"name": "INPUT0", "shape": [4], "datatype": "FP32",
                                  "parameters": {"shared_memory_region": "nope",
                                                 "shared_memory_byte_size": 16}}, in1]})

    # Body-level problems
    rec.request(f"{d}/invalid_json", "body '{'", "POST", url, body="{")
    rec.request(f"{d}/invalid_json_trailing_garbage", "valid JSON followed by 'xyz'", "POST",
                url, body=json.dumps(add_sub_body()) + "xyz")
    rec.request(f"{d}/json_array_body", "body '[]'", "POST", url, body="[]")
    rec.request(f"{d}/json_number_body", "body '42'", "POST", url, body="42")
    rec.request(f"{d}/json_string_body", 'body \'"x"\'', "POST", url, body='"x"')
    rec.request(f"{d}/json_null_body", "body 'null'", "POST", url, body="null")
    rec.request(f"{d}/empty_body", "POST infer with an empty body", "POST", url, body=b"")
    rec.request(f"{d}/non_utf8_body", "body with invalid UTF-8 inside a JSON string", "POST",
                url, body=b'{"id":"\xff\xfe","inputs":[]}')
    rec.request(f"{d}/gzip_header_plain_body", "Content-Encoding: gzip with a plain body",
                "POST", url, body=json.dumps(add_sub_body()),
                headers={"Content-Encoding": "gzip"})
    rec.request(f"{d}/unknown_content_encoding", "Content-Encoding: br", "POST", url,
                body=json.dumps(add_sub_body()), headers={"Content-Encoding": "br"})

    # Binary extension problems
    body, hlen = add_sub_binary(sizes=(8, 16), blobs=(pack_fp32(ADD_SUB_IN0[:2]),
                                                       pack_fp32(ADD_SUB_IN1)))
    rec.request(f"{d}/binary_size_too_small_consistent",
                "INPUT0 binary_data_size 8 (2 floats) for shape [4], body consistent",
                "POST", url, body=body, headers=binary_headers(hlen))
    body, hlen = add_sub_binary(sizes=(20, 16), blobs=(pack_fp32(ADD_SUB_IN0 + [9.0]),
                                                        pack_fp32(ADD_SUB_IN1)))
    rec.request(f"{d}/binary_size_too_large_consistent",
                "INPUT0 binary_data_size 20 (5 floats) for shape [4], body consistent",
                "POST", url, body=body, headers=binary_headers(hlen))
    body, hlen = add_sub_binary(sizes=(8, 16))
    rec.request(f"{d}/binary_size_too_small_extra_body",
                "binary_data_size 8+16 but 32 binary bytes follow the header", "POST", url,
                body=body, headers=binary_headers(hlen))
    body, hlen = add_sub_binary(sizes=(32, 16))
    rec.request(f"{d}/binary_size_larger_than_body",
                "binary_data_size 32+16 but only 32 binary bytes follow", "POST", url,
                body=body, headers=binary_headers(hlen))
    body, hlen = add_sub_binary(sizes=(-16, 16))
    rec.request(f"{d}/binary_size_negative", "binary_data_size -16", "POST", url,
                body=body, headers=binary_headers(hlen))
    body, hlen = add_sub_binary(sizes=(16, 16))
    body_str_size = body.replace(b'"binary_data_size":16', b'"binary_data_size":"16"', 1)
    rec.request(f"{d}/binary_size_string", 'binary_data_size "16" (string)', "POST", url,
                body=body_str_size,
                headers=binary_headers(hlen + 2))
    header = {"inputs": [{**in0, "parameters": {"binary_data_size": 16}}, in1]}
    body, hlen = binary_body(header, [pack_fp32(ADD_SUB_IN0)])
    rec.request(f"{d}/binary_size_and_json_data", "binary_data_size and data both given",
                "POST", url, body=body, headers=binary_headers(hlen))
    body, hlen = add_sub_binary()
    rec.request(f"{d}/binary_without_header_length",
                "binary inputs but no Inference-Header-Content-Length header", "POST", url,
                body=body, headers={"Content-Type": "application/octet-stream"})
    rec.request(f"{d}/header_length_larger_than_body",
                "Inference-Header-Content-Length larger than the whole body", "POST", url,
                body=body, headers=binary_headers(len(body) + 100))
    rec.request(f"{d}/header_length_into_json",
                "Inference-Header-Content-Length pointing into the middle of the JSON",
                "POST", url, body=body, headers=binary_headers(hlen // 2))
    rec.request(f"{d}/header_length_into_binary",
                "Inference-Header-Content-Length 8 bytes past the JSON end", "POST", url,
                body=body, headers=binary_headers(hlen + 8))
    rec.request(f"{d}/header_length_short_by_one",
                "Inference-Header-Content-Length one less than the JSON length", "POST", url,
                body=body, headers=binary_headers(hlen - 1))
    rec.request(f"{d}/header_length_non_numeric", "Inference-Header-Content-Length: abc",
                "POST", url, body=body, headers=binary_headers("abc"))
    rec.request(f"{d}/header_length_negative", "Inference-Header-Content-Length: -5",
                "POST", url, body=body, headers=binary_headers("-5"))
    truncated = body[: hlen + 20]
    rec.request(f"{d}/binary_body_truncated", "binary part cut after 20 of 32 bytes",
                "POST", url, body=truncated, headers=binary_headers(hlen))
    body_out, hlen_out = add_sub_binary(sizes=(16, 16))
    rec.request(f"{d}/binary_body_missing", "header only, no binary part", "POST", url,
                body=body_out[:hlen_out], headers=binary_headers(hlen_out))
    elements = [b"abc"]
    bad_bytes = struct.pack("<I", 100) + b"abc"
    rec.request(f"{d}/bytes_binary_bad_length_prefix",
                "BYTES binary element whose length prefix (100) exceeds the buffer", "POST",
                "/v2/models/identity_bytes/infer",
                *_binary_one("INPUT0", "BYTES", [1, 1], bad_bytes))
    rec.request(f"{d}/bytes_binary_too_many_elements",
                "BYTES binary with 2 elements for shape [1,1]", "POST",
                "/v2/models/identity_bytes/infer",
                *_binary_one("INPUT0", "BYTES", [1, 1], pack_bytes_elements([b"a", b"b"])))
    rec.request(f"{d}/bytes_binary_too_few_elements",
                "BYTES binary with 1 element for shape [1,2]", "POST",
                "/v2/models/identity_bytes/infer",
                *_binary_one("INPUT0", "BYTES", [1, 2], pack_bytes_elements(elements)))
    rec.request(f"{d}/bytes_json_non_string_element", "BYTES JSON data [1, 2]", "POST",
                "/v2/models/identity_bytes/infer",
                body={"inputs": [{"name": "INPUT0", "shape": [1, 2], "datatype": "BYTES",
                                  "data": [1, 2]}]})

    # dtype-specific JSON problems
    rec.request(f"{d}/int8_out_of_range", "INT8 JSON value 300", "POST",
                "/v2/models/identity_int8/infer",
                body={"inputs": [{"name": "INPUT0", "shape": [1], "datatype": "INT8",
                                  "data": [300]}]})
    rec.request(f"{d}/int8_float_value", "INT8 JSON value 1.5", "POST",
                "/v2/models/identity_int8/infer",
                body={"inputs": [{"name": "INPUT0", "shape": [1], "datatype": "INT8",
                                  "data": [1.5]}]})
    rec.request(f"{d}/bool_as_int", "BOOL JSON data [1, 0]", "POST",
                "/v2/models/identity_bool/infer",
                body={"inputs": [{"name": "INPUT0", "shape": [2], "datatype": "BOOL",
                                  "data": [1, 0]}]})
    rec.request(f"{d}/uint64_negative", "UINT64 JSON value -1", "POST",
                "/v2/models/identity_dtypes/infer",
                body={"inputs": [{"name": "IN_UINT64", "shape": [1], "datatype": "UINT64",
                                  "data": [-1]}]})
    rec.request(f"{d}/fp32_value_overflow", "FP32 JSON value 1e300", "POST", url,
                body={"inputs": [{**in0, "data": [1e300, 1.0, 1.0, 1.0]}, in1]})

    rec.request(f"{d}/fp16_json_input", "FP16 input given as JSON data", "POST",
                "/v2/models/identity_fp16/infer",
                body={"inputs": [{"name": "INPUT0", "shape": [3], "datatype": "FP16",
                                  "data": [1.0, 0.1, -65504.0]}]})
    rec.request(f"{d}/fp16_json_input_among_others",
                "IN_FP16 JSON together with a valid IN_INT32", "POST",
                "/v2/models/identity_dtypes/infer",
                body={"inputs": [{"name": "IN_INT32", "shape": [1], "datatype": "INT32",
                                  "data": [1]},
                                 {"name": "IN_FP16", "shape": [1], "datatype": "FP16",
                                  "data": [0.5]}]})

    # Batching problems
    burl = "/v2/models/batch_auto_complete/infer"
    rec.request(f"{d}/batch_over_max", "batch_auto_complete batch 5 > max_batch_size 4",
                "POST", burl,
                body={"inputs": [fp32_input("INPUT0", ADD_SUB_IN0 * 5, [5, 4]),
                                 fp32_input("INPUT1", ADD_SUB_IN1 * 5, [5, 4])]})
    rec.request(f"{d}/batch_missing_batch_dim", "batching model, shape [4] (no batch dim)",
                "POST", burl, body=add_sub_body())
    rec.request(f"{d}/batch_size_mismatch", "INPUT0 batch 2, INPUT1 batch 1", "POST", burl,
                body={"inputs": [fp32_input("INPUT0", ADD_SUB_IN0 * 2, [2, 4]),
                                 fp32_input("INPUT1", ADD_SUB_IN1, [1, 4])]})
    rec.request(f"{d}/batch_zero", "batching model, batch 0 ([0,4])", "POST", burl,
                body={"inputs": [fp32_input("INPUT0", [], [0, 4]),
                                 fp32_input("INPUT1", [], [0, 4])]})
    rec.request(f"{d}/nobatch_with_batch_dim", "non-batching model given shape [1,4]",
                "POST", "/v2/models/nobatch_auto_complete/infer",
                body={"inputs": [fp32_input("INPUT0", ADD_SUB_IN0, [1, 4]),
                                 fp32_input("INPUT1", ADD_SUB_IN1, [1, 4])]})
    rec.request(f"{d}/bytes_batch_over_max", "identity_bytes batch 9 > 8", "POST",
                "/v2/models/identity_bytes/infer",
                body={"inputs": [{"name": "INPUT0", "shape": [9, 1], "datatype": "BYTES",
                                  "data": ["x"] * 9}]})
    rec.request(f"{d}/kitchen_sink_batch_over_max", "kitchen_sink batch 17 > 16", "POST",
                "/v2/models/kitchen_sink/infer",
                body={"inputs": [fp32_input("INPUT0", ADD_SUB_IN0 * 17, [17, 4]),
                                 fp32_input("SCALE", [1.0] * 17, [17, 1])]})
    rec.request(f"{d}/kitchen_sink_missing_required", "kitchen_sink without SCALE", "POST",
                "/v2/models/kitchen_sink/infer",
                body={"inputs": [fp32_input("INPUT0", ADD_SUB_IN0, [1, 4])]})

    # Routing / method problems
    rec.request(f"{d}/unknown_route_post", "POST /v2/foo", "POST", "/v2/foo", body="{}")
    rec.request(f"{d}/unknown_route_get", "GET /v2/foo", "GET", "/v2/foo")
    rec.request(f"{d}/root_get", "GET /", "GET", "/")
    rec.request(f"{d}/v2_trailing_slash", "GET /v2/", "GET", "/v2/")
    rec.request(f"{d}/model_unknown_subroute", "GET /v2/models/add_sub/bar", "GET",
                "/v2/models/add_sub/bar")
    rec.request(f"{d}/model_unknown_subroute_post", "POST /v2/models/add_sub/bar", "POST",
                "/v2/models/add_sub/bar", body="{}")
    rec.request(f"{d}/get_on_infer", "GET on the infer route", "GET", url)
    rec.request(f"{d}/put_on_infer", "PUT on the infer route", "PUT", url,
                body=json.dumps(add_sub_body()))
    rec.request(f"{d}/post_model_metadata", "POST /v2/models/add_sub", "POST",
                "/v2/models/add_sub", body="{}")
    rec.request(f"{d}/post_model_ready", "POST /v2/models/add_sub/ready", "POST",
                "/v2/models/add_sub/ready", body="{}")
    rec.request(f"{d}/post_model_config", "POST /v2/models/add_sub/config", "POST",
                "/v2/models/add_sub/config", body="{}")
    rec.request(f"{d}/delete_model", "DELETE /v2/models/add_sub", "DELETE",
                "/v2/models/add_sub")
    rec.request(f"{d}/models_list_get", "GET /v2/models", "GET", "/v2/models")
    rec.request(f"{d}/infer_trailing_slash", "POST /v2/models/add_sub/infer/", "POST",
                "/v2/models/add_sub/infer/", body=add_sub_body())
    rec.request(f"{d}/model_name_case", "GET /v2/models/ADD_SUB (case differs)", "GET",
                "/v2/models/ADD_SUB")
    rec.request(f"{d}/model_load_in_mode_none", "POST /v2/repository/models/add_sub/load",
                "POST", "/v2/repository/models/add_sub/load", body="")
    rec.request(f"{d}/model_unload_in_mode_none",
                "POST /v2/repository/models/add_sub/unload", "POST",
                "/v2/repository/models/add_sub/unload", body="")


def capture_large_body(rec: Recorder) -> None:
    """2.51 has no --http-max-input-size; show that a >64 MiB body is accepted."""
    pad_bytes = 70 * 1024 * 1024
    body = (" " * pad_bytes + json.dumps(add_sub_body())).encode()
    rec.request("infer/add_sub_70MiB_whitespace_body",
                f"valid add_sub JSON preceded by {pad_bytes} spaces ({len(body)} bytes total); "
                "request body omitted from this file",
                "POST", "/v2/models/add_sub/infer", body=body, record_body=False)


def capture_final_stats(rec: Recorder) -> None:
    for model in GOOD_MODEL_VERSIONS:
        rec.request(f"stats/{model}", f"GET /v2/models/{model}/stats after the captures",
                    "GET", f"/v2/models/{model}/stats")
    rec.request("stats/all_models", "GET /v2/models/stats after the captures", "GET",
                "/v2/models/stats")


def collect_initialize_args(args_dir: Path, out_dir: Path) -> None:
    def load(path: Path) -> dict[str, Any]:
        args = json.loads(path.read_text())
        return {"file": path.name, "args": args,
                "model_config_parsed": json.loads(args["model_config"])}

    add_sub = sorted(args_dir.glob("add_sub__*.json"))
    kitchen = sorted(args_dir.glob("kitchen_sink__*.json"))
    (out_dir / "initialize_args_add_sub.json").write_text(
        json.dumps([load(p) for p in add_sub], indent=2) + "\n")
    (out_dir / "initialize_args_kitchen_sink.json").write_text(
        json.dumps([load(p) for p in kitchen], indent=2) + "\n")


def session_good(peer: Path, port: int, out: Path) -> dict[str, Any]:
    """Main session: the good repository with default flags."""
    args_dir = Path(tempfile.mkdtemp(prefix="naiad-golden-args-"))
    log = out / "good_repo_log.txt"
    rec = Recorder(out / "good", port)
    with triton(peer, GOOD_REPO, port, log,
                env_extra={"NAIAD_GOLDEN_ARGS_DIR": str(args_dir)}):
        capture_server_endpoints(rec, "server")
        for model, versions in GOOD_MODEL_VERSIONS.items():
            capture_model_endpoints(rec, model, versions)
        capture_stats_sequence(rec)
        capture_infer_success(rec)
        capture_infer_errors(rec)
        capture_execute_errors(rec)
        capture_large_body(rec)
        capture_final_stats(rec)
    collect_initialize_args(args_dir, out)
    shutil.rmtree(args_dir, ignore_errors=True)
    return rec.index


def session_alt_config(peer: Path, port: int, out: Path) -> dict[str, Any]:
    """--model-config-name=alt: custom_name picks configs/alt.pbtxt."""
    rec = Recorder(out / "alt_config", port)
    with triton(peer, GOOD_REPO, port, out / "alt_config_log.txt",
                extra_flags=["--model-config-name=alt"]):
        rec.request("custom_name_config", "custom_name config under --model-config-name=alt",
                    "GET", "/v2/models/custom_name/config")
        rec.request("custom_name_metadata", "custom_name metadata under alt", "GET",
                    "/v2/models/custom_name")
        rec.request("custom_name_infer", "custom_name infer with batch dim (alt has max_batch_size 2)",
                    "POST", "/v2/models/custom_name/infer",
                    body={"inputs": [fp32_input("INPUT0", ADD_SUB_IN0, [1, 4])]})
        rec.request("add_sub_config", "add_sub (no configs/alt.pbtxt) falls back to config.pbtxt",
                    "GET", "/v2/models/add_sub/config")
        rec.request("repository_index", "POST /v2/repository/index", "POST",
                    "/v2/repository/index")
    return rec.index


BAD_MODEL_NAMES = [
    "good", "name_mismatch", "not_the_folder_name", "input_no_datatype", "dims_zero",
    "dims_below_minus_one", "negative_max_batch_size", "unknown_backend",
    "missing_model_py", "initialize_raises", "output_no_dims", "syntax_error",
    "no_version_folder",
]


# Models whose loading never finishes in Triton 2.51 (the server hangs at
# startup): they are kept out of the main bad-repo runs and tried alone.
HANGING_BAD_MODELS = ("missing_model_py",)
BAD_REPO_VIEW = Path(tempfile.gettempdir()) / "naiad-golden-bad-models"


def bad_repo_view(include_hanging: bool) -> Path:
    """A model repository made of symlinks to tests/golden_bad_models folders:
    all models but the hanging ones, or only the hanging ones."""
    if BAD_REPO_VIEW.exists():
        shutil.rmtree(BAD_REPO_VIEW)
    BAD_REPO_VIEW.mkdir(parents=True)
    for folder in sorted(BAD_REPO.iterdir()):
        if folder.is_dir() and (folder.name in HANGING_BAD_MODELS) == include_hanging:
            (BAD_REPO_VIEW / folder.name).symlink_to(folder.resolve())
    return BAD_REPO_VIEW


def session_bad(peer: Path, port: int, out: Path, strict: bool) -> dict[str, Any]:
    name = "bad_repo" if strict else "bad_repo_nonstrict"
    rec = Recorder(out / name, port)
    flags = ["--exit-on-error=false", f"--strict-readiness={'true' if strict else 'false'}"]
    log = out / ("bad_repo_log.txt" if strict else "bad_repo_nonstrict_log.txt")
    with triton(peer, bad_repo_view(include_hanging=False), port, log, extra_flags=flags):
        capture_server_endpoints(rec, "server")
        if strict:
            for model in BAD_MODEL_NAMES:
                base = f"/v2/models/{model}"
                rec.request(f"models/{model}/metadata", f"GET {base}", "GET", base)
                rec.request(f"models/{model}/config", f"GET {base}/config", "GET",
                            f"{base}/config")
                rec.request(f"models/{model}/ready", f"GET {base}/ready", "GET", f"{base}/ready")
                rec.request(f"models/{model}/version_1_ready", f"GET {base}/versions/1/ready",
                            "GET", f"{base}/versions/1/ready")
                rec.request(f"models/{model}/stats", f"GET {base}/stats", "GET", f"{base}/stats")
                rec.request(f"models/{model}/infer", f"add_sub-style infer on {model}", "POST",
                            f"{base}/infer", body=add_sub_body())
            rec.request("stats_all", "GET /v2/models/stats", "GET", "/v2/models/stats")
    return rec.index


def session_exit_on_error(peer: Path, port: int, out: Path) -> dict[str, Any]:
    """Default flags on the bad repo: Triton exits because models failed to load."""
    log = out / "bad_repo_exit_on_error_log.txt"
    run = start_triton(peer, bad_repo_view(include_hanging=False), port, log)
    outcome = wait_started(run)
    rc = stop_triton(run)
    record = {"description": "tritonserver on the bad repo (without the hanging models) "
                             "with default --exit-on-error=true",
              "flags": [], "outcome": outcome, "exit_code": rc, "log_file": log.name}
    (out / "bad_repo_exit_on_error.json").write_text(json.dumps(record, indent=2) + "\n")
    return {"bad_repo_exit_on_error.json": {"description": record["description"], "status": rc}}


def session_max_input_size_flag(peer: Path, port: int, out: Path) -> dict[str, Any]:
    """Check whether --http-max-input-size exists in this version."""
    log = out / "http_max_input_size_flag_log.txt"
    run = start_triton(peer, GOOD_REPO, port, log, extra_flags=["--http-max-input-size=1024"])
    outcome = wait_started(run)
    rc = stop_triton(run)
    record = {"description": "tritonserver started with --http-max-input-size=1024",
              "outcome": outcome, "exit_code": rc, "log_file": log.name}
    (out / "http_max_input_size_flag.json").write_text(json.dumps(record, indent=2) + "\n")
    return {"http_max_input_size_flag.json": {"description": record["description"],
                                              "status": rc}}


HANG_WAIT_S = 60.0


def session_hanging_models(peer: Path, port: int, out: Path) -> dict[str, Any]:
    """Each hanging bad model alone: record that HTTP never comes up."""
    index: dict[str, Any] = {}
    for model in HANGING_BAD_MODELS:
        view = bad_repo_view(include_hanging=True)
        for other in view.iterdir():
            if other.name != model:
                other.unlink()
        log = out / f"bad_model_{model}_log.txt"
        run = start_triton(peer, view, port, log, extra_flags=["--exit-on-error=false"])
        outcome = wait_started(run, timeout_s=HANG_WAIT_S)
        live = do_request(port, "GET", "/v2/health/live", timeout_s=5)
        rc = stop_triton(run)
        record = {
            "description": f"tritonserver with only '{model}' and --exit-on-error=false: "
                           f"state after waiting {HANG_WAIT_S:.0f} s for HTTP",
            "outcome": outcome, "health_live_while_waiting": live,
            "exit_code_after_sigterm": rc, "log_file": log.name,
        }
        name = f"bad_model_{model}.json"
        (out / name).write_text(json.dumps(record, indent=2) + "\n")
        index[name] = {"description": record["description"], "status": outcome}
    return index


def write_summary(out: Path) -> None:
    """summary.md: one line per captured HTTP case (status, content type, body)."""
    lines = [
        "# Triton 2.51 golden cases (generated by tools/capture_triton_golden.py)",
        "",
        "Bodies longer than 400 characters are cut here; the JSON files hold them whole.",
        "",
    ]
    for session_dir in sorted(p for p in out.iterdir() if p.is_dir()):
        lines += [f"## {session_dir.name}", "",
                  "| case | request | status | content-type | body |",
                  "| --- | --- | --- | --- | --- |"]
        for path in sorted(session_dir.rglob("*.json")):
            record = json.loads(path.read_text())
            req = record.get("request", {})
            if "body_binary_part_base64" in record:
                binary = base64.b64decode(record["body_binary_part_base64"])
                body = (record.get("body_json_part_text", "(non-JSON header)")
                        + f" + {len(binary)} binary bytes")
            elif "body_text" in record:
                body = record["body_text"]
            else:
                body = "(base64) " + str(record.get("body"))
            body = "".join(c if c >= " " else f"\\x{ord(c):02x}" for c in body)
            if len(body) > 400:
                body = body[:400] + "…"
            cells = [
                str(path.relative_to(session_dir).with_suffix("")),
                f"{req.get('method', '')} {req.get('path', '')}",
                str(record.get("status")),
                record.get("headers", {}).get("content-type", ""),
                "`" + body.replace("|", "\\|").replace("`", "'") + "`"
                if body else "",
            ]
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
    (out / "summary.md").write_text("\n".join(lines))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--peer", type=Path,
                        default=Path(os.environ.get("NAIAD_TRITON_PEER", DEFAULT_PEER)),
                        help="peer script that runs tritonserver (default: %(default)s)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--port-base", type=int, default=18000,
                        help="HTTP port; GRPC and metrics use the next two")
    opts = parser.parse_args(argv)
    out: Path = opts.out
    out.mkdir(parents=True, exist_ok=True)
    # Per-case files are regenerated from scratch (README.md etc. are kept).
    for session_dir in ("good", "alt_config", "bad_repo", "bad_repo_nonstrict"):
        shutil.rmtree(out / session_dir, ignore_errors=True)
    index: dict[str, Any] = {}
    sessions = [
        ("good", lambda: session_good(opts.peer, opts.port_base, out)),
        ("alt_config", lambda: session_alt_config(opts.peer, opts.port_base, out)),
        ("bad_repo", lambda: session_bad(opts.peer, opts.port_base, out, strict=True)),
        ("bad_repo_nonstrict", lambda: session_bad(opts.peer, opts.port_base, out, strict=False)),
        ("hanging_models", lambda: session_hanging_models(opts.peer, opts.port_base, out)),
        ("exit_on_error", lambda: session_exit_on_error(opts.peer, opts.port_base, out)),
        ("max_input_size_flag", lambda: session_max_input_size_flag(opts.peer, opts.port_base, out)),
    ]
    for name, run_session in sessions:
        print(f"[capture] session {name} ...", file=sys.stderr, flush=True)
        index[name] = run_session()
    (out / "index.json").write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")
    write_summary(out)
    print(f"[capture] wrote {sum(len(v) for v in index.values())} cases to {out}",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
