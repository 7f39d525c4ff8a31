"""The tensors' bytes of a big ModelInfer message, kept out of protobuf.

Why: protobuf copies every ``bytes`` field when it parses (Python holds its own ``bytes`` objects) and again when it
serializes, and the answer's arrays are copied into ``bytes`` before that; for a 16 MiB tensor those copies cost more
than the rest of the call. So a big request is split here: its ``raw_input_contents`` (field 7) become read-only
views of the received bytes, and protobuf parses only the rest (names, shapes, parameters: a few hundred bytes).
A big answer is serialized without ``raw_output_contents`` and its arrays follow as field 6 (the last field, so the
bytes are the ones protobuf would write), handed to the transport as they are.

Only the message's top level is walked: each field's tag and length, as the protobuf encoding defines them
(https://protobuf.dev/programming-guides/encoding/); everything but field 7 is handed to protobuf unchanged and in
order, so its rules (last value wins, unknown fields, wrong wire types) still decide. What can't be walked raises
``ValueError``, which callers answer as they answer protobuf's own parse errors.
"""

from __future__ import annotations

from collections.abc import Sequence

# A message at least this large is split (below it protobuf's copies cost less than walking it in Python).
SPLIT = 65536

_RAW_INPUT = (7 << 3) | 2  # raw_input_contents: field 7, length-delimited
_RAW_OUTPUT_TAG = bytes(((6 << 3) | 2,))  # raw_output_contents: field 6, length-delimited


def _varint(data: memoryview, pos: int, end: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= end or shift > 63:
            raise ValueError("truncated or overlong varint")
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7


def split_request(data: memoryview) -> tuple[bytes, list[memoryview]]:
    """The message without its raw_input_contents, and those contents as read-only views of ``data``, in order."""
    raw: list[memoryview] = []
    rest: list[memoryview] = []
    pos, end = 0, len(data)
    kept = 0  # the start of the run of fields handed to protobuf
    while pos < end:
        start = pos
        tag, pos = _varint(data, pos, end)
        kind = tag & 7
        if kind == 2:
            length, pos = _varint(data, pos, end)
            if length > end - pos:
                raise ValueError("a field runs past the message")
            if tag == _RAW_INPUT:
                if start > kept:
                    rest.append(data[kept:start])
                raw.append(data[pos:pos + length].toreadonly())
                kept = pos + length
            pos += length
        elif kind == 0:
            _, pos = _varint(data, pos, end)
        elif kind == 1:
            pos += 8
        elif kind == 5:
            pos += 4
        else:  # groups (3, 4) and 6-7 do not occur in this message: protobuf judges them
            return bytes(data), []
        if pos > end:
            raise ValueError("a field runs past the message")
    if kept < end:
        rest.append(data[kept:end])
    return b"".join(rest), raw


def varint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def response_tail(raw: Sequence[bytes | memoryview]) -> list[bytes | memoryview]:
    """``raw_output_contents`` on the wire: for each buffer its tag and length, then the buffer itself."""
    out: list[bytes | memoryview] = []
    for buffer in raw:
        out.append(_RAW_OUTPUT_TAG + varint(len(buffer)))
        if len(buffer):
            out.append(buffer)
    return out
