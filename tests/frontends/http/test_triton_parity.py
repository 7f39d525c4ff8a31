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

CAPTURES = ROOT / "tests" / "golden" / "triton-2.51"
GOLDEN = CAPTURES / "good"
MODELS = ROOT / "tests" / "golden_models"
BAD_MODELS = ROOT / "tests" / "golden_bad_models"

# Body differences we keep on purpose; the status code still has to match.
BODY_DIFFERENCES = {
    "server/server_metadata.json": "naiad gives its own version and leaves out cuda_shared_memory (no CUDA path)",
    # rapidjson's wording of a syntax error; naiad reports orjson's, with the same status code.
    "errors/invalid_json.json": "JSON parser wording",
    "errors/invalid_json_trailing_garbage.json": "JSON parser wording",
    "errors/header_length_into_json.json": "JSON parser wording",
    "errors/header_length_short_by_one.json": "JSON parser wording",
    "errors/non_utf8_body.json": "Triton answers with an empty body; naiad says what is wrong",
    "errors/gzip_header_plain_body.json": "Triton reads an undecodable body as empty; naiad says it can't decompress",
}


def _replayable(path: Path) -> bool:
    case = json.loads(path.read_text())
    return isinstance(case, dict) and "request" in case and "body_omitted" not in case["request"]


def _cases(folder: Path = GOLDEN) -> Iterator[list[Path]]:
    """Single cases, and sequences: a folder of numbered steps (``0_x.json``, ``1_y.json``) replayed in order."""
    sequences: dict[Path, list[Path]] = {}
    for path in sorted(folder.rglob("*.json")):
        if not _replayable(path):
            continue
        if path.name[:1].isdigit():
            sequences.setdefault(path.parent, []).append(path)
        else:
            yield [path]
    for steps in sequences.values():
        yield sorted(steps, key=lambda p: int(p.name.split("_", 1)[0]))


@pytest.fixture(scope="module")
def server() -> Iterator[RunningServer]:
    running = RunningServer([MODELS])
    yield running
    running.stop()


def _varying(path: str) -> bool:
    # Statistics of models that other cases also call depend on which of those ran first.
    return path.startswith("stats/")


def _counts(value: object) -> object:
    """Statistics without their durations and timestamps, which no two runs share."""
    if isinstance(value, dict):
        return {k: _counts(v) for k, v in value.items() if k not in ("ns", "last_inference")}
    if isinstance(value, list):
        return [_counts(v) for v in value]
    return value


def _rooted(value: object, root: str) -> object:
    """Tracebacks name model files under the checkout they ran in; name that checkout `<root>` on both sides.
    NaN becomes a marker so that NaN equals NaN."""
    if isinstance(value, float) and value != value:
        return "NaN"
    if isinstance(value, str):
        return value.replace(root, "<root>")
    if isinstance(value, dict):
        return {k: _rooted(v, root) for k, v in value.items()}
    if isinstance(value, list):
        return [_rooted(v, root) for v in value]
    return value


CAPTURED_ROOT = "/work/main"


def _helped(actual: object, expected: object) -> object:
    """naiad keeps Triton's error message, which clients match, and may add what to do after it in parentheses
    ("... has no available versions (version 1 failed to load: ...)"): Triton's part is what is compared."""
    if isinstance(actual, dict) and isinstance(expected, dict) and set(actual) == set(expected) == {"error"}:
        error, triton = actual["error"], expected["error"]
        if isinstance(error, str) and isinstance(triton, str) and error.startswith(triton + " (") \
                and error.endswith(")"):
            return {"error": triton}
    return actual


@pytest.mark.parametrize("steps", list(_cases()), ids=lambda s: str(s[0].relative_to(GOLDEN)) if len(s) == 1
                         else str(s[0].parent.relative_to(GOLDEN)) + "/*")
def test_same_answer_as_triton(server: RunningServer, steps: list[Path]) -> None:
    for path in steps:
        _replay(server, path)


# The broken repository. Triton hangs at start-up on a model without model.py, so its captures left that model
# out; naiad lists it (and the model without versions) in the index, and gives every broken model a state
# and reason there where Triton lists a model that failed to poll by name alone.
BAD_INDEX = ("server/repository_index.json", "server/repository_index_empty_object.json",
             "server/repository_index_ready_false.json", "stats_all.json")


@pytest.mark.parametrize("flags", [(), ("--strict-readiness=false",)], ids=["strict", "nonstrict"])
def test_broken_repository_same_answers(flags: tuple[str, ...]) -> None:
    folder = CAPTURES / ("bad_repo" if not flags else "bad_repo_nonstrict")
    server = RunningServer([BAD_MODELS], *flags, wait_ready=False)
    try:
        for steps in _cases(folder):
            for path in steps:
                name = str(path.relative_to(folder))
                # Stats depend on capture order; initialize_raises' reason carries the capture's temp path.
                status_only = (name in BAD_INDEX or "initialize_raises" in name or "missing_model_py" in name
                               or name.endswith("stats.json"))
                _replay(server, path, folder, status_only=status_only)
    finally:
        server.stop()


def _replay(server: RunningServer, path: Path, folder: Path = GOLDEN, status_only: bool = False) -> None:
    case = json.loads(path.read_text())
    request = case["request"]
    body: bytes | None = None
    if request.get("body_text") is not None:
        body = request["body_text"].encode()
    elif request.get("body_base64") is not None:
        body = base64.b64decode(request["body_base64"])
    status, headers, payload = server.request(request["method"], request["path"], body, request.get("headers"))
    name = str(path.relative_to(folder))
    assert status == case["status"], f"{name}: {payload[:300]!r}"
    if status_only or _varying(name) or name in BODY_DIFFERENCES:
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
    if isinstance(expected, dict) and "outputs" in expected and case.get("body_text") is not None:
        # Inference answers byte for byte: Triton's key order, and its float text (RapidJSON's, not orjson's).
        assert payload == case["body_text"].encode(), name
    if isinstance(expected, (dict, list)):
        actual = json.loads(payload)
        if isinstance(expected, dict) and "model_stats" in expected:
            assert _counts(actual) == _counts(expected), name
        else:
            actual, expected = _rooted(actual, str(ROOT)), _rooted(expected, CAPTURED_ROOT)
            assert _helped(actual, expected) == expected, name
    elif expected in (None, ""):
        assert payload in (b"", b"null"), name
