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
  at or below the j where ``delta * 10^j`` reaches 2^s (counted from ``(2^s - 1) // delta``); two masked steps
  down settle nearly all elements, a binary search the rest; the digits then come from one 128-bit product
  ``p2 * 10^j``;
* ``GrisuRound``'s nudges are counted in closed form (how many steps of ten_kappa fit below its two bounds);
* the text: each row is five little-endian uint64 words (sign and prefix from a table, 24 bytes of digits with
  the '.' spliced in by shifting the bytes after it, the exponent and comma from a table; Prettify's choice of
  layout is a table by kk), NUL wherever a row has nothing, and the rows are squeezed into one buffer at the end;
* arrays go through in passes of ``CHUNK`` elements, whose temporaries stay in the CPU's caches.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from naiad.frontends.http import dtoa


def _u(value: int) -> np.ndarray:
    # Constants as 0-d arrays: NumPy combines those with an array about a third faster than a NumPy scalar.
    return np.array(value, dtype=np.uint64)


_0, _1, _8, _10, _11, _32, _52, _56, _60, _63, _64 = map(_u, (0, 1, 8, 10, 11, 32, 52, 56, 60, 63, 64))
_M32 = _u(0xFFFFFFFF)
_FRACTION = _u((1 << 52) - 1)
_HIDDEN = _u(1 << 52)
_ABS = _u((1 << 63) - 1)
_INFINITY = _u(0x7FF0000000000000)
_ALMOST_INFINITY = _u(0x7FF0000000000000 - 1)
_ONE_BITS = _u(0x3FF0000000000000)  # 1.0: what a zero or non-finite element computes with, its text set apart
_E4, _E8, _E16 = _u(10**4), _u(10**8), _u(10**16)

_POW10 = np.array([10**i for i in range(20)], dtype=np.uint64)

# Tables by the upper boundary's binary exponent, -1137 (the smallest subnormal) to 960 (the largest double): the
# cached power and its 32-bit halves, DigitGen's shift s (2^-s is the unit of the scaled boundary), 2^s - 1, K.
_PLUS_E_MIN = -1137
_NORMAL_INDEX = -1075 - 11 - _PLUS_E_MIN  # a normal double's table index is its biased exponent plus this
_powers = [(e, *dtoa.cached_power(e)) for e in range(_PLUS_E_MIN, 961)]
_CACHED = np.array([f for _, f, _, _ in _powers], dtype=np.uint64)
_CACHED_HI, _CACHED_LO = _CACHED >> _32, _CACHED & _M32
_SHIFT = np.array([-(e + c_e + 64) for e, _, c_e, _ in _powers], dtype=np.uint64)
_MASK = (_1 << _SHIFT) - _1
_K = np.array([k for _, _, _, k in _powers], dtype=np.int64)
del _powers

# --- text tables ---------------------------------------------------------------------------------------------------
# Four decimal digits per entry as the ASCII bytes of a little-endian word ("0042" -> b"0042").
_DIGITS4 = np.frombuffer(b"".join(b"%04d" % i for i in range(10000)), dtype="<u4")
_ZEROS4 = np.frombuffer(b"0000", dtype="<u4")[0]


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

# Prettify's layout by kk (10^(kk-1) <= value < 10^kk), indexed by kk + _KK: the prefix code, the suffix code,
# whether the '.' comes after digit kk (12.34, 12340000000.0), and whether the layout is an exponent's (1.234e33).
_KK = 400
_kk = np.arange(-_KK, _KK)
_POINTED = (_kk > 0) & (_kk <= 21)
_SMALL = (_kk > -6) & (_kk <= 0)
_SCIENTIFIC = ~(_POINTED | _SMALL)
_KK_PREFIX = np.where(_SMALL, 1 - _kk, 0).astype(np.uint64)
_KK_SUFFIX = np.where(_SCIENTIFIC, _kk + (_EXPONENT_BIAS - 1), 0)
# Where the '.' goes, per kk and then per whether the value has one digit only: after digit kk (fixed layouts),
# after the first digit (exponent layouts, unless that digit is all), or nowhere (0).
_KK_POINT = np.stack([np.where(_POINTED, _kk, _SCIENTIFIC), np.where(_POINTED, _kk, 0)], axis=1).ravel()
del _kk

# The 24 digit bytes of a row: byte 0 a spare '0' (always dropped), bytes 1-19 the digits zero-padded, 20-23 zeros.
# _SHOWN[n]: the mask keeping bytes 1..n. _BEFORE[d]: the mask of bytes 0..d (the '.' follows byte d; 0 for none),
# _POINT[d]: a '.' at byte d + 1.
_ALL = (1 << 192) - 1


def _split(value: int) -> tuple[int, int, int]:
    return value & (2**64 - 1), value >> 64 & (2**64 - 1), value >> 128


_SHOWN = np.array([_split(((1 << 8 * n) - 1) << 8) for n in range(23)], dtype="<u8")
_BEFORE = np.array([_split(_ALL)] + [_split((1 << 8 * (d + 1)) - 1) for d in range(1, 23)], dtype="<u8")
_POINT = np.array([(0, 0, 0)] + [_split(ord(".") << 8 * (d + 1)) for d in range(1, 23)], dtype="<u8")


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
    """GrisuRound for ``rows`` of ``digits`` (the other arrays hold those rows' values), in place, in closed form.

    RapidJSON steps the last digit down while rest < wp_w, delta - rest >= ten_kappa, and (rest + ten_kappa < wp_w
    or wp_w - rest > rest + ten_kappa - wp_w); evaluated in that order none of its uint64 terms wraps. The first
    and third together say 2 (wp_w - rest) > ten_kappa, i.e. rest <= wp_w - ten_kappa // 2 - 1; the second says
    rest <= delta - ten_kappa. Each step adds ten_kappa to rest, so the steps are those that fit below both."""
    half = ten_kappa >> _1
    bound = np.minimum(wp_w - half - _1, delta - ten_kappa)  # (wraps only where not possible below)
    possible = (wp_w > half) & (delta >= ten_kappa) & (rest <= bound)
    if possible.any():
        take = np.flatnonzero(possible)
        digits[rows[take]] -= (bound[take] - rest[take]) // ten_kappa[take] + _1


def grisu2(magnitude: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For IEEE bits of positive finite nonzero doubles: Grisu2's digits as one integer each, and the decimal
    exponent of the last digit (``dtoa.grisu2`` for all at once)."""
    biased = magnitude >> _52
    fraction = magnitude & _FRACTION
    w: np.ndarray
    upper: Any  # the boundaries' shift: one for all (normal doubles) or one each
    if biased.all():
        # Normal doubles: w = f << 11 has its top bit set, and the boundaries are w +- 2^10 (2^9 below a power of
        # two, whose lower neighbour is half as far).
        w = (fraction | _HIDDEN) << _11
        index = biased.astype(np.intp) + _NORMAL_INDEX
        upper = _10
    else:
        # Subnormals too: w = f shifted until its top bit is set, the boundaries half a unit of the shifted f away.
        normal = biased != 0
        f = np.where(normal, fraction | _HIDDEN, fraction)
        normalize = np.where(normal, 11, 64 - _bit_length(f))
        w = f << normalize.astype(np.uint64)
        index = np.where(normal, biased.astype(np.intp) - 1075, -1074) - normalize - _PLUS_E_MIN
        upper = (normalize - 1).astype(np.uint64)
    lower = upper - (fraction == _0)  # (a subnormal's fraction is never 0)
    c = _CACHED[index]
    s, mask, k = _SHIFT[index], _MASK[index], _K[index]

    # DiyFp products, rounded half up: W = w*c, W+ = (w + 2^upper)*c - 1, W- = (w - 2^lower)*c + 1.
    high, low = _multiply128(w, _CACHED_HI[index], _CACHED_LO[index])
    plus_low = low + (c << upper)
    wp = high + (c >> (_64 - upper)) + (plus_low < low) + (plus_low >> _63) - _1
    minus_low = low - (c << lower)
    wm = high - (c >> (_64 - lower)) - (minus_low > low) + (minus_low >> _63) + _1
    delta = wp - wm
    wp_w = wp - (high + (low >> _63))

    # DigitGen. p1: the integer part of the scaled upper boundary (below 10^9 for every double), p2 its fraction.
    p1 = wp >> s
    p2 = wp & mask
    whole = p2 <= delta
    if not whole.any():
        return _fraction_stops(p1, p2, delta, s, mask, k, wp_w)
    digits = np.empty_like(p1)
    exponent = np.empty_like(k)
    rows = np.flatnonzero(whole)
    digits[rows], exponent[rows] = _whole_stops(p1[rows], p2[rows], delta[rows], s[rows], k[rows], wp_w[rows])
    rows = np.flatnonzero(~whole)
    if rows.size:
        digits[rows], exponent[rows] = _fraction_stops(p1[rows], p2[rows], delta[rows], s[rows], mask[rows], k[rows],
                                                       wp_w[rows])
    return digits, exponent


def _whole_stops(p1: np.ndarray, p2: np.ndarray, delta: np.ndarray, s: np.ndarray, k: np.ndarray,
                 wp_w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """DigitGen's integer-part loop, for elements whose fraction alone fits in delta (it stops there at the
    latest): the largest power below the digit count whose remainder fits."""
    count = np.searchsorted(_POW10[1:9], p1, side="right") + 1  # CountDecimalDigit32
    kappa = np.zeros(p1.size, np.intp)
    rest = p2
    for power in range(1, 9):
        r = ((p1 % _POW10[power]) << s) + p2
        fits = (power < count) & (r <= delta)
        kappa = np.where(fits, power, kappa)
        rest = np.where(fits, r, rest)
    digits = p1 // _POW10[kappa]
    _grisu_round(digits, np.arange(p1.size), delta, rest, _POW10[kappa] << s, wp_w)
    return digits, k + kappa


def _fraction_stops(p1: np.ndarray, p2: np.ndarray, delta: np.ndarray, s: np.ndarray, mask: np.ndarray,
                    k: np.ndarray, wp_w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """DigitGen's fraction loop, for elements whose fraction exceeds delta: it stops at the first j with
    p2 * 10^j mod 2^s < delta * 10^j. From the first j where delta * 10^j >= 2^s it holds for sure; below that
    ``delta * 10^j`` can't overflow, and it holds down to the answer and not below."""
    j = np.maximum(np.searchsorted(_POW10, mask // delta, side="right"), 1)
    # Steps down, each over the elements the last one moved (about 4 in 10, then 4 in 100); whatever is left after
    # two (short decimals like 0.5 go all the way to j = 1) by binary search between 1 and the j that holds.
    going = np.arange(j.size)
    g_p2, g_mask, g_delta = p2, mask, delta
    for _ in range(2):
        lower = j[going] - 1
        scale = _POW10[lower]
        holds = (lower > 0) & ((g_p2 * scale) & g_mask < g_delta * scale)
        going, lower = going[holds], lower[holds]
        if not going.size:
            break
        j[going] = lower
        g_p2, g_mask, g_delta = p2[going], mask[going], delta[going]
    else:
        low, high = np.ones(going.size, np.intp), j[going]
        for _ in range(int(high.max()).bit_length()):  # halves the widest interval to nothing
            middle = (low + high) >> 1
            scale = _POW10[middle]
            holds = (g_p2 * scale) & g_mask < g_delta * scale
            high = np.where(holds, middle, high)
            low = np.where(holds, low, middle + 1)
        j[going] = high

    scale = _POW10[j]
    top, bottom = _multiply128(p2, scale >> _32, scale & _M32)
    digits = p1 * scale + ((top << (_64 - s)) | (bottom >> s))
    # RapidJSON 1.1.0 scales wp_w by 10^j only for j < 9, else by 0: no nudge at all from nine digits on.
    nudge = np.flatnonzero(j < dtoa.ROUND_FRACTION_DIGITS)
    if nudge.size:
        scale = scale[nudge]
        _grisu_round(digits, nudge, delta[nudge] * scale, (p2[nudge] * scale) & mask[nudge], mask[nudge] + _1,
                     wp_w[nudge] * scale)
    return digits, k - j


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
    special = (magnitude - _1) >= _ALMOST_INFINITY  # zero (wrapped), infinities, NaN
    any_special = special.any()
    digits, exponent = grisu2(np.where(special, _ONE_BITS, magnitude) if any_special else magnitude)
    if any_special:
        zero = magnitude == _0
        digits[zero] = _0
        exponent[zero] = 0

    length = np.searchsorted(_POW10[1:], digits, side="right") + 1  # 1 to 19 ("0" for zero)
    kk = length + exponent  # 10^(kk-1) <= value < 10^kk, as Prettify names it
    at = kk + _KK
    point_at = _KK_POINT[2 * at + (length == 1)]  # '.' after digit 1..21 (0: none)
    # Shown: the digits, or for 1234e7 the digits, the zeros to the point and the 0 after it (kk + 1 of them).
    shown = np.where((exponent >= 0) & (kk <= 21), kk + 1, length)
    prefix = _KK_PREFIX[at] + ((bits >> _60) & _8)  # (the sign bit, as 8)
    suffix = _KK_SUFFIX[at]
    if any_special:
        nonfinite = magnitude >= _INFINITY
        nan = magnitude > _INFINITY
        shown[nonfinite] = 0
        point_at[nonfinite] = 0
        prefix[nonfinite] = np.where(nan[nonfinite], _NAN_PREFIX, _INF_PREFIX + (prefix[nonfinite] >= 8))
        suffix[nonfinite] = np.where(nan[nonfinite], 0, _INF_SUFFIX)

    # The digits left-aligned and zero-padded to 19, as ASCII four at a time through the table: 24 bytes a row.
    padded = digits * _POW10[19 - length]
    quarters = np.empty((n, 5), np.uint64)
    top = np.floor_divide(padded, _E16, out=quarters[:, 0])
    halves = np.empty((n, 2), np.uint64)
    rest = padded - top * _E16
    np.floor_divide(rest, _E8, out=halves[:, 0])
    np.subtract(rest, halves[:, 0] * _E8, out=halves[:, 1])
    np.floor_divide(halves, _E4, out=quarters[:, 1::2])
    np.subtract(halves, quarters[:, 1::2] * _E4, out=quarters[:, 2::2])
    ascii_digits = np.empty((n, 6), "<u4")
    ascii_digits[:, :5] = _DIGITS4[quarters]
    ascii_digits[:, 5] = _ZEROS4
    words = ascii_digits.view("<u8") & _SHOWN[shown]
    # The '.' spliced in: the bytes after it move one byte on, across the three words.
    kept = words & _BEFORE[point_at]
    moved = words ^ kept
    spliced = kept | (moved << _8) | _POINT[point_at]
    spliced[:, 1:] |= moved[:, :-1] >> _56

    rows = np.empty((n, 5), "<u8")
    rows[:, 0] = _PREFIX[prefix]
    rows[:, 1:4] = spliced
    rows[:, 4] = _SUFFIX[suffix]
    flat = rows.view(np.uint8).reshape(-1)
    return flat[flat != 0].tobytes()
