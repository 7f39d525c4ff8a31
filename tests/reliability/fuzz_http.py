"""Seeded fuzzing of the KServe v2 HTTP front end: the cases (judged and sent by ``http_oracle``).

A case starts as a valid request for one of the models in ``repo.write_fuzz_models`` and gets one mutation:
a JSON value of the wrong kind, a shape or datatype that lies, binary-extension sizes that lie (the
``Inference-Header-Content-Length`` header and ``binary_data_size``), BYTES with broken length prefixes, tensors in
shared memory out of bounds, a corrupted or compressed body, an odd URL, method or header, or malformed HTTP sent
over a raw socket. The same seed always gives the same cases.
"""

from __future__ import annotations

import base64
import copy
import gzip
import json
import random
import struct
import zlib
from typing import Any, Callable

from tests.reliability.bombs import bomb
from tests.reliability.http_oracle import SHM_REGION, SHM_SIZE, HttpCase

MODELS = ("echo", "bytes", "batched", "ensemble", "sequence", "decoupled", "onnx_add_sub")
DATATYPES = ("BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64", "FP16", "FP32",
             "FP64", "BYTES")
_WIRE = {"FP32": "<f4", "INT32": "<i4"}
# JSON values of every kind, including the edges of the integer types Triton reads.
ODD_VALUES: list[Any] = [None, True, False, 0, 1, -1, 2**31, 2**32, 2**63 - 1, 2**63, 2**64, -(2**63) - 1, 10**30,
                         0.5, -0.0, 1e308, -1e308, "", "x", "0", "-1", "FP32", "\u00e9\u4e2d", "\x00", [], [1], [[1]],
                         {}, {"a": 1}, [None], ["x"], [1.5], [-1], [2**64]]


def _odd(rng: random.Random) -> Any:
    """One of ``ODD_VALUES``, copied: a case must never change the pool (nor another case)."""
    return copy.deepcopy(rng.choice(ODD_VALUES))


# --- valid requests -----------------------------------------------------------------------------------------------

def _valid(rng: random.Random, model: str) -> tuple[dict[str, Any], list[tuple[str, bytes]]]:
    """A valid JSON document for ``model`` and, for each input, its binary form (datatype's wire bytes)."""
    if model in ("echo", "decoupled"):
        n = rng.randint(0, 5)
        values = [round(rng.uniform(-10, 10), 2) for _ in range(n)]
        inputs = [("INPUT0", "FP32", [n], values)]
    elif model == "bytes":
        n = rng.randint(0, 4)
        values = [rng.choice(["", "a", "hello", "caf\u00e9", "x" * 40]) for _ in range(n)]
        inputs = [("INPUT0", "BYTES", [n], values)]
    elif model in ("batched", "ensemble"):
        b = rng.randint(1, 4)
        inputs = [("INPUT0", "INT32", [b, 2], [[rng.randint(-99, 99) for _ in range(2)] for _ in range(b)])]
    elif model == "sequence":
        inputs = [("INPUT0", "INT32", [1, 1], [[rng.randint(0, 9)]])]
    else:
        b = rng.randint(1, 3)
        inputs = [(name, "FP32", [b, 4], [[float(rng.randint(0, 9)) for _ in range(4)] for _ in range(b)])
                  for name in ("INPUT0", "INPUT1")]
    doc: dict[str, Any] = {"inputs": [{"name": n, "datatype": t, "shape": s, "data": d} for n, t, s, d in inputs]}
    if model == "sequence":
        doc["parameters"] = {"sequence_id": rng.randint(1, 50), "sequence_start": rng.random() < 0.5,
                             "sequence_end": rng.random() < 0.5}
    if rng.random() < 0.3:
        doc["id"] = f"req-{rng.randint(0, 999)}"
    binaries = [(n, _wire_bytes(t, d)) for n, t, _, d in inputs]
    return doc, binaries


def _flat(data: Any) -> list:
    if isinstance(data, list):
        return [x for item in data for x in _flat(item)]
    return [data]


