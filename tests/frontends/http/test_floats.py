"""Triton's float text: the reference port, the per-value fast path and the vectorized writer against real Triton's
answers (tests/golden/triton-2.51-floats.txt, cut by tools/capture_triton_floats.py), against each other on
random doubles, and through a running naiad with tritonclient."""

from __future__ import annotations

import struct
from collections.abc import Iterator
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

from naiad.frontends.http import dtoa, dtoa_numpy, floats
from tests.models import write_model
from tests.server import ROOT, RunningServer

FIXTURE = ROOT / "tests" / "golden" / "triton-2.51-floats.txt"


def _double(bits: str) -> float:
    return struct.unpack(">d", bytes.fromhex(bits))[0]


def _oracle() -> list[tuple[float, str]]:
    pairs = []
    for line in FIXTURE.read_text().splitlines():
        if line and not line.startswith("#"):
            bits, text = line.split()
            pairs.append((_double(bits), text))
    return pairs


ORACLE = _oracle()
VALUES = np.array([value for value, _ in ORACLE])
TEXTS = [text for _, text in ORACLE]


def _tokens(json: bytes) -> list[str]:
    assert json[:1] == b"[" and json[-1:] == b"]"
    return json[1:-1].decode().split(",") if json != b"[]" else []


def test_the_fixture_holds_every_kind_of_answer() -> None:
    # A fixture that lost its odd cases would let a formatter that is merely shortest-digits pass.
    for text in ("NaN", "Infinity", "-Infinity", "0.0", "-0.0", "1e308", "0.30000000000000007", "0.000001",
                 "10000000000000000.0", "123456789012345680000.0", "1e21", "5e-324", "2.5e-7"):
        assert text in TEXTS, text
    assert len(ORACLE) >= 300


def test_the_reference_writes_what_triton_writes() -> None:
    wrong = [(value, text, dtoa.triton_text(value)) for value, text in ORACLE if dtoa.triton_text(value) != text]
    assert not wrong


def test_the_per_value_fast_path_writes_what_triton_writes() -> None:
    wrong = [(value, text, floats.text(value)) for value, text in ORACLE if floats.text(value) != text]
    assert not wrong


def test_the_vectorized_writer_writes_what_triton_writes() -> None:
    assert _tokens(dtoa_numpy.triton_texts(VALUES)) == TEXTS
    # And in pieces, so that each piece takes its own branches (all normal, no specials, one element).
    for start in range(0, len(VALUES), 37):
        assert _tokens(dtoa_numpy.triton_texts(VALUES[start : start + 37])) == TEXTS[start : start + 37]
    assert dtoa_numpy.triton_texts(VALUES[:1]) == f"[{TEXTS[0]}]".encode()


def test_a_large_array_is_written_pass_by_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dtoa_numpy, "CHUNK", 7)  # the passes' seams: 56 of them here
    assert _tokens(dtoa_numpy.triton_texts(VALUES)) == TEXTS


@pytest.mark.parametrize("size", [1, 2, 5, floats.VECTOR_MIN - 1, floats.VECTOR_MIN, 200])
def test_lists_and_arrays_of_any_size_are_written_as_triton_writes_them(size: int) -> None:
    for start in range(0, len(VALUES), size):
        chunk = VALUES[start : start + size]
        assert _tokens(floats.list_json(chunk.tolist())) == TEXTS[start : start + size]
        assert _tokens(floats.array_json(chunk)) == TEXTS[start : start + size]


def test_an_empty_tensor_is_an_empty_array() -> None:
    assert floats.list_json([]) == floats.array_json(np.zeros((0, 3))) == dtoa_numpy.triton_texts(np.zeros(0)) == b"[]"


def test_whole_numbers_below_2_to_the_53_are_n_point_0() -> None:
    values = [0.0, -0.0, 1.0, -7.0, 1e15, 2.0**53 - 1, -(2.0**53 - 1), 123456789.0]
    assert floats.list_json(values) == ("[" + ",".join(map(dtoa.triton_text, values)) + "]").encode()
    assert floats.list_json(values) == b"[0.0,-0.0,1.0,-7.0,1000000000000000.0,9007199254740991.0," \
                                       b"-9007199254740991.0,123456789.0]"
    # From 2^53 on, Triton's digits and layout are no longer repr's: 2^63 is 9223372036854776000.0 for both,
    # 1e16 is "10000000000000000.0" where repr writes 1e+16.
    assert floats.list_json([1.0, 1e16]) == b"[1.0,10000000000000000.0]"


def test_nan_is_written_without_its_sign() -> None:
    negative_nan = struct.unpack("<d", struct.pack("<Q", 0xFFF8000000000001))[0]
    for write in (floats.list_json, lambda v: dtoa_numpy.triton_texts(np.array(v))):
        assert write([negative_nan, float("inf"), -float("inf"), float("nan")]) == b"[NaN,Infinity,-Infinity,NaN]"


def test_fp32_goes_out_through_double() -> None:
    array = np.array([0.1, 0.2, 1e-7, 3.4028234663852886e38], dtype=np.float32)
    # (real Triton's answer: tests/golden/triton-2.51/good/infer/float_formatting_fp32.json)
    expected = b"[0.10000000149011612,0.20000000298023225,1.0000000116860974e-7,3.4028234663852887e38]"
    assert floats.array_json(array) == dtoa_numpy.triton_texts(array) == expected


