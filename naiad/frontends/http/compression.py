"""Content-Encoding of request bodies and Accept-Encoding of replies: gzip and deflate, as Triton offers."""

from __future__ import annotations

import gzip
import zlib
from typing import TYPE_CHECKING, Callable

from naiad.core.errors import InferError, invalid, Code

if TYPE_CHECKING:
    from naiad.frontends.http.routes import Reply


def decompress(body: bytes | bytearray, encoding: bytes) -> bytes | bytearray:
    kind = encoding.strip().lower()
    if kind in (b"", b"identity"):
        return body
    try:
        if kind == b"gzip":
            return gzip.decompress(body)
        if kind == b"deflate":
            return zlib.decompress(body)
    except (OSError, EOFError, zlib.error) as exc:
        raise invalid(f"failed to decompress the request body ({kind.decode()}): {exc}") from None
    raise InferError("Unsupported compression type", Code.UNSUPPORTED)


def compress(reply: "Reply", accept: bytes) -> "Reply":
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
