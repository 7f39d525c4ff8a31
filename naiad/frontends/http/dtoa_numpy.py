"""Triton's text for a whole float64 array at once: ``dtoa``'s algorithm as NumPy uint64 arithmetic, no loop per value.

The steps are RapidJSON's (see ``dtoa``), each done for every element together:

* the cached power comes from tables indexed by the upper boundary's binary exponent (its choice is a double
  computation, so it is tabulated from ``dtoa.cached_power`` itself rather than redone);
* the three ``DiyFp`` products share their factor: w * c is formed once as 128 bits (32-bit halves), and the
  boundaries' products are w * c plus or minus c shifted, each then rounded half up as RapidJSON rounds;
* ``DigitGen`` keeps the digits as one integer per element. Its integer-part loop stops at the largest power of
  ten whose remainder fits in delta; remainders grow with the power, so only elements whose fraction alone fits
  can stop there (few: masked steps over those). Its fraction loop stops at the first digit count j where
  ``p2 * 10^j mod 2^s < delta * 10^j``: the scaled truncation error only shrinks as j grows, so the answer lies
  at or below the j where ``delta * 10^j`` reaches 2^s (counted from ``(2^s - 1) // delta``); one masked step
  down settles most elements, a binary search the rest; the digits then come from one 128-bit product
  ``p2 * 10^j``;
* ``GrisuRound``'s nudges are masked steps over the elements that still need one;
* the text: each row is five little-endian uint64 words (sign and prefix from a table, 24 bytes of digits with
  the '.' spliced in by shifting the bytes after it, the exponent and comma from a table), NUL wherever a row has
  nothing, and the rows are squeezed into one buffer at the end.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from naiad.frontends.http import dtoa

_U64 = np.uint64
_M32 = _U64(0xFFFFFFFF)
_32 = _U64(32)
_FRACTION = _U64((1 << 52) - 1)
_HIDDEN = _U64(1 << 52)
_ABS = _U64((1 << 63) - 1)
_INFINITY = _U64(0x7FF0000000000000)
_ONE_BITS = _U64(0x3FF0000000000000)  # 1.0: what a zero or non-finite element computes with, its text set apart

_POW10 = np.array([10**i for i in range(20)], dtype=np.uint64)

# Tables by the upper boundary's binary exponent, -1137 (the smallest subnormal) to 960 (the largest double): the
# cached power's 32-bit halves, DigitGen's shift s (2^-s is the unit of the scaled boundary), 2^s - 1, and K.
_PLUS_E_MIN = -1137
_NORMAL_INDEX = -1075 - 11 - _PLUS_E_MIN  # a normal double's table index is its biased exponent plus this
_powers = [(e, *dtoa.cached_power(e)) for e in range(_PLUS_E_MIN, 961)]
_CACHED = np.array([f for _, f, _, _ in _powers], dtype=np.uint64)
_CACHED_HI, _CACHED_LO = _CACHED >> _32, _CACHED & _M32
_SHIFT = np.array([-(e + c_e + 64) for e, _, c_e, _ in _powers], dtype=np.uint64)
_MASK = (_U64(1) << _SHIFT) - _U64(1)
_K = np.array([k for _, _, _, k in _powers], dtype=np.int64)
del _powers

# Text tables. Four decimal digits per entry as the ASCII bytes of a little-endian word ("0042" -> b"0042").
_DIGITS4 = np.frombuffer(b"".join(b"%04d" % i for i in range(10000)), dtype="<u4").astype("<u8")
_ZEROS4 = _U64(int.from_bytes(b"0000", "little"))


def _words(texts: list[bytes]) -> np.ndarray:
    return np.frombuffer(b"".join(t.ljust(8, b"\0") for t in texts), dtype="<u8").copy()


# Prefixes, 8 bytes: code 0-6 "" or "0." and 0-5 zeros (Prettify's 0.001234), +8 with a '-'; 16 NaN, 17-18 Inf.
_PREFIX = _words([sign + body for sign in (b"", b"-") for body in [b""] + [b"0." + b"0" * i for i in range(6)] + [b""]]
                 + [b"NaN", b"Inf", b"-Inf"])
_NAN_PREFIX, _INF_PREFIX = 16, 17
# Suffixes, 8 bytes: 0 the comma alone, 1 "inity," (after "Inf"), 512 + x "e<x>," (no '+', no leading zeros).
_EXPONENT_BIAS = 512
_SUFFIX = _words([b",", b"inity,"] + [b"e%d," % (i - _EXPONENT_BIAS) for i in range(2, 1024)])
_INF_SUFFIX = 1

# The 24 digit bytes of a row: byte 0 a spare '0' (always dropped), bytes 1-19 the digits zero-padded, 20-23 zeros.
# _SHOWN[n]: the mask keeping bytes 1..n. _BEFORE[d]: the mask of bytes 0..d (the '.' follows byte d; 0 for none),
# _POINT[d]: a '.' at byte d + 1.
_ALL = (1 << 192) - 1


def _split(value: int) -> tuple[int, int, int]:
    return value & (2**64 - 1), value >> 64 & (2**64 - 1), value >> 128


_SHOWN = np.array([_split(((1 << 8 * n) - 1) << 8) for n in range(23)], dtype=np.uint64)
_BEFORE = np.array([_split(_ALL)] + [_split((1 << 8 * (d + 1)) - 1) for d in range(1, 23)], dtype=np.uint64)
_POINT = np.array([(0, 0, 0)] + [_split(ord(".") << 8 * (d + 1)) for d in range(1, 23)], dtype=np.uint64)
_56, _8 = _U64(56), _U64(8)


def _bit_length(x: np.ndarray) -> np.ndarray:
    """Bit lengths of values below 2^53 (exact as doubles)."""
    return np.frexp(x.astype(np.float64))[1].astype(np.int64)


def _multiply128(a: np.ndarray, b_hi: np.ndarray, b_lo: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The full product of uint64 ``a`` and ``b`` (given as its 32-bit halves) as (high, low) words."""
    a_hi, a_lo = a >> _32, a & _M32
    lo_lo, hi_lo, lo_hi = a_lo * b_lo, a_hi * b_lo, a_lo * b_hi
    mid = (lo_lo >> _32) + (hi_lo & _M32) + (lo_hi & _M32)
    high = a_hi * b_hi + (hi_lo >> _32) + (lo_hi >> _32) + (mid >> _32)
    return high, (mid << _32) | (lo_lo & _M32)


