"""Triton's text for a whole float64 array at once: ``dtoa``'s algorithm as NumPy uint64 arithmetic, no loop per value.

The steps are RapidJSON's (see ``dtoa``), each done for every element together:

* the boundaries and the cached power come from tables indexed by the binary exponent (the power's choice is a
  double computation, so it is tabulated from ``dtoa.cached_power`` itself rather than redone);
* ``DiyFp`` products are 64x64->128-bit multiplies done in 32-bit halves, rounded half up like RapidJSON's;
* ``DigitGen`` keeps its digits as one integer per element. Its integer-part loop stops at the first (largest)
  power of ten whose remainder fits in delta; remainders only grow with the power, so only elements whose whole
  fraction fits can stop there, and those are few. Its fraction loop stops at the first digit count j where the
  truncation error, scaled, falls below delta; that error only shrinks as j grows, so j is found by binary
  search (five masked steps) and the digits come from one 128-bit product ``p2 * 10^j``;
* ``GrisuRound``'s nudges are masked steps over the few elements that still need one;
* the text is a fixed-width byte matrix (sign, a prefix from a table, the digits each followed by an optional
  '.', a suffix from a table) with NUL wherever a row has nothing, squeezed into one buffer at the end.
"""

from __future__ import annotations

import numpy as np

from naiad.frontends.http import dtoa

_U64 = np.uint64
_M32 = _U64(0xFFFFFFFF)
_SHIFT32 = _U64(32)
_HALF = _U64(1 << 31)
_HIDDEN = _U64(1 << 52)
_FRACTION = _U64((1 << 52) - 1)
_ABS = _U64((1 << 63) - 1)
_INFINITY = _U64(0x7FF0000000000000)
_ONE_BITS = _U64(0x3FF0000000000000)  # 1.0: what a zero or non-finite element computes with, its text set apart