def _wire_bytes(datatype: str, data: Any) -> bytes:
    flat = _flat(data)
    if datatype == "BYTES":
        return b"".join(struct.pack("<I", len(s.encode())) + s.encode() for s in flat)
    import numpy as np  # only here: the generator itself needs nothing beyond the standard library

    return np.array(flat, dtype=_WIRE[datatype]).tobytes()


def _binary(doc: dict[str, Any], binaries: list[tuple[str, bytes]], rng: random.Random
            ) -> tuple[dict[str, Any], bytes]:
    """The document with every input's data moved to the binary tail; maybe binary outputs too."""
    tail = b""
    for item, (_, chunk) in zip(doc["inputs"], binaries):
        item.pop("data", None)
        if not isinstance(item.get("parameters"), dict):
            item["parameters"] = {}
        item["parameters"]["binary_data_size"] = len(chunk)
        tail += chunk
    if rng.random() < 0.5 and isinstance(doc.get("parameters", {}), dict):
        doc.setdefault("parameters", {})["binary_data_output"] = True
    return doc, tail


def _request(path: str, doc: Any, tail: bytes = b"", header_length: str | None = None,
             headers: dict[str, str] | None = None, kind: str = "") -> HttpCase:
    header = doc if isinstance(doc, bytes) else json.dumps(doc).encode()
    hdrs = dict(headers or {})
    if tail or header_length is not None:
        hdrs["Inference-Header-Content-Length"] = header_length if header_length is not None else str(len(header))
    return HttpCase(kind, "POST", path, hdrs, header + tail)


def _infer_path(model: str) -> str:
    return f"/v2/models/{model}/infer"


# --- mutations ------------------------------------------------------------------------------------------------------

def _paths(value: Any, prefix: tuple = ()) -> list[tuple]:
    """Every location inside a JSON document, as key/index tuples."""
    found = [prefix] if prefix else []
    if isinstance(value, dict):
        for k, v in value.items():
            found += _paths(v, prefix + (k,))
    elif isinstance(value, list) and len(value) <= 8:
        for i, v in enumerate(value):
            found += _paths(v, prefix + (i,))
    return found


def _set(doc: Any, path: tuple, value: Any, delete: bool = False) -> None:
    target = doc
    for key in path[:-1]:
        target = target[key]
    if delete:
        del target[path[-1]]
    else:
        target[path[-1]] = value


def mutate_json_value(rng: random.Random, model: str) -> HttpCase:
    doc, _ = _valid(rng, model)
    locations = _paths(doc)
    where = rng.choice(locations)
    if rng.random() < 0.2:
        _set(doc, where, None, delete=True)
    else:
        _set(doc, where, _odd(rng))
    return _request(_infer_path(model), doc, kind="json-value")


def mutate_many_values(rng: random.Random, model: str) -> HttpCase:
    """Several JSON values changed at once, maybe in binary form: faults that meet each other."""
    doc, binaries = _valid(rng, model)
    if rng.random() < 0.4:
        doc, tail = _binary(doc, binaries, rng)
    else:
        tail = b""
    for _ in range(rng.randint(2, 4)):
        locations = _paths(doc)
        if not locations:
            break
        _set(doc, rng.choice(locations), _odd(rng))
    return _request(_infer_path(model), doc, tail, kind="many-values")


def mutate_shape(rng: random.Random, model: str) -> HttpCase:
    doc, binaries = _valid(rng, model)
    item = rng.choice(doc["inputs"])
    item["shape"] = rng.choice([[], [0], [-1], [2**63], [2**31, 2**31], [1, 1, 1, 1, 1, 1, 1, 1], [5, 0],
                                [0, 2**63 - 1], [2**62, 0, 4],  # a count of 0 that no array can have
                                [len(_flat(item["data"])) + 1], [1.5], ["2"], [None], [2**64], 3, None,
                                [0] + item["shape"][1:], [9] + item["shape"][1:], item["shape"][::-1],
                                [rng.randint(0, 9) for _ in range(rng.randint(1, 4))]])
    if rng.random() < 0.5:
        doc, tail = _binary(doc, binaries, rng)
        return _request(_infer_path(model), doc, tail, kind="shape-binary")
    return _request(_infer_path(model), doc, kind="shape")