def _grisu_round(digits: np.ndarray, rows: np.ndarray, delta: np.ndarray, rest: np.ndarray, ten_kappa: np.ndarray,
                 wp_w: np.ndarray) -> None:
    """GrisuRound for ``rows`` of ``digits`` (the other arrays hold those rows' values), in place. Its uint64
    expressions wrap as RapidJSON's do; the loop's terms are the same ones, evaluated for all rows at once."""
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
    biased = magnitude >> _U64(52)
    fraction = magnitude & _FRACTION
    w: np.ndarray
    upper: Any  # the boundaries' shift: one for all (normal doubles) or one each
    if biased.all():
        # Normal doubles: w = f << 11 has its top bit set, and the boundaries are w +- 2^10 (2^9 below a power of
        # two, whose lower neighbour is half as far).
        w = (fraction | _HIDDEN) << _U64(11)
        index = biased.astype(np.int64) + _NORMAL_INDEX
        upper = _U64(10)
    else:
        # Subnormals too: w = f shifted until its top bit is set, the boundaries half a unit of the shifted f away.
        normal = biased != 0
        f = np.where(normal, fraction | _HIDDEN, fraction)
        normalize = np.where(normal, 11, 64 - _bit_length(f))
        w = f << normalize.astype(np.uint64)
        index = np.where(normal, biased.astype(np.int64) - 1075, -1074) - normalize - _PLUS_E_MIN
        upper = (normalize - 1).astype(np.uint64)
    lower = upper - (fraction == 0)  # (a subnormal's fraction is never 0)
    c = _CACHED[index]
    s, mask, k = _SHIFT[index], _MASK[index], _K[index]

    # DiyFp products, rounded half up: W = w*c, W+ = (w + 2^upper)*c - 1, W- = (w - 2^lower)*c + 1.
    high, low = _multiply128(w, _CACHED_HI[index], _CACHED_LO[index])
    add_low = c << upper
    plus_low = low + add_low
    wp = high + (c >> (_U64(64) - upper)) + (plus_low < low) + (plus_low >> _U64(63)) - _U64(1)
    sub_low = c << lower
    minus_low = low - sub_low
    wm = high - (c >> (_U64(64) - lower)) - (minus_low > low) + (minus_low >> _U64(63)) + _U64(1)
    delta = wp - wm
    wp_w = wp - (high + (low >> _U64(63)))

    # DigitGen. p1: the integer part of the scaled upper boundary (below 10^9 for every double), p2 its fraction.
    p1 = wp >> s
    p2 = wp & mask
    digits = np.empty_like(p1)
    exponent = np.empty_like(k)
    whole = p2 <= delta
    if whole.any():
        rows = np.flatnonzero(whole)
        _whole_stops(digits, exponent, rows, p1[rows], p2[rows], delta[rows], s[rows], k[rows], wp_w[rows])
        rows = np.flatnonzero(~whole)
        if rows.size:
            _fraction_stops(digits, exponent, rows, p1[rows], p2[rows], delta[rows], s[rows], mask[rows], k[rows],
                            wp_w[rows])
    else:
        _fraction_stops(digits, exponent, None, p1, p2, delta, s, mask, k, wp_w)
    return digits, exponent


