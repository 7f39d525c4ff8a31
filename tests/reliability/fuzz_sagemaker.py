"""Seeded fuzzing of the SageMaker hosting port: ``/invocations`` with the HTTP fuzzer's malformed bodies (in the
``binary+json;json-header-size=N`` content type where they were binary), odd content types and sizes, odd paths and
methods, and the multi-model ``/models`` API with odd load bodies, URLs, keys and target-model headers (bytes no
text decoding takes included). Judged by http_oracle, plus SageMaker's own bare statuses (a body-less 400,
404, 409 or 507 is Triton's SageMaker answer). The same seed always gives the same cases."""

from __future__ import annotations

import copy
import http.client
import json
import random
import urllib.parse
from pathlib import Path
from typing import Any, Callable

from tests.reliability import fuzz_http
from tests.reliability.batches import in_batches
from tests.reliability.fuzz_http import ODD_VALUES
from tests.reliability.http_oracle import HttpCase, HttpFuzzer, Outcome
from tests.reliability.repo import write_echo_pid

BINARY_JSON = "application/vnd.sagemaker-triton.binary+json;json-header-size="
TARGET_HEADER = "X-Amzn-SageMaker-Target-Model"
DEFAULT_MODEL = "echo"  # the single-model endpoint's SAGEMAKER_TRITON_DEFAULT_MODEL_NAME
MME_KEY = "resident"  # a key the multi-model server has loaded (see ``mme_setup``)
_ODD_TARGETS: list[str | bytes] = ["", "echo", "nope", MME_KEY, "x" * 500, b"\xff\xfe", b"caf\xe9", "a b", "%00"]
_ODD_KEYS = [MME_KEY, MME_KEY, "nope", "", "..", "a%2Fb", "x" * 300, "%00", "%C3%A9"]


def _as_sagemaker(case: HttpCase, path: str) -> HttpCase:
    """An HTTP fuzz case re-aimed at ``path``: the binary extension's header becomes SageMaker's content type."""
    headers: dict[str, Any] = {k: v for k, v in case.headers.items() if k != "Inference-Header-Content-Length"}
    length = case.headers.get("Inference-Header-Content-Length")
    if length is not None:
        headers["Content-Type"] = BINARY_JSON + length
    return HttpCase("sm-" + case.kind, case.method, path, headers, case.body)


def _infer_case(rng: random.Random, model: str, path: str) -> HttpCase:
    mutations = [f for f, _ in fuzz_http.MUTATIONS if f not in (fuzz_http.mutate_raw_http, fuzz_http.mutate_url,
                                                                 fuzz_http.mutate_control)]
    case = rng.choice(mutations)(rng, model)
    if case.raw is not None:
        return case
    return _as_sagemaker(case, path)


def invocations(rng: random.Random) -> HttpCase:
    choice = rng.randrange(4)
    if choice < 2:
        return _infer_case(rng, DEFAULT_MODEL, "/invocations")
    body = json.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [2], "data": [1, 2]}]}).encode()
    if choice == 2:  # content types and sizes that lie
        content_type = rng.choice([BINARY_JSON + rng.choice(["-1", "0", "abc", "", str(len(body) + 1), "99999999999",
                                                             " 5", "+3", "1e3", str(len(body) - 1)]),
                                   "x" + BINARY_JSON + "4", BINARY_JSON.upper() + "4", "application/json",
                                   "text/plain", "\u00e9".encode().decode("latin-1")])
        return HttpCase("sm-content-type", "POST", "/invocations", {"Content-Type": content_type}, body)
    return HttpCase("sm-route", rng.choice(["GET", "PUT", "DELETE", "POST", "HEAD", "OPTIONS"]),
                    rng.choice(["/ping", "/invocations", "/", "/ping/", "/invocations/x", "/models", "/endpoints/x",
                                "/endpoints/x/invocations", "/v2/health/live", "//ping"]), {}, body)


