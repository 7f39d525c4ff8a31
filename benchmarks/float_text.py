#!/usr/bin/env python3
"""What Triton's float text costs in naiad's HTTP responses (naiad/frontends/http/floats.py).

Prints, in CPU microseconds (process time, best of several runs, so other load on the machine counts less):

* encode_response for an add_sub-sized FP32 output (4 whole numbers, and 4 fractions), a 384-element FP32
  embedding, and 1M FP64 values, beside orjson writing the same document with its own float text (what naiad did
  before: its bytes depend on orjson's version and are not Triton's);
* the per-value writer against the vectorized one by size, the crossover behind floats.VECTOR_MIN.

    PYTHONPATH=. python benchmarks/float_text.py
"""

from __future__ import annotations

import time
from typing import Callable

import numpy as np
import orjson

from naiad.core.request import InferResponse
from naiad.frontends.http import dtoa_numpy, floats
from naiad.frontends.http.codec import OutputOptions, encode_response


def cpu_us(work: Callable[[], object], budget: float = 0.3) -> float:
    """Best CPU time per call, over rounds of about ``budget`` seconds' worth of calls."""
    start = time.process_time()
    work()
    once = max(time.process_time() - start, 1e-6)
    calls = max(1, min(100_000, int(budget / 5 / once)))
    best = float("inf")
    for _ in range(5):
        start = time.process_time()
        for _ in range(calls):
            work()
        best = min(best, (time.process_time() - start) / calls)
    return best * 1e6


def orjson_document(array: np.ndarray) -> bytes:
    """The document as orjson alone writes it (naiad's way before: a list when small, the array when large)."""
    data = array.ravel().tolist() if array.size <= 256 else array.astype(np.float64).ravel()
    doc = {"model_name": "m", "model_version": "1",
           "outputs": [{"name": "OUT", "datatype": "FP32" if array.dtype == np.float32 else "FP64",
                        "shape": list(array.shape), "data": data}]}
    return orjson.dumps(doc, option=orjson.OPT_SERIALIZE_NUMPY)


def main() -> None:
    rng = np.random.default_rng(0)
    cases = {
        "4 FP32 whole (add_sub)": np.array([11.0, 22.0, 33.0, 44.0], dtype=np.float32),
        "4 FP32 fractions": rng.standard_normal(4).astype(np.float32),
        "384 FP32 (embedding)": rng.standard_normal(384).astype(np.float32),
        "1M FP64": rng.standard_normal(1_000_000) * 10.0 ** rng.integers(-30, 30, 1_000_000),
    }
    print(f"orjson {orjson.__version__}; CPU us per call")
    print(f"{'output':28} {'encode_response':>16} {'orjson alone':>14}")
    for name, array in cases.items():
        response = InferResponse("m", "1", "", {"OUT": array})
        options = OutputOptions()
        budget = 3.0 if array.size > 10_000 else 0.3
        ours = cpu_us(lambda: encode_response(response, options), budget)
        theirs = cpu_us(lambda: orjson_document(array), budget)
        print(f"{name:28} {ours:16.1f} {theirs:14.1f}")

    print("\nfloats: texts() per value vs dtoa_numpy, by size (FP32 fractions)")
    for size in (8, 16, 32, 48, 64, 96, 128, 192, 256):
        values = rng.standard_normal(size).astype(np.float32)
        as_list = values.tolist()
        per_value = cpu_us(lambda: ("[" + ",".join(floats.texts(as_list)) + "]").encode())
        vectorized = cpu_us(lambda: dtoa_numpy.triton_texts(values))
        print(f"{size:5} {per_value:10.1f} {vectorized:10.1f}")


if __name__ == "__main__":
    main()
