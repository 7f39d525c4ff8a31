"""Load, infer, unload: one cycle of the explicit-mode control API, for a Python and an ONNX model."""

from __future__ import annotations

import http.client
import json
from pathlib import Path

from tests.reliability.load import fp32_body
from tests.reliability.repo import write_echo_pid, write_onnx_add_sub

PYTHON_MODEL = "cycle_python"
ONNX_MODEL = "cycle_onnx"
_ONNX_BODY = json.dumps({"inputs": [{"name": n, "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}
                                    for n in ("INPUT0", "INPUT1")]}).encode()


def write_models(repo: Path) -> None:
    write_echo_pid(repo, PYTHON_MODEL)
    write_onnx_add_sub(repo, ONNX_MODEL)


def _post(conn: http.client.HTTPConnection, path: str, body: bytes = b"") -> tuple[int, bytes]:
    conn.request("POST", path, body)
    response = conn.getresponse()
    return response.status, response.read()


def cycle(port: int, timeout: float = 60.0, only: str | None = None) -> None:
    """Load both models (or ``only`` one), check each answers, unload them; raises AssertionError with the
    server's answer."""
    models = [only] if only else [PYTHON_MODEL, ONNX_MODEL]
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        for model in models:
            status, body = _post(conn, f"/v2/repository/models/{model}/load")
            assert status == 200, (model, "load", status, body)
        if PYTHON_MODEL in models:
            status, body = _post(conn, f"/v2/models/{PYTHON_MODEL}/infer", fp32_body([1.0, 2.0]))
            assert status == 200 and json.loads(body)["outputs"][0]["data"] == [1.0, 2.0], body
        if ONNX_MODEL in models:
            status, body = _post(conn, f"/v2/models/{ONNX_MODEL}/infer", _ONNX_BODY)
            assert status == 200 and json.loads(body)["outputs"][0]["data"] == [2.0, 4.0, 6.0, 8.0], body
        for model in models:
            status, body = _post(conn, f"/v2/repository/models/{model}/unload")
            assert status == 200, (model, "unload", status, body)
    finally:
        conn.close()
