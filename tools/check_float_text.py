#!/usr/bin/env python3
"""The big agreement check for Triton's float text (tests/frontends/http/test_floats.py runs a sample of it).

* The vectorized writer (``dtoa_numpy``) and the per-value fast path (``floats.text``) against the reference port
  (``dtoa``) on ``--count`` random doubles (default 2,000,000): bit patterns over every exponent (subnormals, NaN and
  infinities among them), subnormals alone, float32 values, whole numbers up to 1e23, short decimals, powers of two.
* With ``--oracle FILE`` (written by ``tools/capture_triton_floats.py --full``), all three against real Triton.

    python3 tools/check_float_text.py [--count N] [--seed S] [--oracle FILE]

Exits 1 on any difference, printing the first few.
"""

from __future__ import annotations

import argparse
import struct
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from naiad.frontends.http import dtoa, dtoa_numpy, floats  # noqa: E402


def random_doubles(count: int, rng: np.random.Generator) -> np.ndarray:
    part = count // 6
    bits = rng.integers(0, 1 << 64, part, dtype=np.uint64)
    exponents = rng.integers(0, 0x800, part, dtype=np.uint64)
    with np.errstate(invalid="ignore", over="ignore"):
        values = np.concatenate([
            ((bits & np.uint64((1 << 52) - 1 | 1 << 63)) | (exponents << np.uint64(52))).view(np.float64),
            (rng.integers(0, 1 << 64, part, dtype=np.uint64) >> np.uint64(12)).view(np.float64),
            rng.integers(0, 1 << 32, part, dtype=np.uint64).astype(np.uint32).view(np.float32).astype(np.float64),
            np.floor(10.0 ** rng.uniform(0, 23, part)) * rng.choice([-1.0, 1.0], part),
            np.round(rng.standard_normal(part) * 10.0 ** rng.integers(0, 12, part)) / 10.0 ** rng.integers(0, 9, part),
            np.ldexp(rng.uniform(1, 2, count - 5 * part), rng.integers(-1074, 1024, count - 5 * part)),
        ])
    return values


def compare(values: list[float], expected: list[str], label: str, reference: bool) -> int:
    """How many doubles some writer (the reference too when ``reference``) writes other than ``expected``."""
    wrong = 0
    chunk = 100_000
    for start in range(0, len(values), chunk):
        part = values[start : start + chunk]
        vector = dtoa_numpy.triton_texts(np.array(part, dtype=np.float64))[1:-1].decode().split(",")
        for i, value in enumerate(part):
            want = expected[start + i]
            got = {"vectorized": vector[i], "per-value": floats.text(value)}
            if reference:
                got["reference"] = dtoa.triton_text(value)
            differ = {writer: text for writer, text in got.items() if text != want}
            if differ:
                wrong += 1
                if wrong <= 10:
                    print(f"{label}: {value!r} ({struct.pack('>d', value).hex()}): expected {want}, got {differ}")
    return wrong


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--count", type=int, default=2_000_000)
    parser.add_argument("--seed", type=int, default=2051)
    parser.add_argument("--oracle", type=Path)
    args = parser.parse_args()
    wrong = 0
    if args.oracle:
        pairs = [line.split() for line in args.oracle.read_text().splitlines() if line and not line.startswith("#")]
        values = [struct.unpack(">d", bytes.fromhex(bits))[0] for bits, _ in pairs]
        bad = compare(values, [text for _, text in pairs], "triton", reference=True)
        print(f"real Triton: {len(pairs) - bad} of {len(pairs)} doubles written as Triton wrote them by all three")
        wrong += bad
    started = time.monotonic()
    values = random_doubles(args.count, np.random.default_rng(args.seed)).tolist()
    bad = compare(values, [dtoa.triton_text(v) for v in values], "random", reference=False)
    print(f"random: {len(values) - bad} of {len(values)} doubles written by the vectorized and per-value writers "
          f"as the reference writes them ({time.monotonic() - started:.0f} s)")
    wrong += bad
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
