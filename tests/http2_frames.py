"""HTTP/2 frames as bytes, for tests that feed a protocol core or a socket by hand (RFC 9113 §4.1)."""

from __future__ import annotations

import struct

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"  # the client's connection preface


def frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    return struct.pack(">I", len(payload))[1:] + bytes((kind, flags)) + struct.pack(">I", stream) + payload


def frames_of(data: bytes) -> list[tuple[int, int, int, bytes]]:
    """``data`` split into (type, flags, stream, payload)."""
    out = []
    while data:
        length = int.from_bytes(data[:3], "big")
        out.append((data[3], data[4], int.from_bytes(data[5:9], "big"), data[9:9 + length]))
        data = data[9 + length:]
    return out
