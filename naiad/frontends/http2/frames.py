"""HTTP/2's wire constants (RFC 9113 sections 6, 7, 11) and the few encoders a server needs to answer: frames,
and HPACK header fields that need no encoder state (RFC 7541: static-table references and literals without
indexing), so response blocks can be prebuilt bytes."""

from __future__ import annotations

import struct

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

# Frame types (RFC 9113 section 6).
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = range(10)

# Flags.
END_STREAM = ACK = 0x1
END_HEADERS = 0x4
PADDED = 0x8
PRIORITY_FLAG = 0x20

# Settings (RFC 9113 section 6.5.2).
HEADER_TABLE_SIZE, ENABLE_PUSH, MAX_CONCURRENT_STREAMS, INITIAL_WINDOW_SIZE, MAX_FRAME_SIZE, MAX_HEADER_LIST_SIZE = \
    range(1, 7)

# Error codes (RFC 9113 section 7).
NO_ERROR = 0x0
PROTOCOL_ERROR = 0x1
INTERNAL_ERROR = 0x2
FLOW_CONTROL_ERROR = 0x3
SETTINGS_TIMEOUT = 0x4
STREAM_CLOSED = 0x5
FRAME_SIZE_ERROR = 0x6
REFUSED_STREAM = 0x7
CANCEL = 0x8
COMPRESSION_ERROR = 0x9
CONNECT_ERROR = 0xA
ENHANCE_YOUR_CALM = 0xB
INADEQUATE_SECURITY = 0xC
HTTP_1_1_REQUIRED = 0xD

MAX_WINDOW = 2**31 - 1  # the largest flow-control window and the stream-id mask
DEFAULT_WINDOW = 65535
DEFAULT_MAX_FRAME = 16384  # also the smallest SETTINGS_MAX_FRAME_SIZE a peer may announce
LARGEST_MAX_FRAME = 2**24 - 1

HEAD = struct.Struct(">BHBBI")  # length (24 bits as 8 + 16), type, flags, stream id
_U32 = struct.Struct(">I")
_U32X2 = struct.Struct(">II")
_SETTING = struct.Struct(">HI")


def frame(kind: int, flags: int, stream: int, payload: bytes) -> bytes:
    n = len(payload)
    return HEAD.pack(n >> 16, n & 0xFFFF, kind, flags, stream) + payload


def rst_stream(stream: int, code: int) -> bytes:
    return frame(RST_STREAM, 0, stream, _U32.pack(code))


def window_update(stream: int, increment: int) -> bytes:
    return frame(WINDOW_UPDATE, 0, stream, _U32.pack(increment))


def goaway(last_stream: int, code: int, debug: bytes = b"") -> bytes:
    return frame(GOAWAY, 0, 0, _U32X2.pack(last_stream, code) + debug)


def settings(*pairs: tuple[int, int]) -> bytes:
    return frame(SETTINGS, 0, 0, b"".join(_SETTING.pack(key, value) for key, value in pairs))


def hpack_integer(value: int, prefix_bits: int, first: int = 0) -> bytes:
    """An HPACK integer (RFC 7541 section 5.1) whose first byte carries ``first`` above the prefix."""
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes((first | value,))
    out = bytearray((first | limit,))
    value -= limit
    while value >= 128:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def literal(name: bytes, value: bytes) -> bytes:
    """A header field as a literal without indexing, new name, no Huffman (RFC 7541 section 6.2.2)."""
    return b"\x00" + hpack_integer(len(name), 7) + name + hpack_integer(len(value), 7) + value


def literal_indexed_name(index: int, value: bytes) -> bytes:
    """A literal without indexing whose name is the static table's entry ``index``."""
    return hpack_integer(index, 4) + hpack_integer(len(value), 7) + value


def leaves_table(block: bytes) -> bool:
    """Whether decoding a (valid) HPACK block leaves the dynamic table as it is (RFC 7541 section 6): it holds only
    indexed fields and literals without or never indexing, no literal with incremental indexing and no table size
    update. Such a block decodes to the same fields again until another block changes the table. Clients repeat
    one per call: grpc-core indexes every field, nghttp2 (h2load) sends :path as a literal without indexing."""
    i, n = 0, len(block)
    try:
        while i < n:
            first = block[i]
            if first & 0x80:  # indexed field: a 7-bit-prefix index
                i = _integer_end(block, i, 0x7F)
            elif first & 0x60:  # literal with incremental indexing (01), or a table size update (001)
                return False
            else:  # literal without (0000) or never (0001) indexing: a 4-bit-prefix name index, 0 = literal name
                name_literal = not first & 0x0F
                i = _integer_end(block, i, 0x0F)
                if name_literal:
                    i = _string_end(block, i)
                i = _string_end(block, i)
    except IndexError:  # truncated: not a block to keep
        return False
    return i == n


def _integer_end(block: bytes, i: int, mask: int) -> int:
    if block[i] & mask != mask:
        return i + 1
    i += 1
    while block[i] & 0x80:
        i += 1
    return i + 1


def _string_end(block: bytes, i: int) -> int:
    length = block[i] & 0x7F  # the high bit is the Huffman flag
    i += 1
    if length == 0x7F:
        shift = 0
        while True:
            byte = block[i]
            i += 1
            length += (byte & 0x7F) << shift
            shift += 7
            if not byte & 0x80:
                break
    return i + length