def mutate_datatype(rng: random.Random, model: str) -> HttpCase:
    doc, binaries = _valid(rng, model)
    item = rng.choice(doc["inputs"])
    item["datatype"] = rng.choice(DATATYPES + ("fp32", "FLOAT", "", "TYPE_FP32", "BF16", "STRING", "FP8"))
    if rng.random() < 0.5:
        doc, tail = _binary(doc, binaries, rng)
        return _request(_infer_path(model), doc, tail, kind="datatype-binary")
    return _request(_infer_path(model), doc, kind="datatype")


def mutate_data(rng: random.Random, model: str) -> HttpCase:
    doc, _ = _valid(rng, model)
    item = rng.choice(doc["inputs"])
    choice = rng.randrange(6)
    flat = _flat(item["data"])
    if choice == 0 and flat:  # one element of the wrong kind or range
        flat[rng.randrange(len(flat))] = _odd(rng)
        item["data"] = flat
    elif choice == 1:  # ragged nesting
        item["data"] = [flat[:1], flat[1:]] if flat else [[], [1]]
    elif choice == 2:  # deep nesting, beyond and within parsers' limits
        depth = rng.choice([50, 600, 2000])
        return _request(_infer_path(model), json.dumps(doc).replace('"data": ', '"data": ' + "[" * depth, 1)
                        .encode().replace(b"]", b"]" + b"]" * depth, 1), kind="data-deep")
    elif choice == 3:  # many elements
        item["data"] = [1] * rng.choice([1000, 100_000])
    elif choice == 4:  # huge and non-finite numbers as text
        body = json.dumps(doc).encode()
        token = rng.choice([b"1e400", b"-1e400", b"NaN", b"Infinity", b"99999999999999999999999", b"0x10", b"01"])
        return _request(_infer_path(model), body.replace(b"[", b"[" + token + b",", 1), kind="data-token")
    else:  # data beside binary_data_size
        item.setdefault("parameters", {})["binary_data_size"] = rng.choice([0, 4, -1])
    return _request(_infer_path(model), doc, kind="data")


# Offsets and sizes in and out of the registered region's bounds, and of the wrong kinds.
_SHM_NUMBERS = [0, 1, 4, 7, 8, SHM_SIZE - 4, SHM_SIZE, SHM_SIZE + 4, 2**63, 2**64 - 1, -1, -8, None, "8", 1.5]


def mutate_shared_memory(rng: random.Random, model: str) -> HttpCase:
    """Inputs and outputs in a registered region (or none), at offsets and sizes in and out of its bounds."""
    doc, binaries = _valid(rng, model)
    targets = []
    if rng.random() < 0.6:
        targets.append(rng.choice(doc["inputs"]))
        if rng.random() < 0.7:
            targets[-1].pop("data", None)
    if rng.random() < 0.6:
        doc["outputs"] = [{"name": rng.choice(["OUTPUT0", "OUTPUT1", "PID"])} for _ in range(rng.randint(1, 2))]
        targets += doc["outputs"]
    for target in targets:
        params = target.setdefault("parameters", {})
        params["shared_memory_region"] = rng.choice([SHM_REGION, SHM_REGION, "nope", ""])
        for key in ("shared_memory_offset", "shared_memory_byte_size"):
            if rng.random() < 0.8:
                params[key] = rng.choice(_SHM_NUMBERS)
        if rng.random() < 0.15:
            params[rng.choice(["classification", "binary_data", "binary_data_size"])] = rng.choice([True, 1, 0])
    return _request(_infer_path(model), doc, kind="shared-memory")


_REQUEST_PARAMETERS = ("sequence_id", "sequence_start", "sequence_end", "priority", "timeout", "binary_data_output",
                       "triton_enable_empty_final_response", "triton_x", "custom", "shared_memory_region")