def test_each_cached_power_is_the_nearest_64_bit_one() -> None:
    for i, (f, e) in enumerate(dtoa.CACHED_POWERS):
        exact = Fraction(10) ** (-348 + 8 * i)
        assert 2**63 <= f < 2**64
        assert abs(Fraction(f) * Fraction(2) ** e - exact) <= Fraction(2) ** e / 2


def _random_doubles(count: int, seed: int) -> np.ndarray:
    """Every family of double in proportion to what can go wrong with it: bit patterns over every exponent
    (subnormals, NaN, infinities included), float32 values, whole numbers, decimals, powers of two."""
    rng = np.random.default_rng(seed)
    bits = rng.integers(0, 1 << 64, count, dtype=np.uint64)
    exponents = rng.integers(0, 0x800, count, dtype=np.uint64)
    shaped = (bits & np.uint64((1 << 52) - 1 | 1 << 63)) | (exponents << np.uint64(52))
    with np.errstate(invalid="ignore", over="ignore"):
        return np.concatenate([
            shaped.view(np.float64),
            (bits >> np.uint64(12)).view(np.float64),  # subnormals and the smallest normals
            bits.astype(np.uint32).view(np.float32).astype(np.float64),
            np.floor(10.0 ** rng.uniform(0, 23, count)) * rng.choice([-1.0, 1.0], count),
            np.round(rng.standard_normal(count) * 10.0 ** rng.integers(0, 12, count)) / 10.0 ** rng.integers(0, 9, count),
            np.ldexp(1.0, rng.integers(-1074, 1024, count)),
        ])


def test_the_vectorized_writer_agrees_with_the_reference_on_random_doubles() -> None:
    # The big check (millions) is tools/check_float_text.py; this is a sample of it.
    values = _random_doubles(4000, seed=30)
    expected = [dtoa.triton_text(v) for v in values.tolist()]
    assert _tokens(dtoa_numpy.triton_texts(values)) == expected
    assert [floats.text(v) for v in values.tolist()] == expected


def test_the_vectorized_grisu2_gives_the_reference_digits() -> None:
    magnitude = _random_doubles(500, seed=31).view(np.uint64) & np.uint64((1 << 63) - 1)
    magnitude = magnitude[(magnitude != 0) & (magnitude < np.uint64(0x7FF0000000000000))]
    digits, exponent = dtoa_numpy.grisu2(magnitude)
    for bits, d, e in zip(magnitude.tolist(), digits.tolist(), exponent.tolist()):
        buffer, k = dtoa.grisu2(bits)
        assert (d, e) == (int("".join(map(str, buffer))), k)


# --- through a running naiad, with tritonclient -------------------------------------------------------------------

FLOATS_CONFIG = """
    name: "floats"
    backend: "python"
    max_batch_size: 0
    input [ { name: "X", data_type: TYPE_FP64, dims: [ -1 ] } ]
    output [ { name: "D", data_type: TYPE_FP64, dims: [ -1 ] }, { name: "F", data_type: TYPE_FP32, dims: [ -1 ] } ]
"""
FLOATS_PY = """
    import numpy as np
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def execute(self, requests):
            out = []
            for r in requests:
                x = pb_utils.get_input_tensor_by_name(r, "X").as_numpy()
                out.append(pb_utils.InferenceResponse([pb_utils.Tensor("D", x), pb_utils.Tensor("F", x.astype(np.float32))]))
            return out
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    repo: Path = tmp_path_factory.mktemp("floats")
    write_model(repo, "floats", FLOATS_CONFIG, FLOATS_PY)
    running = RunningServer([repo])
    yield running
    running.stop()


def _data_text(body: bytes, name: str) -> bytes:
    start = body.index(b'"data":[', body.index(b'"name":"%s"' % name.encode())) + len(b'"data":')
    return body[start : body.index(b"]", start) + 1]


@pytest.mark.parametrize("count", [4, len(ORACLE)])  # the per-value path and the vectorized one
def test_naiad_answers_with_triton_s_bytes(server: RunningServer, count: int) -> None:
    import tritonclient.http as httpclient

    values, texts = VALUES[:count], TEXTS[:count]
    with np.errstate(over="ignore"):
        singles = values.astype(np.float32)
    # F's text is the fixture's where the double is a float32 already (NaN too): Triton widens FP32 to double.
    exact = np.flatnonzero((singles.astype(np.float64) == values) | np.isnan(values))
    assert count < 10 or exact.size > 100

    x = httpclient.InferInput("X", [count], "FP64")
    x.set_data_from_numpy(values, binary_data=True)
    outputs = [httpclient.InferRequestedOutput(name, binary_data=False) for name in ("D", "F")]
    body, header_length = httpclient.InferenceServerClient.generate_request_body([x], outputs=outputs)
    headers = {"Inference-Header-Content-Length": str(header_length)} if header_length else {}
    status, _, answer = server.request("POST", "/v2/models/floats/infer", body, headers)
    assert status == 200, answer
    assert _data_text(answer, "D") == ("[" + ",".join(texts) + "]").encode()
    f_texts = _data_text(answer, "F")[1:-1].decode().split(",")
    assert [f_texts[i] for i in exact] == [texts[i] for i in exact]

    # tritonclient reads the same answer back into the same values (NaN as NaN).
    client = httpclient.InferenceServerClient(server.url)
    try:
        result = client.infer("floats", [x], outputs=outputs)
    finally:
        client.close()
    np.testing.assert_array_equal(result.as_numpy("D"), values)
    np.testing.assert_array_equal(result.as_numpy("F"), singles)
