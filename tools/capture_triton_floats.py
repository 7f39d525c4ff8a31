#!/usr/bin/env python3
"""Ask real Triton 2.51 how it writes doubles in JSON, and cut the fixture tests/frontends/http/test_floats.py reads.

Serves a one-model repository (FP64 ``X`` in; ``D`` = X as FP64 and ``F`` = X as FP32 out) on the real tritonserver
through the peer script (or uses one already running, ``--url``), sends about 55,000 doubles chosen to reach every
branch of RapidJSON's dtoa (random bit patterns over all exponents, subnormals, powers of two and ten and their
neighbours, FP32 values, integers around 2^53, the 1e21 and 1e-6 layout boundaries, NaN and the infinities) as
binary, and reads both outputs back as JSON. Then:

* ``--full PATH`` keeps every (value, Triton's text) pair, for tools/check_triton_floats.py;
* the fixture (default tests/golden/triton-2.51-floats.txt) keeps a few hundred of them: every hand-picked value and
  a sample of each family, mostly where Triton's text is not Python's ``repr``.

Each line of either file is ``<the double's 16 hex digits> <Triton's text>``; ``#`` lines are comments.

    python3 tools/capture_triton_floats.py [--peer PATH] [--port-base N] [--url HOST:PORT] [--full PATH] [--out PATH]
"""

from __future__ import annotations

import argparse
import http.client
import json
import math
import os
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = REPO_ROOT / "tests" / "golden" / "triton-2.51-floats.txt"
DEFAULT_PEER = Path(os.environ.get("NAIAD_TRITON_PEER", "/work/shared/peers/triton.sh"))

MODEL_PY = '''import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("D", x.astype(np.float64)),
                                                         pb_utils.Tensor("F", x.astype(np.float32))]))
        return responses
'''
CONFIG = '''name: "floats"
backend: "python"
max_batch_size: 0
input [ { name: "X" data_type: TYPE_FP64 dims: [ -1 ] } ]
output [ { name: "D" data_type: TYPE_FP64 dims: [ -1 ] }, { name: "F" data_type: TYPE_FP32 dims: [ -1 ] } ]
'''

# Values worth naming: the layout's edges, Grisu2's known non-shortest answers, the extremes.
HAND_PICKED = [
    1e308, 1e-7, 1e-5, 1e-6, 0.1, 0.2, 0.3, 1e21, 1e22, 1.5e300, 123456789012345680000.0, 1e16, 1e17, 5e-324,
    2.2250738585072014e-308, 2.225073858507201e-308, 1.7976931348623157e308, -0.0, 0.0, 1.0, -1.0, 100.0, 1e15,
    3.14159, 0.30000000000000004, 1e-300, 6.02e23, 12345678.9, 9.999999999999999e20, 1e20, 123e18, 0.000123, 1.5e-6,
    2.5e-7, 0.000001, 0.0000009999999999999999, 1.0000000000000002, 0.9999999999999999, 2.0**53, 2.0**53 + 2,
    2.0**53 - 1, 2.0**63, 2.0**64, 1 / 3, 2 / 3, math.pi, math.e, -45772582566733.914, 1.401298464324817e-45,
    3.4028234663852886e38, 1.1754943508222875e-38, 16777216.0, 16777217.0, 0.5, 0.25, 0.1 + 0.7, 1e-323, 9.5e-323,
    4.9406564584124654e-324, 2.2250738585072009e-308, 999999999999999999999.0, 99999999999999999999.0,
    float("nan"), float("-nan"), float("inf"), float("-inf"),
]


