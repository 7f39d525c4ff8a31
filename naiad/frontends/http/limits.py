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
- connections per port: 1024, the ``worker_connections`` of nginx's stock configuration, lowered at start so
  that all ports together fit the open-file limit (``naiad/frontends/connections.py``); per client address: 256
  (a quarter of that), so one address can't take a port's every slot (nginx's ``limit_conn`` by address).
- first request 10 s: a new connection that sends no complete request head in that time is closed (HAProxy's
  ``timeout http-request`` 10 s), so idle sockets can't hold slots for the 75 s a pooled keep-alive one may.
"""

from __future__ import annotations

from dataclasses import dataclass

from naiad.frontends.connections import Gate

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
    max_connections: int = 1024  # per listening port; 0: no limit (but the open-file limit's)
    max_connections_per_address: int = 256  # per listening port and client address; 0: no limit
    first_request_timeout: float = 10.0  # a new connection's first request head; 0: as the other timeouts

    def __post_init__(self) -> None:
        for name in ("max_pipelined", "write_buffer", "max_url_size", "max_header_size", "max_header_count"):
            if getattr(self, name) < 1:
                raise ValueError(f"--http-{FLAGS[name]} must be at least 1, got {getattr(self, name)}")
        for name in ("keepalive_timeout", "header_timeout", "body_timeout", "send_timeout", "max_connections",
                     "max_connections_per_address", "first_request_timeout"):
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
        return min(self.seconds(n) for n in ("keepalive_timeout", "header_timeout", "body_timeout", "send_timeout",
                                             "first_request_timeout"))


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
    "max_connections_per_address": "max-connections-per-address",
    "first_request_timeout": "first-request-timeout",
}

class Listener:
    """One listening port: its limits and its admission (``gate``: the connections it serves now, by address).
    ``gate`` comes with the port's cap as the open-file limit lowered it; by default, the flags' caps."""

    __slots__ = ("limits", "gate")

    def __init__(self, limits: HttpLimits | None = None, gate: Gate | None = None) -> None:
        self.limits = limits = limits or HttpLimits()
        self.gate = gate or Gate(limits.max_connections, limits.max_connections_per_address)