def _whole_stops(digits: np.ndarray, exponent: np.ndarray, rows: np.ndarray, p1: np.ndarray, p2: np.ndarray,
                 delta: np.ndarray, s: np.ndarray, k: np.ndarray, wp_w: np.ndarray) -> None:
    """DigitGen's integer-part loop, for rows whose fraction alone fits in delta (it stops there at the latest)."""
    count = np.searchsorted(_POW10[1:9], p1, side="right") + 1  # CountDecimalDigit32
    kappa = np.zeros(rows.size, np.int64)
    rest = p2
    for power in range(1, 9):  # the largest power below the digit count whose remainder fits
        r = ((p1 % _POW10[power]) << s) + p2
        fits = (power < count) & (r <= delta)
        kappa = np.where(fits, power, kappa)
        rest = np.where(fits, r, rest)
    digits[rows] = p1 // _POW10[kappa]
    exponent[rows] = k + kappa
    _grisu_round(digits, rows, delta, rest, _POW10[kappa] << s, wp_w)


def _fraction_stops(digits: np.ndarray, exponent: np.ndarray, rows: np.ndarray | None, p1: np.ndarray,
                    p2: np.ndarray, delta: np.ndarray, s: np.ndarray, mask: np.ndarray, k: np.ndarray,
                    wp_w: np.ndarray) -> None:
    """DigitGen's fraction loop, for rows (None: all) whose fraction exceeds delta: it stops at the first j with
    p2 * 10^j mod 2^s < delta * 10^j. From the first j where delta * 10^j >= 2^s it holds for sure; below that
    ``delta * 10^j`` can't overflow, and it holds down to the answer and not below."""
    j = np.maximum(np.searchsorted(_POW10, mask // delta, side="right"), 1)
    lower = j - 1
    scale = _POW10[lower]
    holds = (lower > 0) & ((p2 * scale) & mask < delta * scale)
    j = np.where(holds, lower, j)
    # Most stop there or one lower; the rest (short decimals like 0.5 go all the way to j = 1) by binary search
    # for the first j that holds, between 1 and the j that does.
    going = np.flatnonzero(holds & (lower > 1))
    if going.size:
        low, high = np.ones(going.size, np.int64), j[going]
        g_p2, g_mask, g_delta = p2[going], mask[going], delta[going]
        while True:
            open_ = low < high
            if not open_.any():
                break
            middle = (low + high) >> 1
            scale = _POW10[middle]
            holds = (g_p2 * scale) & g_mask < g_delta * scale
            high = np.where(open_ & holds, middle, high)
            low = np.where(open_ & ~holds, middle + 1, low)
        j[going] = high

    scale = _POW10[j]
    high, low = _multiply128(p2, scale >> _32, scale & _M32)
    fraction_digits = (high << (_U64(64) - s)) | (low >> s)
    found = p1 * scale + fraction_digits
    if rows is None:
        digits[:] = found
        exponent[:] = k - j
        rows = np.arange(found.size)
    else:
        digits[rows] = found
        exponent[rows] = k - j
    # RapidJSON 1.1.0 scales wp_w by 10^j only for j < 9, else by 0: no nudge at all from nine digits on.
    nudge = np.flatnonzero(j < dtoa.ROUND_FRACTION_DIGITS)
    if nudge.size:
        scale = scale[nudge]
        _grisu_round(digits, rows[nudge], delta[nudge] * scale, (p2[nudge] * scale) & mask[nudge],
                     mask[nudge] + _U64(1), wp_w[nudge] * scale)


# Elements per pass: the arrays of one pass stay in the CPU's caches (the whole array at once runs ~25 % slower).
CHUNK = 1 << 16


def triton_texts(array: np.ndarray) -> bytes:
    """The JSON array Triton writes for ``array``'s values as doubles: ``b"[1e308,0.30000000000000007,NaN]"``."""
    values = np.ascontiguousarray(array, dtype=np.float64).reshape(-1)
    if not values.size:
        return b"[]"
    parts = [b"["] + [_texts(values[start : start + CHUNK]) for start in range(0, values.size, CHUNK)]
    parts[-1] = parts[-1][:-1] + b"]"  # the last element's comma
    return b"".join(parts)


def _texts(values: np.ndarray) -> bytes:
    """Each value's text followed by a comma."""
    n = values.size
    bits = values.view(np.uint64)
    magnitude = bits & _ABS
    special = (magnitude - _U64(1)) >= (_INFINITY - _U64(1))  # zero (wrapped), infinities, NaN
    any_special = special.any()
    digits, exponent = grisu2(np.where(special, _ONE_BITS, magnitude) if any_special else magnitude)
    if any_special:
        zero = magnitude == _U64(0)
        digits[zero] = _U64(0)
        exponent[zero] = 0

    length = np.searchsorted(_POW10[1:], digits, side="right") + 1  # 1 to 19 ("0" for zero)
    kk = length + exponent  # 10^(kk-1) <= value < 10^kk, as Prettify names it
    point = (kk > 0) & (kk <= 21)  # 12.34, and (exponent >= 0) 12340000000.0: a '.' after digit kk
    small = (kk > -6) & (kk <= 0)  # 0.001234
    scientific = ~(point | small)  # 1.234e33 (a '.' after the first digit unless it is the only one), 1e30
    fixed = point & (exponent >= 0)

    # The digits left-aligned and zero-padded to 19, as ASCII through the four-digit table, in three words.
    padded = digits * _POW10[19 - length]
    top = padded // _U64(10**16)
    rest = padded - top * _U64(10**16)
    upper = rest // _U64(10**8)
    lower = rest - upper * _U64(10**8)
    upper_hi, lower_hi = upper // _U64(10**4), lower // _U64(10**4)
    words = (_DIGITS4[top] | (_DIGITS4[upper_hi] << _32),
             _DIGITS4[upper - upper_hi * _U64(10**4)] | (_DIGITS4[lower_hi] << _32),
             _DIGITS4[lower - lower_hi * _U64(10**4)] | (_ZEROS4 << _32))
    # Shown: the digits, or for 1234e7 the digits, the zeros to the point and the 0 after it (kk + 1 of them).
    shown = np.where(fixed, kk + 1, length)
    point_at = np.where(point, kk, scientific & (length > 1))  # '.' after digit 1..21 (0: none)
    prefix = np.where(small, 1 - kk, 0) | ((bits >> _U64(60)).astype(np.int64) & 8)
    suffix = np.where(scientific, kk + (_EXPONENT_BIAS - 1), 0)
    if any_special:
        nonfinite = magnitude >= _INFINITY
        nan = magnitude > _INFINITY
        shown[nonfinite] = 0
        point_at[nonfinite] = 0
        prefix[nonfinite] = np.where(nan[nonfinite], _NAN_PREFIX, _INF_PREFIX + (prefix[nonfinite] >= 8))
        suffix[nonfinite] = np.where(nan[nonfinite], 0, _INF_SUFFIX)

    rows = np.empty((n, 5), "<u8")
    rows[:, 0] = _PREFIX[prefix]
    rows[:, 4] = _SUFFIX[suffix]
    shown_mask = _SHOWN[shown]
    before = _BEFORE[point_at]
    dot = _POINT[point_at]
    carry = None
    for i, word in enumerate(words):
        word = word & shown_mask[:, i]
        kept = word & before[:, i]
        moved = word ^ kept  # the bytes after the '.', one byte further on
        shifted = moved << _8 if carry is None else (moved << _8) | (carry >> _56)
        rows[:, 1 + i] = kept | shifted | dot[:, i]
        carry = moved
    flat = rows.view(np.uint8).reshape(-1)
    return flat[flat != 0].tobytes()
