"""Bounded decompression of request bodies (gzip, deflate) for every front end.

A few hundred kilobytes of gzip can expand to gigabytes, so zlib is never asked for more than one byte past the
limit: a body that would give more is refused having cost the limit, not the expansion.
"""

from __future__ import annotations

import zlib

GZIP = 31  # zlib's wbits for the gzip format
DEFLATE = 15  # the zlib format, which HTTP's and grpc's "deflate" mean


class TooLarge(Exception):
    """The body expands to more than the limit."""


def inflate(data: bytes | bytearray | memoryview, wbits: int, limit: int, members: bool = False) -> bytes | bytearray:
    """``data`` decompressed, at most ``limit`` bytes of it (else ``TooLarge``). Raises ``zlib.error`` for a corrupt
    or truncated stream. ``members``: gzip's concatenated members (zero padding between them allowed), as
    ``gzip.decompress`` reads them; else bytes after the end of the stream are ignored, as ``zlib.decompress``
    ignores them.

    Small bodies come out of one call; larger ones are gathered a step at a time into one buffer, so the peak is
    about the output itself (zlib's own output for one large call is built in blocks and then joined: twice that).
    """
    inflater = zlib.decompressobj(wbits)
    want = min(limit + 1, _STEP)
    out = inflater.decompress(data, want)
    if inflater.eof and not members and len(out) <= limit:
        return out  # the common case: a small message, done in one call
    buffer = bytearray(out)
    got = len(out)
    while True:
        if len(buffer) > limit:
            raise TooLarge
        if inflater.eof:
            data = inflater.unused_data.lstrip(b"\0") if members else b""
            if not data:
                return buffer
            inflater = zlib.decompressobj(wbits)  # gzip's next member
        else:
            data = inflater.unconsumed_tail
            if not data and got < want:  # all input read, no output pending, and no end of stream
                raise zlib.error("incomplete or truncated stream")
        want = min(limit + 1 - len(buffer), _STEP)
        out = inflater.decompress(data, want)
        got = len(out)
        buffer += out


_STEP = 1 << 20  # bytes of output per call once a body is larger
