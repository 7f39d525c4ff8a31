"""Bounded decompression: what comes out, where the limit falls, and what a broken stream raises."""

from __future__ import annotations

import gzip
import os
import zlib

import pytest

from naiad.core.inflate import _STEP, DEFLATE, GZIP, TooLarge, inflate
from tests.reliability.bombs import bomb

RANDOM = os.urandom(_STEP + 4096)  # incompressible: more input than one step's output


@pytest.mark.parametrize("n", [0, 1, 5, _STEP - 1, _STEP, _STEP + 1, 3 * _STEP])
@pytest.mark.parametrize(("wbits", "pack", "members"), [(DEFLATE, zlib.compress, False), (GZIP, gzip.compress, True),
                                                        (GZIP, gzip.compress, False)])
def test_the_limit_is_inclusive(n: int, wbits: int, pack, members: bool) -> None:  # type: ignore[no-untyped-def]
    data = pack(b"\1" * n)
    assert inflate(data, wbits, n, members) == b"\1" * n
    if n:
        with pytest.raises(TooLarge):
            inflate(data, wbits, n - 1, members)


@pytest.mark.parametrize(("data", "wbits", "members", "expected"), [
    (gzip.compress(b"abc") + gzip.compress(b"def"), GZIP, True, b"abcdef"),  # gzip members, as gzip.decompress
    (gzip.compress(b"abc") + b"\0\0", GZIP, True, b"abc"),  # zero padding after a member
    (gzip.compress(b"abc") + b"junk", GZIP, False, b"abc"),  # bytes past the end ignored, as zlib.decompress
    (zlib.compress(b"x" * 5_000_000), DEFLATE, False, b"x" * 5_000_000),
    (gzip.compress(RANDOM, 1) + gzip.compress(RANDOM, 1), GZIP, True, RANDOM + RANDOM),
], ids=["members", "padding", "trailing", "large", "incompressible"])
def test_output_matches_the_standard_library(data: bytes, wbits: int, members: bool, expected: bytes) -> None:
    assert inflate(data, wbits, 64 << 20, members) == expected


@pytest.mark.parametrize(("data", "wbits", "members"), [
    (gzip.compress(b"abc") + b"junk", GZIP, True),
    (gzip.compress(b"abc")[:-3], GZIP, True),
    (zlib.compress(b"x" * 5_000_000)[:-10], DEFLATE, False),
    (zlib.compress(RANDOM, 1)[:-5], DEFLATE, False),
    (gzip.compress(RANDOM, 1)[:1000], GZIP, False),
    (b"nope", DEFLATE, False),
], ids=["junk-member", "cut-trailer", "cut-large", "cut-incompressible", "cut-early", "not-zlib"])
def test_a_broken_stream_is_a_zlib_error(data: bytes, wbits: int, members: bool) -> None:
    with pytest.raises(zlib.error):
        inflate(data, wbits, 64 << 20, members)


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
def test_a_bomb_stops_at_the_limit(encoding: str) -> None:
    with pytest.raises(TooLarge):
        inflate(bomb(encoding, 100), GZIP if encoding == "gzip" else DEFLATE, 8 << 20)
