"""Triton's text for a double, the reference: RapidJSON 1.1.0's ``dtoa`` (Grisu2 + ``Prettify``) step by step.

Triton writes every JSON number through RapidJSON's ``Writer``, whose doubles come from Grisu2 (Loitsch 2010) as
RapidJSON implements it: 64-bit ``DiyFp`` arithmetic rounded half up, a cached power of ten picked by a
floating-point estimate, digits generated from the upper boundary and then nudged toward the value
(``GrisuRound``), and RapidJSON's own layout (``Prettify``: ``1e308``, ``0.000001``, ``10000000000000000.0``).
Grisu2 is not always shortest, and RapidJSON 1.1.0 (the one Triton 2.51 builds with) skips the nudge once nine or
more fraction digits were generated, so ``0.30000000000000004`` comes out ``0.30000000000000007``: no other
formatter writes the same digits, hence this port.

This module is the exact, readable version: Python ints, masked to 64 bits wherever RapidJSON's ``uint64_t``
would wrap, and characters handled as RapidJSON handles them. ``dtoa_numpy`` is the vectorized one; tests hold the
two to each other and this one to real Triton's answers.
"""

from __future__ import annotations

import math
import struct

_M64 = (1 << 64) - 1
_HIDDEN = 1 << 52  # the implicit leading bit of a normal double's significand
_FRACTION = _HIDDEN - 1
_EXPONENT_BIAS = 0x3FF + 52  # a double is significand * 2^(biased exponent - 1075)
_DENORMAL_EXPONENT = -_EXPONENT_BIAS + 1

# RapidJSON 1.1.0's DigitGen nudges its last digit only while fewer than this many fraction digits were generated
# (its power-of-ten table for the nudge had ten entries; later releases extended it to twenty, Triton's did not).
ROUND_FRACTION_DIGITS = 9


def _cached_powers() -> tuple[tuple[int, int], ...]:
    """10^-348, 10^-340, ..., 10^340 as (64-bit significand with its top bit set, binary exponent), each the
    nearest such value (RapidJSON's ``kCachedPowers_F``/``kCachedPowers_E``, computed here with exact integers)."""
    powers = []
    for i in range(87):
        p = -348 + 8 * i
        num, den = (10**p, 1) if p >= 0 else (1, 10**-p)
        e = num.bit_length() - den.bit_length() - 64
        while True:  # the e with 2^63 <= num / den / 2^e < 2^64
            n, d = (num, den << e) if e >= 0 else (num << -e, den)
            f, remainder = divmod(n, d)
            if f >> 64:
                e += 1
            elif not f >> 63:
                e -= 1
            else:
                break
        if 2 * remainder >= d:  # to nearest (no power of ten here lies exactly halfway)
            f += 1
        powers.append((f, e))
    return tuple(powers)


CACHED_POWERS = _cached_powers()


def cached_power(e: int) -> tuple[int, int, int]:
    """RapidJSON's ``GetCachedPower``: for a boundary's binary exponent ``e``, the cached power c (significand,
    exponent) and the K with c ~ 10^-K. The index comes from a double estimate of ceil((-61 - e) * log10(2)),
    computed in doubles exactly as RapidJSON does (Python's floats are the same IEEE doubles)."""
    dk = (-61 - e) * 0.30102999566398114 + 347
    k = int(dk)
    if dk - k > 0.0:
        k += 1
    index = (k >> 3) + 1
    f, exponent = CACHED_POWERS[index]
    return f, exponent, 348 - (index << 3)


def _multiply(a: int, b: int) -> int:
    """The high 64 bits of a 128-bit product, rounded half up (``DiyFp::operator*``)."""
    return (a * b + (1 << 63)) >> 64


def _count_decimal_digits32(n: int) -> int:
    # RapidJSON stops counting at 9 ("will not reach 10 digits in DigitGen").
    for digits, limit in enumerate((10, 100, 1000, 10000, 100000, 1000000, 10000000, 100000000), 1):
        if n < limit:
            return digits
    return 9


def _grisu_round(buffer: list[int], delta: int, rest: int, ten_kappa: int, wp_w: int) -> None:
    """Move the last digit down while that brings the number closer to the value and keeps it in the interval."""
    while (rest < wp_w and delta - rest >= ten_kappa
           and ((rest + ten_kappa) & _M64 < wp_w or wp_w - rest > ((rest + ten_kappa) & _M64) - wp_w)):
        buffer[-1] -= 1
        rest = (rest + ten_kappa) & _M64