def values() -> list[tuple[str, float]]:
    rng = np.random.default_rng(2051)
    out: list[tuple[str, float]] = [("hand-picked", v) for v in HAND_PICKED]

    def add(family: str, array: np.ndarray) -> None:
        out.extend((family, float(v)) for v in np.asarray(array, dtype=np.float64).ravel())

    # Random bit patterns, the exponent drawn uniformly over every finite one.
    exponents = rng.integers(0, 0x7FF, 20000, dtype=np.uint64)
    fractions = rng.integers(0, 1 << 52, 20000, dtype=np.uint64)
    signs = rng.integers(0, 2, 20000, dtype=np.uint64)
    add("bits", ((signs << np.uint64(63)) | (exponents << np.uint64(52)) | fractions).view(np.float64))
    add("subnormal", rng.integers(1, 1 << 52, 3000, dtype=np.uint64).view(np.float64))
    add("subnormal", np.arange(1, 41, dtype=np.uint64).view(np.float64))
    for family, base in (("pow2", [2.0**i for i in range(-1074, 1024)]),
                         ("pow10", [float(f"1e{i}") for i in range(-323, 309)])):
        array = np.array(base)
        add(family, array)
        add(family, np.nextafter(array, np.inf))
        add(family, np.nextafter(array, 0))
    # FP32 values sent as doubles (D then writes them exactly as F does).
    f32 = rng.integers(0, 0x7F800000, 10000, dtype=np.uint32).view(np.float32)
    add("float32", f32)
    add("float32", np.array([float(f"1e{i}") for i in range(-45, 39)], dtype=np.float32))
    # Integers: below 2^53 (written N.0 by the layout), around it, and far above.
    add("integer", np.floor(10.0 ** rng.uniform(0, 16, 3000)))
    add("integer", 2.0**53 + rng.integers(-1000, 1000, 500))
    add("integer", np.floor(10.0 ** rng.uniform(16, 25, 1000)))
    add("integer", np.outer(np.arange(1, 10), 10.0 ** np.arange(0, 23)))
    # Random 17-digit decimals.
    digits = rng.integers(10**16, 10**17, 5000)
    scale = rng.integers(-40, 40, 5000)
    add("decimal17", [float(f"{d}e{s}") for d, s in zip(digits, scale)])
    # The layout's boundaries: a few doubles either side of 1e21 (fixed or exponent) and 1e-6 / 1e-5 / 1e-7.
    for edge in (1e20, 1e21, 1e22, 1e-5, 1e-6, 1e-7, 9.999999999999999e20):
        x = np.full(11, edge)
        for i in range(1, 6):
            x[5 + i] = np.nextafter(x[4 + i], np.inf)
            x[5 - i] = np.nextafter(x[6 - i], 0)
        add("boundary", x)
    return out


def infer(host: str, port: int, array: np.ndarray) -> bytes:
    raw = array.tobytes()
    header = json.dumps({
        "inputs": [{"name": "X", "datatype": "FP64", "shape": [len(array)], "parameters": {"binary_data_size": len(raw)}}],
        "outputs": [{"name": "D", "parameters": {"binary_data": False}},
                    {"name": "F", "parameters": {"binary_data": False}}],
    }).encode()
    connection = http.client.HTTPConnection(host, port, timeout=120)
    connection.request("POST", "/v2/models/floats/infer", header + raw,
                       {"Inference-Header-Content-Length": str(len(header)),
                        "Content-Type": "application/octet-stream"})
    response = connection.getresponse()
    body = response.read()
    if response.status != 200:
        raise RuntimeError(f"Triton answered {response.status}: {body[:300]!r}")
    return body


def tokens(body: bytes, name: str) -> list[str]:
    """The data of output ``name`` as Triton's own text, one token per element (numbers hold no commas)."""
    start = body.index(b'"name":"%s"' % name.encode())
    data = body.index(b'"data":[', start) + len(b'"data":[')
    return body[data : body.index(b"]", data)].decode().split(",")


def hexbits(value: float) -> str:
    return "%016x" % struct.unpack("<Q", struct.pack("<d", value))[0]