_OUTPUT_PARAMETERS = ("binary_data", "classification", "shared_memory_region", "shared_memory_offset",
                      "shared_memory_byte_size", "other")


def mutate_parameters(rng: random.Random, model: str) -> HttpCase:
    doc, binaries = _valid(rng, model)
    where = rng.randrange(4)
    if where == 0:
        doc["parameters"] = {rng.choice(_REQUEST_PARAMETERS): _odd(rng) for _ in range(rng.randint(1, 3))}
    elif where == 1:
        doc["parameters"] = _odd(rng)
    elif where == 2:
        item = rng.choice(doc["inputs"])
        item["parameters"] = {rng.choice(_OUTPUT_PARAMETERS): _odd(rng) for _ in range(rng.randint(1, 2))}
    else:
        outputs = [{"name": rng.choice(["OUTPUT0", "OUTPUT1", "PID", "NOPE", ""])} for _ in range(rng.randint(0, 3))]
        for out in outputs:
            if rng.random() < 0.7:
                out["parameters"] = {rng.choice(_OUTPUT_PARAMETERS): _odd(rng)
                                     for _ in range(rng.randint(1, 2))}
        doc["outputs"] = outputs if rng.random() < 0.9 else _odd(rng)
    if rng.random() < 0.3:
        doc, tail = _binary(doc, binaries, rng)
        return _request(_infer_path(model), doc, tail, kind="parameters-binary")
    return _request(_infer_path(model), doc, kind="parameters")


def mutate_binary_sizes(rng: random.Random, model: str) -> HttpCase:
    """The binary extension's two sizes lie: the JSON header's length, or an input's ``binary_data_size``."""
    doc, binaries = _valid(rng, model)
    doc, tail = _binary(doc, binaries, rng)
    header = json.dumps(doc).encode()
    choice = rng.randrange(4)
    if choice == 0:
        length = rng.choice([str(len(header) + d) for d in (-20, -1, 1, 2, 7)]
                            + ["0", "-1", "-5", str(len(header) + len(tail) + 1), "99999999999999999999", "abc", "",
                               " 12", "1e3", "0x20", "+5"])
        return _request(_infer_path(model), header, tail, length, kind="header-length")
    if choice == 1:
        item = rng.choice(doc["inputs"])
        size = item["parameters"]["binary_data_size"]
        item["parameters"]["binary_data_size"] = rng.choice([size + 1, max(size - 1, 0), 0, -1, 2**63, 2**64, 1.5,
                                                             "4", None, size * 2 + 3])
        return _request(_infer_path(model), doc, tail, kind="binary-data-size")
    if choice == 2:  # the tail is longer or shorter than the sizes say
        tail = rng.choice([tail + b"\0" * rng.randint(1, 9), tail[: max(len(tail) - rng.randint(1, 5), 0)]])
        return _request(_infer_path(model), doc, tail, kind="binary-tail")
    # binary sizes, but no header length: the whole body is read as JSON
    return HttpCase("binary-no-header-length", "POST", _infer_path(model), {}, header + tail)


def mutate_bytes_prefix(rng: random.Random, _: str) -> HttpCase:
    """BYTES in the binary extension (and raw input) with length prefixes that lie."""
    n = rng.randint(1, 3)
    items = [rng.choice([b"", b"a", b"hello"]) for _ in range(n)]
    good = b"".join(struct.pack("<I", len(s)) + s for s in items)
    choice = rng.randrange(5)
    if choice == 0:
        chunk = struct.pack("<I", rng.choice([2**32 - 1, 2**31, len(good) + 1, 7])) + good
    elif choice == 1:
        chunk = good + struct.pack("<I", 5)[: rng.randint(1, 3)]  # a cut length indicator
    elif choice == 2:
        chunk = good[:-1] if items[-1] else good + b"\x01\x00"
    elif choice == 3:
        chunk = good + good  # twice the elements the shape says
    else:
        chunk = bytes(rng.randrange(256) for _ in range(rng.randint(0, 24)))
    doc = {"inputs": [{"name": "INPUT0", "datatype": "BYTES", "shape": [n], "parameters": {"binary_data_size":
                                                                                              len(chunk)}}]}
    if rng.random() < 0.25:  # the raw-input form: no JSON at all
        return HttpCase("bytes-raw-input", "POST", _infer_path("bytes"), {"Inference-Header-Content-Length": "0"},
                        chunk)
    return _request(_infer_path("bytes"), doc, chunk, kind="bytes-prefix")


