"""What header forwarding needs from the HTTP/1.1 protocol: each header's name as the client spelled it.

Triton hands a forwarded header to the model under the name it arrived with (``X-Request-Tag``, not
``x-request-tag``), while routing looks names up in lower case. This protocol keeps both; the server uses it only
when ``--http-header-forward-pattern`` is set, so the usual protocol does no extra work per header.
"""

from __future__ import annotations

from naiad.frontends.http.protocol import HttpProtocol


class NamedHeaders(dict):
    """Lower-case names -> values, as everywhere, plus ``raw``: the (name, value) pairs as received."""

    __slots__ = ("raw",)

    def __init__(self) -> None:
        super().__init__()
        self.raw: list[tuple[bytes, bytes]] = []


class NamedHeadersProtocol(HttpProtocol):
    def on_message_begin(self) -> None:
        super().on_message_begin()
        self.headers = NamedHeaders()

    def on_header(self, name: bytes, value: bytes) -> None:
        super().on_header(name, value)  # stores and counts it (header limits)
        self.headers.raw.append((name, value))  # type: ignore[attr-defined]