def multi_model(rng: random.Random, models_root: Path) -> HttpCase:
    choice = rng.randrange(5)
    headers: dict[str, Any] = {}
    if rng.random() < 0.3:
        headers[TARGET_HEADER] = copy.deepcopy(rng.choice(_ODD_TARGETS))
    key = rng.choice(_ODD_KEYS)
    if choice == 0:  # loads
        good = str(model_url(models_root))
        url: Any = rng.choice([good, good, good + "/echo", good + "/nope", str(models_root / "h1"), "/proc/self",
                               "/dev", "relative/path", "", "s3://bucket/x", good + "/../../..", good + "\0",
                               good + "/../model", str(models_root / "h 2" / "model")])
        doc: Any = {"model_name": key, "url": url}
        if rng.random() < 0.3:
            doc[rng.choice(["model_name", "url"])] = copy.deepcopy(rng.choice(ODD_VALUES))
            if isinstance(doc["model_name"], str) and doc["url"] == good:
                # A key no request path can spell (a NUL, non-ASCII) can't be unloaded again, in Triton too: such
                # keys get the spare copy of the model, so the health check's model stays loadable.
                doc["url"] = str(spare_url(models_root))
        if rng.random() < 0.1:
            doc = copy.deepcopy(rng.choice(ODD_VALUES))
        body = json.dumps(doc).encode() if rng.random() < 0.9 else b"{not json"
        return HttpCase("sm-load", "POST", "/models", headers, body)
    if choice == 1:
        return HttpCase("sm-unload", "DELETE", f"/models/{key}", headers)
    if choice == 2:
        return HttpCase("sm-get", "GET", rng.choice([f"/models/{key}", "/models", "/models/"]), headers)
    case = _infer_case(rng, "echo", f"/models/{key}/invoke")
    if case.raw is None:
        case.headers.update(headers)
    return case


def generate(seed: int, count: int, models_root: Path | None = None) -> list[HttpCase]:
    """Single-model cases, or with ``models_root`` (the multi-model server's), multi-model ones."""
    rng = random.Random(seed)
    if models_root is None:
        return [invocations(rng) for _ in range(count)]
    return [multi_model(rng, models_root) for _ in range(count)]


def judge(outcome: Outcome) -> Outcome:
    """http_oracle's verdict, except that SageMaker answers some refusals with a bare status (no body)."""
    if outcome.problem and outcome.problem.startswith("status ") and outcome.status in (400, 404, 405, 409, 507):
        outcome.problem = None
    return outcome


def healthy(host: str, port: int, invoke_path: str, timeout: float = 10.0) -> str | None:
    try:
        conn = http.client.HTTPConnection(host, port, timeout=timeout)
        conn.request("GET", "/ping")
        response = conn.getresponse()
        response.read()
        if response.status != 200:
            return f"/ping answered {response.status}"
        body = json.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [3], "data": [1, 2, 3]}]})
        conn.request("POST", invoke_path, body, {"Content-Type": "application/json"})
        response = conn.getresponse()
        reply = response.read()
        if response.status != 200 or json.loads(reply)["outputs"][0]["data"] != [1, 2, 3]:
            return f"{invoke_path} answered {response.status}: {reply[:200]!r}"
        conn.close()
    except (OSError, http.client.HTTPException, ValueError, KeyError) as exc:
        return f"health check failed: {exc!r}"
    return None


def run(host: str, port: int, cases: list[HttpCase], invoke_path: str, batch: int = 50, timeout: float = 10.0,
        alive: Callable[[], bool] = lambda: True, between: Callable[[], None] = lambda: None
        ) -> tuple[list[Outcome], list[str]]:
    """Like http_oracle.run; ``between`` runs before each health check (the multi-model run reloads its model)."""
    def check() -> str | None:
        between()
        return healthy(host, port, invoke_path, timeout)

    outcomes, health = in_batches([HttpFuzzer(host, port, timeout)], cases, batch, alive, check)
    return [judge(outcome) for outcome in outcomes], health


def model_url(models_root: Path) -> Path:
    """Where ``write_mme_model`` puts the echo model, in SageMaker's ``<root>/<hash>/model`` layout."""
    return models_root / "h1" / "model"


def spare_url(models_root: Path) -> Path:
    return models_root / "h2" / "model"


def write_mme_model(models_root: Path) -> None:
    write_echo_pid(model_url(models_root), "echo")
    write_echo_pid(spare_url(models_root), "echo")


def mme_reset(host: str, port: int, models_root: Path) -> None:
    """Only ``MME_KEY`` loaded, freshly, from the echo model under ``models_root``: cases may have unloaded it, loaded
    its url under another key (SageMaker then refuses a second key for it with 409), or loaded it under another
    target-model name (an invoke without the header then names a model that isn't there, as in Triton)."""
    conn = http.client.HTTPConnection(host, port, timeout=60)
    try:
        conn.request("GET", "/models")
        response = conn.getresponse()
        listed = json.loads(response.read())["models"]
        for model in listed:
            if model:
                key = model["modelName"]
                # SageMaker's routes take the path as sent: quote only what a request line can't carry.
                path = key if key.isascii() and key.isprintable() and " " not in key else urllib.parse.quote(key)
                conn.request("DELETE", "/models/" + path)
                conn.getresponse().read()
        conn.request("POST", "/models", json.dumps({"model_name": MME_KEY, "url": str(model_url(models_root))}))
        response = conn.getresponse()
        response.read()
        assert response.status == 200, response.status
    finally:
        conn.close()