def mutate_body_bytes(rng: random.Random, model: str) -> HttpCase:
    doc, binaries = _valid(rng, model)
    body = json.dumps(doc).encode()
    choice = rng.randrange(7)
    if choice == 0:
        body = body[: rng.randrange(len(body))]
    elif choice == 1:
        data = bytearray(body)
        for _ in range(rng.randint(1, 4)):
            data[rng.randrange(len(data))] = rng.randrange(256)
        body = bytes(data)
    elif choice == 2:
        at = rng.randrange(len(body))
        odd = rng.choice([b"\0", b"\xff\xfe", b"\xc3(", b"\xed\xa0\x80", b"\\u0000", b"\\ud800"])
        body = body[:at] + odd + body[at:]
    elif choice == 3:
        body = bytes(rng.randrange(256) for _ in range(rng.randint(0, 64)))
    elif choice == 4:
        body = body.replace(b'"inputs"', b'"inputs": [], "inputs"', 1)  # a duplicate key
    elif choice == 5:
        body = rng.choice([b"", b"null", b"[]", b"1", b'"x"', b"{}", b"{" * 5000, b"[" * 200_000, b" \n\t"])
    else:
        body = b"\xef\xbb\xbf" + body  # a byte order mark
    return HttpCase("body-bytes", "POST", _infer_path(model), {}, body)


def mutate_compression(rng: random.Random, model: str) -> HttpCase:
    doc, _ = _valid(rng, model)
    body = json.dumps(doc).encode()
    encoding = rng.choice(["gzip", "deflate", "br", "identity", "GZIP", "gzip, deflate", "x-gzip", ""])
    choice = rng.randrange(5)
    if choice == 0 and encoding in ("gzip", "GZIP"):
        body = gzip.compress(body)
    elif choice == 1 and encoding == "deflate":
        body = zlib.compress(body)
    elif choice == 2:
        body = gzip.compress(body)[: rng.randint(0, 20)]  # a cut stream
    elif choice == 3:
        body = gzip.compress(b"\0" * 1_000_000)  # a small body that inflates to a megabyte of NULs
    elif choice == 4:
        body = bomb(encoding if encoding == "deflate" else "gzip", 65)  # past --http-max-input-size once inflated
    headers = {"Content-Encoding": encoding}
    if rng.random() < 0.4:
        headers["Accept-Encoding"] = rng.choice(["gzip", "deflate", "br", "*", "gzip;q=0", "nonsense, ,;", ""])
    return HttpCase("compression", "POST", _infer_path(model), headers, body)


def mutate_headers(rng: random.Random, model: str) -> HttpCase:
    doc, _ = _valid(rng, model)
    body = json.dumps(doc).encode()
    headers = {rng.choice(["Content-Type", "Accept", "Inference-Header-Content-Length", "X-Odd", "Expect",
                           "Connection", "Transfer-Encoding"]):
               rng.choice(["", "application/octet-stream", "text/plain; charset=latin-1", "x" * 8000, "close",
                           "100-continue", "\u00e9".encode().decode("latin-1"), "chunked, gzip", "0", "-0"])
               for _ in range(rng.randint(1, 3))}
    if headers.get("Transfer-Encoding"):
        headers.pop("Transfer-Encoding")  # http.client would not frame it; raw cases cover chunked
    return HttpCase("headers", "POST", _infer_path(model), headers, body)


_ODD_SEGMENTS = ["", "..", ".", "%00", "%zz", "%2F", "%2e%2e", "a%20b", "\u00e9", "x" * 3000, "versions", "-1",
                 "99999999999999999999", "0", "01", "+1", " 1", "infer", "ready", "stats", "config", "load"]