_POW10 = np.array([10**i for i in range(20)], dtype=np.uint64)
# delta * 10^j overflows uint64 from this delta on; such a j ends the fraction loop anyway (p2_j < 2^60 <= it).
_OVERFLOWS = np.array([(1 << 64) - 1] + [-(-(1 << 64) // 10**i) for i in range(1, 20)], dtype=np.uint64)

# The binary exponent of the upper boundary runs from -1137 (the smallest subnormal) to 960 (the largest double).
_PLUS_E_MIN = -1137
_powers = [dtoa.cached_power(e) for e in range(_PLUS_E_MIN, 961)]
_CACHED_F = np.array([f for f, _, _ in _powers], dtype=np.uint64)
# The shift s with 2^-s the unit of the scaled boundary (DigitGen's -one.e), and the decimal exponent K.
_SHIFT = np.array([-(e + c_e + 64) for e, (_, c_e, _) in zip(range(_PLUS_E_MIN, 961), _powers)], dtype=np.uint64)
_K = np.array([k for _, _, k in _powers], dtype=np.int64)
del _powers

# Four decimal digits per table entry, as the four ASCII bytes of a little-endian uint32 ("0042" -> b"0042").
_DIGITS4 = np.frombuffer(b"".join(b"%04d" % i for i in range(10000)), dtype="<u4")


def _table8(texts: list[bytes]) -> np.ndarray:
    return np.frombuffer(b"".join(t.ljust(8, b"\0") for t in texts), dtype="<u8").copy()


# Prefixes: 0 none, 1..6 "0." and 0..5 zeros (Prettify's 0.001234 layout), 7 NaN, 8 Infinity.
_PREFIX = _table8([b""] + [b"0." + b"0" * i for i in range(6)] + [b"NaN", b"Infinity"])
_NAN_PREFIX, _INF_PREFIX = 7, 8
# Suffixes: 0 the comma alone, 512 + x "e<x>," (WriteExponent: no '+', no leading zeros).
_EXPONENT_BIAS = 512
_SUFFIX = _table8([b","] + [b"e%d," % (i - _EXPONENT_BIAS) for i in range(1, 1024)])


def _bit_length(x: np.ndarray) -> np.ndarray:
    """Bit lengths of values below 2^53 (exact as doubles)."""
    return np.frexp(x.astype(np.float64))[1].astype(np.int64)


def _multiply128(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The full product of uint64 arrays as (high, low) halves, by 32-bit pieces."""
    a_hi, a_lo = a >> _SHIFT32, a & _M32
    b_hi, b_lo = b >> _SHIFT32, b & _M32
    lo_lo = a_lo * b_lo
    mid = (lo_lo >> _SHIFT32) + (a_hi * b_lo & _M32) + (a_lo * b_hi & _M32)
    high = a_hi * b_hi + (a_hi * b_lo >> _SHIFT32) + (a_lo * b_hi >> _SHIFT32) + (mid >> _SHIFT32)
    return high, (mid << _SHIFT32) | (lo_lo & _M32)


def _multiply_rounded(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The high 64 bits of a * b, rounded half up (DiyFp::operator*, in the 32-bit form RapidJSON also has)."""
    a_hi, a_lo = a >> _SHIFT32, a & _M32
    b_hi, b_lo = b >> _SHIFT32, b & _M32
    ad, bc = a_hi * b_lo, a_lo * b_hi
    mid = ((a_lo * b_lo) >> _SHIFT32) + (ad & _M32) + (bc & _M32) + _HALF
    return a_hi * b_hi + (ad >> _SHIFT32) + (bc >> _SHIFT32) + (mid >> _SHIFT32)


def _grisu_round(digits: np.ndarray, rows: np.ndarray, delta: np.ndarray, rest: np.ndarray, ten_kappa: np.ndarray,
                 wp_w: np.ndarray) -> None:
    """GrisuRound for ``rows`` of ``digits`` (the other arrays are those rows' values), in place."""
    while rows.size:
        step = rest + ten_kappa
        more = (rest < wp_w) & (delta - rest >= ten_kappa) & ((step < wp_w) | (wp_w - rest > step - wp_w))
        if not more.any():
            return
        rows, delta, rest, ten_kappa, wp_w = rows[more], delta[more], step[more], ten_kappa[more], wp_w[more]
        digits[rows] -= _U64(1)


def grisu2(magnitude: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For IEEE bits of positive finite nonzero doubles: Grisu2's digits as one integer each, and the decimal
    exponent of the last digit (``dtoa.grisu2`` for all at once)."""
    biased = (magnitude >> _U64(52)).astype(np.int64)
    normal = biased != 0
    fraction = magnitude & _FRACTION
    f = np.where(normal, fraction | _HIDDEN, fraction)
    e = np.where(normal, biased - 1075, -1074)
    subnormal = not normal.all()

    # NormalizedBoundaries: the upper boundary (2f+1)/2 shifted until bit 63 is set; the lower one beside it.
    plus_f = (f << _U64(1)) + _U64(1)
    shift = np.where(normal, 10, 64 - _bit_length(plus_f)) if subnormal else np.full(f.shape, 10, np.int64)
    plus_f <<= shift.astype(np.uint64)
    plus_e = e - 1 - shift
    power_of_two = f == _HIDDEN
    minus_f = np.where(power_of_two, (f << _U64(2)) - _U64(1), (f << _U64(1)) - _U64(1))
    minus_f <<= (np.where(power_of_two, e - 2, e - 1) - plus_e).astype(np.uint64)

    index = plus_e - _PLUS_E_MIN
    c_f, s, k = _CACHED_F[index], _SHIFT[index], _K[index]
    w_shift = np.where(normal, 11, 64 - _bit_length(f)).astype(np.uint64) if subnormal else _U64(11)
    w = _multiply_rounded(f << w_shift, c_f)
    wp = _multiply_rounded(plus_f, c_f) - _U64(1)
    delta = wp - (_multiply_rounded(minus_f, c_f) + _U64(1))
    wp_w = wp - w

    # DigitGen. p1: the integer part of the scaled upper boundary (below 10^9 for every double), p2 its fraction.
    mask = (_U64(1) << s) - _U64(1)
    p1 = wp >> s
    p2 = wp & mask
    digits = np.empty_like(p1)
    exponent = np.empty_like(k)

    # Integer-part stops: only where the fraction alone fits in delta (the remainders grow with the power).
    whole = np.flatnonzero(p2 <= delta)
    if whole.size:
        wp1, wp2, wdelta, ws = p1[whole], p2[whole], delta[whole], s[whole]
        count = np.searchsorted(_POW10[1:9], wp1, side="right") + 1  # CountDecimalDigit32
        kappa = np.zeros(whole.size, np.int64)
        rest = wp2.copy()
        for power in range(1, 9):  # the largest power below the digit count whose remainder fits
            r = ((wp1 % _POW10[power]) << ws) + wp2
            fits = (power < count) & (r <= wdelta)
            kappa = np.where(fits, power, kappa)
            rest = np.where(fits, r, rest)
        digits[whole] = wp1 // _POW10[kappa]
        exponent[whole] = k[whole] + kappa
        _grisu_round(digits, whole, wdelta, rest, _POW10[kappa] << ws, wp_w[whole])

    # Fraction-loop stops: the first j >= 1 with (p2 * 10^j mod 2^s) < delta * 10^j.
    frac = np.flatnonzero(p2 > delta) if whole.size else np.arange(p1.size)
    if frac.size:
        fp1, fp2, fdelta, fs, fmask = (p1, p2, delta, s, mask) if not whole.size else (
            p1[frac], p2[frac], delta[frac], s[frac], mask[frac])
        low, high = np.ones(frac.size, np.int64), np.full(frac.size, 19, np.int64)
        for _ in range(5):  # 19 candidates: five halvings
            middle = (low + high) >> 1
            scale = _POW10[middle]
            done = (fdelta >= _OVERFLOWS[middle]) | ((fp2 * scale) & fmask < fdelta * scale)
            high = np.where(done, middle, high)
            low = np.where(done, low, middle + 1)
        scale = _POW10[low]
        top, bottom = _multiply128(fp2, scale)
        fraction_digits = (top << (_U64(64) - fs)) | (bottom >> fs)
        digits[frac] = fp1 * scale + fraction_digits
        exponent[frac] = k[frac] - low
        # RapidJSON 1.1.0 scales wp_w by 10^j only for j < 9, else by 0: no nudge at all from nine digits on.
        nudge = np.flatnonzero(low < dtoa.ROUND_FRACTION_DIGITS)
        if nudge.size:
            j = low[nudge]
            _grisu_round(digits, frac[nudge], fdelta[nudge] * _POW10[j], (fp2[nudge] * _POW10[j]) & fmask[nudge],
                         fmask[nudge] + _U64(1), wp_w[frac[nudge]] * _POW10[j])
    return digits, exponent


def triton_texts(array: np.ndarray) -> bytes:
    """The JSON array Triton writes for ``array``'s values as doubles: ``b"[1e308,0.30000000000000007,NaN]"``."""
    values = np.ascontiguousarray(array, dtype=np.float64).reshape(-1)
    n = values.size
    if not n:
        return b"[]"
    bits = values.view(np.uint64)
    magnitude = bits & _ABS
    negative = bits > _ABS
    zero = magnitude == _U64(0)
    nonfinite = magnitude >= _INFINITY
    special = zero | nonfinite
    any_special = special.any()
    digits, exponent = grisu2(np.where(special, _ONE_BITS, magnitude) if any_special else magnitude)
    if any_special:
        digits[zero] = _U64(0)
        exponent[zero] = 0
    length = np.searchsorted(_POW10[1:], digits, side="right") + 1  # digits, 1 to 19 (zero: "0")
    kk = length + exponent  # 10^(kk-1) <= value < 10^kk, as Prettify names it
    fixed = (exponent >= 0) & (kk <= 21)  # 1234e7 -> 12340000000.0
    point = (kk > 0) & (kk <= 21)  # with fixed: 12.34 and 12340000000.0 both put a '.' after digit kk
    small = (kk > -6) & (kk <= 0)  # 0.001234
    scientific = ~(point | small)

    # The digits, left-aligned: padded with zeros to 19, four at a time through the table, as ASCII.
    padded = digits * _POW10[19 - length]
    top, rest = np.divmod(padded, _U64(10**16))
    upper, lower = np.divmod(rest, _U64(10**8))
    upper_hi, upper_lo = np.divmod(upper.astype(np.uint32), np.uint32(10000))
    lower_hi, lower_lo = np.divmod(lower.astype(np.uint32), np.uint32(10000))
    words = np.stack([_DIGITS4[top], _DIGITS4[upper_hi], _DIGITS4[upper_lo], _DIGITS4[lower_hi], _DIGITS4[lower_lo]],
                     axis=1)
    ascii_digits = words.view(np.uint8)[:, 1:]  # 19 columns ('0'-padded past each row's length)

    # How many digit columns a row shows: its digits, or for 1234e7 its digits, the zeros up to the point, and
    # the 0 after it ("12340000000.0": kk + 1 columns, the point between the last two).
    shown = np.where(fixed, kk + 1, length)
    if any_special:
        shown[nonfinite] = 0
    width = int(shown.max())
    columns = np.arange(width)
    block = np.zeros((n, width), "<u2")  # a digit, then the '.' that may follow it (NUL where none)
    block[:, : min(width, 19)] = ascii_digits[:, :width]
    if width > 19:
        block[:, 19:] = ord("0")  # zeros of 1e20 and 1e21 layouts past the 19 computed digits
    block *= columns < shown[:, None]
    dot = np.where(point, kk - 1, np.where(scientific & (length > 1), 0, -1))  # the '.' after this digit column
    if any_special:
        dot[nonfinite] = -1
    block |= np.where(columns == dot[:, None], np.uint16(ord(".") << 8), np.uint16(0))

    prefix = np.where(small, 1 - kk, 0)
    suffix = np.where(scientific, kk - 1 + _EXPONENT_BIAS, 0)
    sign = np.where(negative, np.uint8(ord("-")), np.uint8(0))
    if any_special:
        nan = magnitude > _INFINITY
        prefix[nonfinite] = np.where(nan[nonfinite], _NAN_PREFIX, _INF_PREFIX)
        suffix[nonfinite] = 0
        sign[nan] = 0  # NaN has no sign in RapidJSON's writer

    rows = np.empty((n, 17 + 2 * width), np.uint8)
    rows[:, 0] = sign
    rows[:, 1:9] = _PREFIX[prefix].view(np.uint8).reshape(n, 8)
    rows[:, 9 : 9 + 2 * width] = block.view(np.uint8)
    rows[:, 9 + 2 * width :] = _SUFFIX[suffix].view(np.uint8).reshape(n, 8)
    flat = rows.reshape(-1)
    text = flat[flat != 0]
    text[-1] = ord("]")
    return b"[" + text.tobytes()
