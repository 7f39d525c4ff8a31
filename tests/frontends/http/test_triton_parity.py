"""Replays every request recorded against real Triton 2.51 (tests/golden/triton-2.51, made by
tools/capture_triton_golden.py) on naiad serving the same repository, and compares the answers.

Status codes must match everywhere. Bodies must match too, except where a difference is listed
below with its reason.
"""

from __future__ import annotations

import base64
import gzip
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.server import ROOT, RunningServer

GOLDEN = ROOT / "tests" / "golden" / "triton-2.51" / "good"
MODELS = ROOT / "tests" / "golden_models"

# Body differences we keep on purpose; the status code still has to match.
BODY_DIFFERENCES = {
    "server/server_metadata.json": "naiad names itself and lists the extensions it implements",
    # rapidjson's wording of a syntax error; naiad reports orjson's, with the same status code.
    "errors/invalid_json.json": "JSON parser wording",
    "errors/invalid_json_trailing_garbage.json": "JSON parser wording",
    "errors/header_length_into_json.json": "JSON parser wording",
    "errors/header_length_short_by_one.json": "JSON parser wording",
    "errors/non_utf8_body.json": "Triton answers with an empty body; naiad says what is wrong",
    "errors/gzip_header_plain_body.json": "Triton reads an undecodable body as empty; naiad says it can't decompress",
    # Triton prints FP32 values through double with rapidjson's digits (0.30000001192092898); naiad prints the
    # shortest float32 repr (0.3). Both parse to the same float32.
    "infer/add_sub_json_decimals.json": "float printing",
}


def _cases() -> Iterator[Path]:
    for path in sorted(GOLDEN.rglob("*.json")):
        case = json.loads(path.read_text())
        if isinstance(case, dict) and "request" in case and "body_omitted" not in case["request"]:
            yield path


@pytest.fixture(scope="module")
def server() -> Iterator[RunningServer]:
    running = RunningServer([MODELS])
    yield running
    running.stop()


def _varying(path: str) -> bool:
    # Statistics carry times and counts that depend on what ran before.
    return path.startswith("stats/")


@pytest.mark.parametrize("path", list(_cases()), ids=lambda p: str(p.relative_to(GOLDEN)))
def test_same_answer_as_triton(server: RunningServer, path: Path) -> None:
    case = json.loads(path.read_text())
    request = case["request"]
    body: bytes | None = None
    if request.get("body_text") is not None:
        body = request["body_text"].encode()
    elif request.get("body_base64") is not None:
        body = base64.b64decode(request["body_base64"])
    status, headers, payload = server.request(request["method"], request["path"], body, request.get("headers"))
    name = str(path.relative_to(GOLDEN))
    assert status == case["status"], f"{name}: {payload[:300]!r}"
    if _varying(name) or name in BODY_DIFFERENCES:
        return
    if headers.get("content-encoding") == "gzip":
        payload = gzip.decompress(payload)
    expected = case.get("body")
    header_length = case["headers"].get("inference-header-content-length")
    if header_length is not None:
        # Binary outputs: the JSON header and the raw tensor bytes after it, byte for byte.
        assert headers.get("inference-header-content-length") == header_length
        assert payload == base64.b64decode(expected), name
        return
    if isinstance(expected, (dict, list)):
        assert json.loads(payload) == expected, name
    elif expected in (None, ""):
        assert payload in (b"", b"null"), name