def mutate_url(rng: random.Random, model: str) -> HttpCase:
    doc, _ = _valid(rng, model)
    body = json.dumps(doc).encode()
    choice = rng.randrange(5)
    if choice == 0:
        path = f"/v2/models/{rng.choice(_ODD_SEGMENTS)}/infer"
    elif choice == 1:
        path = f"/v2/models/{model}/versions/{rng.choice(_ODD_SEGMENTS)}/{rng.choice(['infer', 'ready', 'config', ''])}"
    elif choice == 2:
        path = "/" + "/".join(rng.choice(["v2", "models", model, "repository", "health", "live", "ready", "index",
                                          "systemsharedmemory", "cudasharedmemory", "region", "status", "trace",
                                          "setting", "logging", "generate", "generate_stream"] + _ODD_SEGMENTS)
                              for _ in range(rng.randint(0, 6)))
    elif choice == 3:
        path = _infer_path(model) + rng.choice(["?", "?a=1", "#x", "?" + "q" * 5000, "/", "//", "?%zz"])
    else:
        path = rng.choice(["*", "//v2//models", "/v2/models//infer", "/V2/MODELS/echo/INFER", "/v2/models/echo/infer;x",
                           "http://other/v2/health/live", "/v2/models/echo/generate",
                           "/v2/models/echo/generate_stream"])
    method = rng.choice(["GET", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "HEAD", "TRACE", "BREW"])
    body = body if method != "GET" or rng.random() < 0.3 else b""
    if not path.isascii() or not path.isprintable() or " " in path:  # http.client refuses these: send them raw
        return HttpCase("url-raw", raw=b"%s %s HTTP/1.1\r\nContent-Length: %d\r\n\r\n%s" % (
            method.encode(), path.encode(), len(body), body))
    return HttpCase("url", method, path, {}, body)


def mutate_control(rng: random.Random, model: str) -> HttpCase:
    """The other routes that read a body: repository index and control, shared memory, generate, trace, logging."""
    path = rng.choice(["/v2/repository/index", f"/v2/repository/models/{model}/load",
                       f"/v2/repository/models/{model}/unload", "/v2/systemsharedmemory/region/r/register",
                       "/v2/systemsharedmemory/register", "/v2/systemsharedmemory/region/r/unregister",
                       "/v2/cudasharedmemory/region/r/register", f"/v2/models/{model}/generate",
                       f"/v2/models/{model}/generate_stream", "/v2/trace/setting", f"/v2/models/{model}/trace/setting",
                       "/v2/logging"])
    body: Any = rng.choice([
        {"ready": _odd(rng)},
        {"parameters": _odd(rng)},
        {"parameters": {"config": _odd(rng), "unload_dependents": _odd(rng)}},
        {"parameters": {"file:1/model.py": base64.b64encode(b"x").decode()}},
        {"key": _odd(rng), "offset": _odd(rng), "byte_size": _odd(rng)},
        {"key": "/no-such-naiad-fuzz-region", "offset": 0, "byte_size": 16},
        {"text_input": _odd(rng), "INPUT0": _odd(rng)},
        {"trace_level": _odd(rng), "trace_rate": _odd(rng),
         "log_frequency": _odd(rng)},
        {"log_info": _odd(rng), "log_verbose_level": _odd(rng),
         "log_format": _odd(rng)},
        _odd(rng),
    ])
    raw = json.dumps(body).encode() if rng.random() < 0.85 else bytes(rng.randrange(256) for _ in range(20))
    return HttpCase("control", rng.choice(["POST", "POST", "POST", "GET"]), path, {}, raw)


