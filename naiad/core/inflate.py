"""Bounded decompression of request bodies (gzip, deflate) for every front end.

A few hundred kilobytes of gzip can expand to gigabytes, so no body is decompressed in one call: zlib is asked for
at most one byte more than the limit, and a body that would give more is refused having cost the limit, not
the expansion.
"""

from __future__ import annotations

import zlib

GZIP = 31  # zlib's wbits for the gzip format
DEFLATE = 15  # the zlib format, which HTTP's and grpc's "deflate" mean


class TooLarge(Exception):
    """The body expands to more than the limit."""


def inflate(data: bytes | bytearray | memoryview, wbits: int, limit: int, members: bool = False) -> bytes:
    """``data`` decompressed, at most ``limit`` bytes of it (else ``TooLarge``). Raises ``zlib.error`` for a corrupt
    or truncated stream. ``members``: gzip's concatenated members (zero padding between them allowed), as
    ``gzip.decompress`` reads them; else bytes after the end of the stream are ignored, as ``zlib.decompress``
    ignores them."""
    parts: list[bytes] = []
    room = limit
    while True:
        inflater = zlib.decompressobj(wbits)
        part = inflater.decompress(data, room + 1)
        if len(part) > room:
            raise TooLarge
        room -= len(part)
        parts.append(part)
        if not inflater.eof:
            raise zlib.error("incomplete or truncated stream")
        if not members:
            break
        data = inflater.unused_data.lstrip(b"\0")
        if not data:
            break
    return parts[0] if len(parts) == 1 else b"".join(parts)
