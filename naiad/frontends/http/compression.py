"""Content-Encoding of request bodies and Accept-Encoding of replies: gzip and deflate, as Triton offers."""

from __future__ import annotations

import gzip
import zlib
from typing import Callable

from naiad.core.errors import InferError, invalid, Code
from naiad.core.inflate import DEFLATE, GZIP, TooLarge, inflate
from naiad.frontends.replies import Reply


def decompress(body: bytes | bytearray, encoding: bytes, limit: int) -> bytes | bytearray:
    """The body as the client encoded it, decompressed to at most ``limit`` bytes (``--http-max-input-size``, which
    bounds what a body expands to as it bounds the body itself)."""
    kind = encoding.strip().lower()
    if kind in (b"", b"identity"):
        return body
    if kind not in (b"gzip", b"deflate"):
        raise InferError("Unsupported compression type", Code.UNSUPPORTED)
    try:
        return inflate(body, GZIP, limit, members=True) if kind == b"gzip" else inflate(body, DEFLATE, limit)
    except TooLarge:
        message = (f"decompressed request body size exceeds the maximum allowed value of {limit} bytes. Use "
                   "--http-max-input-size to increase the limit.")
    except zlib.error as exc:
        message = f"failed to decompress the request body ({kind.decode()}): {exc}"
    raise invalid(message)  # outside the handlers: the failed body is not kept alive by a chained traceback


def compress(reply: Reply, accept: bytes) -> Reply:
    """Compress a reply the client said it accepts; gzip first, as Triton prefers it."""
    accepted = {token.split(b";")[0].strip().lower() for token in accept.split(b",")}
    pack: Callable[[bytes], bytes]
    if b"gzip" in accepted:
        name, pack = b"gzip", gzip.compress
    elif b"deflate" in accepted:
        name, pack = b"deflate", zlib.compress
    else:
        return reply
    body = reply.body if isinstance(reply.body, (bytes, bytearray)) else b"".join(bytes(c) for c in reply.body)
    reply.body = pack(body)
    reply.headers = [*(reply.headers or []), (b"Content-Encoding", name)]
    return reply