def start(peer: Path, port_base: int, folder: Path) -> subprocess.Popen[bytes]:
    repo = folder / "repo"
    (repo / "floats" / "1").mkdir(parents=True)
    (repo / "floats" / "config.pbtxt").write_text(CONFIG)
    (repo / "floats" / "1" / "model.py").write_text(MODEL_PY)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    log = open(folder / "triton.log", "wb")
    process = subprocess.Popen([str(peer), "run", str(repo), str(port_base), str(port_base + 1), str(port_base + 2)],
                               stdout=log, stderr=subprocess.STDOUT, env=env, cwd=folder)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        try:
            connection = http.client.HTTPConnection("127.0.0.1", port_base, timeout=2)
            connection.request("GET", "/v2/models/floats/ready")
            if connection.getresponse().status == 200:
                return process
        except OSError:
            pass
        if process.poll() is not None:
            break
        time.sleep(0.5)
    process.kill()
    raise RuntimeError(f"Triton did not get ready; see {folder / 'triton.log'}")


def fixture(pairs: list[tuple[str, str, str]]) -> list[tuple[str, str]]:
    """A few hundred pairs: every hand-picked one, and per family a sample that leans to texts repr() misses."""
    rng = np.random.default_rng(7)
    chosen: dict[str, str] = {}
    by_family: dict[str, list[tuple[str, str]]] = {}
    for family, bits, text in pairs:
        if family == "hand-picked":
            chosen[bits] = text
        else:
            by_family.setdefault(family, []).append((bits, text))
    for family, items in sorted(by_family.items()):
        odd = [(b, t) for b, t in items if t != _naive(b)]
        plain = [(b, t) for b, t in items if t == _naive(b)]
        for group, count in ((odd, 30), (plain, 12)):
            for i in rng.permutation(len(group))[:count]:
                chosen.setdefault(*group[i])
    return list(chosen.items())


def _naive(bits: str) -> str:
    """Python's shortest repr in JSON's clothes: what Triton's text is compared against when picking."""
    value = struct.unpack("<d", bytes.fromhex(bits)[::-1])[0]
    return json.dumps(value)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--peer", type=Path, default=DEFAULT_PEER)
    parser.add_argument("--port-base", type=int, default=18300)
    parser.add_argument("--url", help="HOST:PORT of a Triton already serving the floats model")
    parser.add_argument("--full", type=Path, help="also write every pair here")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args()

    chosen = values()
    array = np.array([v for _, v in chosen], dtype=np.float64)
    process = None
    with tempfile.TemporaryDirectory() as folder:
        if args.url:
            host, port = args.url.rsplit(":", 1)
        else:
            process = start(args.peer, args.port_base, Path(folder))
            host, port = "127.0.0.1", str(args.port_base)
        try:
            body = infer(host, int(port), array)
        finally:
            if process is not None:
                process.terminate()
                process.wait(30)
    as_double, as_float = tokens(body, "D"), tokens(body, "F")
    assert len(as_double) == len(as_float) == len(array)
    pairs: dict[str, tuple[str, str, str]] = {}
    with np.errstate(over="ignore"):
        singles = array.astype(np.float32).astype(np.float64)
    # The doubles sent first (their family decides what the fixture samples), then the FP32 results.
    sent = [(family, hexbits(value), text) for (family, value), text in zip(chosen, as_double)]
    widened = [("float32 output", hexbits(float(single)), text) for single, text in zip(singles, as_float)]
    for name, bits, text in sent + widened:
        seen = pairs.setdefault(bits, (name, bits, text))
        if seen[2] != text:  # one double, one text, through either output
            raise RuntimeError(f"{bits}: Triton wrote {seen[2]} and {text}")
    every = list(pairs.values())
    head = "# <the double's IEEE bits in hex> <real Triton 2.51's JSON text for it>, by tools/capture_triton_floats.py\n"
    if args.full:
        args.full.write_text(head + "".join(f"{b} {t}\n" for _, b, t in every))
    picked = fixture(every)
    args.out.write_text(head + "".join(f"{b} {t}\n" for b, t in picked))
    print(f"{len(every)} distinct doubles from Triton; {len(picked)} in {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
