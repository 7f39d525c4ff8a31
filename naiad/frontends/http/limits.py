"""What one HTTP/1.1 connection may hold and for how long, and how many connections one port serves.

Defaults and where they come from (Triton itself has none of these: its libevhtp server keeps idle and half-sent
connections open indefinitely and drops a request line or header line past ~8 KiB without an answer):

- requests in flight per connection: 128, nginx's ``http2_max_concurrent_streams`` (the HTTP/2 analogue of
  pipelined requests; nginx's HTTP/1.1 itself serves a pipeline one request at a time, uvicorn too).
- write buffer high-water mark: 64 KiB, asyncio's and uvloop's default, which uvicorn's flow control relies on.
- keep-alive timeout 75 s (nginx ``keepalive_timeout``): longer than the 60 s idle timeout of AWS load balancers,
  so the balancer, not naiad, closes a pooled connection (uvicorn's 5 s races clients that pool longer).
- header timeout 60 s (nginx ``client_header_timeout``), body timeout 60 s between two reads (nginx
  ``client_body_timeout``), send timeout 60 s while the client reads nothing (nginx ``send_timeout``).
- request line (URL) 8 KiB (nginx's 8k ``large_client_header_buffers``, Apache's ``LimitRequestLine`` 8190, where
  Triton stops answering); header fields 32 KiB in all (nginx's 4 x 8k buffers) and at most 100 of them (Apache's
  ``LimitRequestFields``, Python's ``http.server``).
- connections per port: 1024, the ``worker_connections`` of nginx's stock configuration.
"""

from __future__ import annotations

from dataclasses import dataclass

INF = float("inf")


@dataclass(frozen=True)
class HttpLimits:
    max_pipelined: int = 128  # requests read but not yet answered, per connection
    write_buffer: int = 64 * 1024  # bytes queued for the client before reading pauses
    keepalive_timeout: float = 75.0  # seconds; 0: never
    header_timeout: float = 60.0
    body_timeout: float = 60.0
    send_timeout: float = 60.0
    max_url_size: int = 8 * 1024
    max_header_size: int = 32 * 1024  # names and values of all header fields together
    max_header_count: int = 100
    max_connections: int = 1024  # per listening port; 0: no limit

    def __post_init__(self) -> None:
        for name in ("max_pipelined", "write_buffer", "max_url_size", "max_header_size", "max_header_count"):
            if getattr(self, name) < 1:
                raise ValueError(f"--http-{FLAGS[name]} must be at least 1, got {getattr(self, name)}")
        for name in ("keepalive_timeout", "header_timeout", "body_timeout", "send_timeout", "max_connections"):
            if getattr(self, name) < 0:
                raise ValueError(f"--http-{FLAGS[name]} must not be negative, got {getattr(self, name)}")

    def seconds(self, name: str) -> float:
        """A timeout as the protocol uses it: 0 (never) becomes infinity."""
        value = getattr(self, name)
        return value if value > 0 else INF

    @property
    def tick(self) -> float:
        """The longest a connection's timer sleeps: the shortest timeout in force, so a deadline set after the
        timer was armed can never fall before the timer fires (no re-arming per request)."""
        return min(self.seconds(n) for n in ("keepalive_timeout", "header_timeout", "body_timeout", "send_timeout"))


# field -> flag suffix (``--http-<suffix>``), for messages and the command line
FLAGS = {
    "max_pipelined": "max-pipelined-requests",
    "write_buffer": "write-buffer-size",
    "keepalive_timeout": "keepalive-timeout",
    "header_timeout": "header-timeout",
    "body_timeout": "body-timeout",
    "send_timeout": "send-timeout",
    "max_url_size": "max-url-size",
    "max_header_size": "max-header-size",
    "max_header_count": "max-header-count",
    "max_connections": "max-connections",
}

class Listener:
    """One listening port: its limits and how many connections it serves now (admitted ones only)."""

    __slots__ = ("limits", "open")

    def __init__(self, limits: HttpLimits | None = None) -> None:
        self.limits = limits or HttpLimits()
        self.open = 0

    def admit(self) -> bool:
        if 0 < self.limits.max_connections <= self.open:
            return False
        self.open += 1
        return True

    def release(self) -> None:
        self.open -= 1