def _digit_gen(w: int, mp: int, exponent: int, delta: int, k: int) -> tuple[list[int], int]:
    """RapidJSON's ``DigitGen``: the digits (as small ints, the way its char buffer holds them) and the decimal
    exponent of the last one."""
    shift = -exponent
    one = 1 << shift
    wp_w = (mp - w) & _M64
    p1 = (mp >> shift) & 0xFFFFFFFF
    p2 = mp & (one - 1)
    kappa = _count_decimal_digits32(p1)
    buffer: list[int] = []
    while kappa > 0:
        d, p1 = divmod(p1, 10 ** (kappa - 1))
        if d or buffer:
            buffer.append(d)
        kappa -= 1
        rest = (p1 << shift) + p2
        if rest <= delta:
            _grisu_round(buffer, delta, rest, (10**kappa << shift) & _M64, wp_w)
            return buffer, k + kappa
    while True:
        p2 = (p2 * 10) & _M64
        delta = (delta * 10) & _M64
        d = p2 >> shift
        if d or buffer:
            buffer.append(d)
        p2 &= one - 1
        kappa -= 1
        if p2 < delta:
            index = -kappa
            scale = 10**index if index < ROUND_FRACTION_DIGITS else 0
            _grisu_round(buffer, delta, p2, one, (wp_w * scale) & _M64)
            return buffer, k + kappa


def grisu2(bits: int) -> tuple[list[int], int]:
    """The digits and decimal exponent RapidJSON's ``Grisu2`` gives a positive finite double (its IEEE bits)."""
    biased = bits >> 52
    if biased:
        f, e = (bits & _FRACTION) + _HIDDEN, biased - _EXPONENT_BIAS
    else:
        f, e = bits & _FRACTION, _DENORMAL_EXPONENT
    # NormalizedBoundaries: the upper boundary normalized so bit 63 is set, the lower one on its exponent.
    plus_f, plus_e = (f << 1) + 1, e - 1
    while not plus_f & (_HIDDEN << 1):
        plus_f <<= 1
        plus_e -= 1
    plus_f <<= 10
    plus_e -= 10
    if f == _HIDDEN:  # a power of two: the lower neighbour is half as far
        minus_f, minus_e = (f << 2) - 1, e - 2
    else:
        minus_f, minus_e = (f << 1) - 1, e - 1
    minus_f <<= minus_e - plus_e
    c_f, c_e, k = cached_power(plus_e)
    normalize = 64 - f.bit_length()
    w = _multiply(f << normalize, c_f)
    wp = (_multiply(plus_f, c_f) - 1) & _M64
    wm = (_multiply(minus_f, c_f) + 1) & _M64
    return _digit_gen(w, wp, plus_e + c_e + 64, (wp - wm) & _M64, k)


def _exponent(k: int) -> str:
    return str(k)  # WriteExponent: a '-' and the digits, no '+', no leading zeros


def prettify(digits: str, k: int) -> str:
    """RapidJSON's ``Prettify`` with ``maxDecimalPlaces`` 324 (the Writer's default, which never truncates a
    double: the smallest, 5e-324, has 323 decimal places before its digit)."""
    length = len(digits)
    kk = length + k  # 10^(kk-1) <= value < 10^kk
    if 0 <= k and kk <= 21:
        return digits + "0" * k + ".0"  # 1234e7 -> 12340000000.0
    if 0 < kk <= 21:
        return digits[:kk] + "." + digits[kk:]  # 1234e-2 -> 12.34
    if -6 < kk <= 0:
        return "0." + "0" * -kk + digits  # 1234e-6 -> 0.001234
    if length == 1:
        return digits + "e" + _exponent(kk - 1)  # 1e30
    return digits[0] + "." + digits[1:] + "e" + _exponent(kk - 1)  # 1234e30 -> 1.234e33


def triton_text(value: float) -> str:
    """The JSON text Triton writes for ``value`` (NaN and infinities as RapidJSON's ``kWriteNanAndInfFlag``)."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Infinity" if value > 0 else "-Infinity"
    bits = struct.unpack("<Q", struct.pack("<d", value))[0]
    sign = "-" if bits >> 63 else ""
    bits &= _M64 >> 1
    if not bits:
        return sign + "0.0"  # -0.0 keeps its sign (RapidJSON issue #289)
    buffer, k = grisu2(bits)
    return sign + prettify("".join(chr(48 + d) for d in buffer), k)