def mutate_raw_http(rng: random.Random, model: str) -> HttpCase:
    """Malformed HTTP/1.1 on its own connection; the server must answer or close, and stay healthy."""
    body = json.dumps(_valid(rng, model)[0]).encode()
    target = _infer_path(model).encode()
    choice = rng.randrange(9)
    if choice == 0:
        raw = rng.choice([b"GARBAGE\r\n\r\n", b"POST\r\n\r\n", b"\r\nGET /v2/health/live HTTP/1.1\r\n\r\n",
                          b"GET / HTTP/9.9\r\n\r\n",
                          b"GET /v2 HTTP/1.1\r\nHost\r\n\r\n", b"\x16\x03\x01\x00\xa5\x01\x00\x00\xa1\x03\x03",
                          b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", b"GET /v2/health/live HTTP/1.0\r\n\r\n"])
    elif choice == 1:  # chunked framing, valid (it must be answered) or lying
        valid = rng.random() < 0.5
        chunk = rng.choice([b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body),
                            b"%x;ext=1\r\n%s\r\n0\r\nTrailer: x\r\n\r\n" % (len(body), body)] if valid else
                           [b"%x\r\n%s\r\n0\r\n\r\n" % (len(body) + 5, body), b"zz\r\n%s\r\n0\r\n\r\n" % body,
                            b"-1\r\n\r\n"])
        raw = b"POST %s HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n%s" % (target, chunk)
        if valid:
            return HttpCase("raw-chunked", raw=raw)
    elif choice == 2:  # both framings
        raw = (b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\nTransfer-Encoding: chunked\r\n\r\n%s"
               % (target, len(body), body))
    elif choice == 3:  # a Content-Length that lies short: the rest is read as the next request
        raw = b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (target, len(body) // 2, body)
    elif choice == 4:
        raw = b"POST %s HTTP/1.1\r\nContent-Length: %s\r\n\r\n%s" % (
            target, rng.choice([b"-1", b"abc", b"1, 2", b"99999999999999999999999", b" "]), body)
    elif choice == 5:  # header lines that break the grammar
        raw = (b"POST %s HTTP/1.1\r\n%s\r\nContent-Length: %d\r\n\r\n%s"
               % (target, rng.choice([b"NoColon", b"Bad Name: x", b": empty", b"X: \x00\x01", b" Folded: x",
                                      b"X: " + b"y" * 100_000]), len(body), body))
        raw = raw
    elif choice == 6:  # pipelined: a bad request between two good ones
        good = b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n"
        bad = b"POST %s HTTP/1.1\r\nContent-Length: 3\r\n\r\n{x}" % target
        raw = good + bad + good
    elif choice == 7:  # a URL with bytes URLs can't hold
        raw = b"GET /v2/models/\xff\x00%s/ready HTTP/1.1\r\n\r\n" % model.encode()
    elif rng.random() < 0.5:  # a body cut short, then the client leaves
        cut = b"POST %s HTTP/1.1\r\nContent-Length: %d\r\n\r\n%s" % (target, len(body), body[: len(body) // 3])
        return HttpCase("raw-http-cut", raw=cut, wait=False)
    else:  # a whole request, then the client leaves before the answer: the server drops it
        whole = b"POST %s HTTP/1.1\r\nContent-Length: %d\r\n\r\n%s" % (target, len(body), body)
        return HttpCase("raw-http-gone", raw=whole, wait=False)
    return HttpCase("raw-http", raw=raw)


MUTATIONS: list[tuple[Callable[[random.Random, str], HttpCase], int]] = [
    (mutate_json_value, 14), (mutate_many_values, 8), (mutate_shape, 10), (mutate_datatype, 8), (mutate_data, 10),
    (mutate_parameters, 12), (mutate_shared_memory, 6), (mutate_binary_sizes, 12), (mutate_bytes_prefix, 8),
    (mutate_body_bytes, 8), (mutate_compression, 4), (mutate_headers, 4), (mutate_url, 6), (mutate_control, 5),
    (mutate_raw_http, 4),
]


def generate(seed: int, count: int) -> list[HttpCase]:
    rng = random.Random(seed)
    functions = [f for f, _ in MUTATIONS]
    weights = [w for _, w in MUTATIONS]
    cases = []
    for _ in range(count):
        mutation = rng.choices(functions, weights)[0]
        cases.append(mutation(rng, rng.choice(MODELS)))
    return cases
