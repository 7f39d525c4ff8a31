"""Float tensors as Triton writes them in JSON: ``b"[1e308,0.30000000000000007,NaN]"``, whatever library serializes
the rest of the document.

Triton prints every double (and every FP32 element, widened to double) through RapidJSON's Grisu2 and layout,
which no JSON library reproduces (``dtoa`` says how it differs). Three ways to the same bytes, by size:

* values that are whole numbers below 1e16 (add_sub's answers, counts, labels): Triton writes ``N.0``, which is
  Python's own ``repr`` for them, so a C-level check and ``repr`` of the list do it (a table, for the small ones);
* up to ``VECTOR_MIN`` other values: ``texts``, Grisu2 per value with Python ints and a table per binary exponent
  (one to two microseconds each);
* more: ``dtoa_numpy``, the whole array at once.
"""

from __future__ import annotations

import struct

import numpy as np

from naiad.frontends.http import dtoa
from naiad.frontends.http.dtoa_numpy import triton_texts

# From this many elements the vectorized writer (~90 us to start) wins over texts() (benchmarks/float_text.py).
VECTOR_MIN = 96

# Small whole numbers (labels, counts, add_sub's answers) by table, zero aside: Triton writes "-0.0" for -0.0,
# which a dictionary would look up as 0.0.
_SMALL_WHOLE = {float(i): f"{i}.0" for i in range(-1024, 1025) if i}

_M64 = (1 << 64) - 1
_HALF = 1 << 63
_FRACTION = (1 << 52) - 1
_HIDDEN = 1 << 52
_POW10 = [10**i for i in range(20)]


def _normal_table() -> list[tuple[int, int, int, int]]:
    """Per biased exponent of a normal double: the cached power, DigitGen's shift s and 2^s - 1, and K."""
    table = [(0, 0, 0, 0)]
    for biased in range(1, 2047):
        c, c_e, k = dtoa.cached_power(biased - 1075 - 11)  # the upper boundary's exponent
        s = -(biased - 1075 - 11 + c_e + 64)
        table.append((c, s, (1 << s) - 1, k))
    return table


_NORMAL = _normal_table()


def text(value: float) -> str:
    """Triton's text for one double (``dtoa.triton_text``, faster)."""
    return texts([value])[0]


def texts(values: list[float]) -> list[str]:
    """Triton's text for each double: ``dtoa.triton_text`` with the common case (a normal double whose digits end
    in the fraction loop) written out flat: the products formed once, the loop's stop found from where delta * 10^j
    reaches 2^s and stepped down, the digits from one product, Prettify inline. The rest goes to ``dtoa``."""
    out = []
    normal, pow10, reference, rounding = _NORMAL, _POW10, dtoa.triton_text, dtoa.ROUND_FRACTION_DIGITS
    count = len(values)
    for value, bits in zip(values, struct.unpack(f"<{count}Q", struct.pack(f"<{count}d", *values))):
        biased = bits >> 52 & 0x7FF
        if biased == 0 or biased == 0x7FF:
            out.append(reference(value))  # zero, subnormal, infinite, NaN
            continue
        c, s, mask, k = normal[biased]
        fraction = bits & _FRACTION
        wc = ((fraction | _HIDDEN) << 11) * c
        up = c << 10
        wp = ((wc + up + _HALF) >> 64) - 1
        delta = wp - ((wc - (up if fraction else up >> 1) + _HALF) >> 64) - 1
        p2 = wp & mask
        if p2 <= delta:
            out.append(reference(value))  # DigitGen stops inside the integer part: few values, done the long way
            continue
        j = len(str(mask // delta))  # the first j with delta * 10^j >= 2^s (at least 1)
        while j > 1 and (p2 * pow10[j - 1]) & mask < delta * pow10[j - 1]:
            j -= 1
        scale = pow10[j]
        product = p2 * scale
        number = (wp >> s) * scale + (product >> s)
        if j < rounding:  # GrisuRound, for the few stops before the ninth fraction digit
            rest, one, d = product & mask, mask + 1, delta * scale
            wp_w = ((wp - ((wc + _HALF) >> 64)) * scale) & _M64
            while rest < wp_w and d - rest >= one and (rest + one < wp_w or wp_w - rest > rest + one - wp_w):
                number -= 1
                rest += one
        digits = str(number)
        exponent = k - j
        kk = len(digits) + exponent
        # Prettify (dtoa.prettify), its cases in the order they are common.
        if kk > 21 or kk <= -6:
            body = (digits[0] + "." + digits[1:] if len(digits) > 1 else digits) + "e" + str(kk - 1)
        elif kk > 0:
            body = digits + "0" * exponent + ".0" if exponent >= 0 else digits[:kk] + "." + digits[kk:]
        else:
            body = "0." + "0" * -kk + digits
        out.append("-" + body if bits >> 63 else body)
    return out


def list_json(values: list[float]) -> bytes:
    """Python floats (FP32 ones already widened) as Triton's JSON array."""
    if not values:
        return b"[]"
    if values[0] in _SMALL_WHOLE and 0.0 not in values:  # (-0.0 would find 0.0's text in the table)
        try:
            return ("[" + ",".join(map(_SMALL_WHOLE.__getitem__, values)) + "]").encode()
        except KeyError:
            pass
    if all(map(float.is_integer, values)):  # (False for NaN and the infinities)
        # Whole numbers: Triton writes "N.0", and so does repr below 1e16, where it switches to "1e+16"
        # (Grisu2's digits for a whole double below 1e16 are its own: no shorter number lies within half an ulp).
        listed = repr(values)
        if "e" not in listed:
            return listed.replace(" ", "").encode()
    if len(values) >= VECTOR_MIN:
        return triton_texts(np.array(values, dtype=np.float64))
    return ("[" + ",".join(texts(values)) + "]").encode()


def array_json(array: np.ndarray) -> bytes:
    """A float array's elements, flat, as Triton's JSON array (FP32 through double, as Triton prints it)."""
    if array.size < VECTOR_MIN:
        return list_json(array.ravel().tolist())
    return triton_texts(array)
