"""What a web page may not make a browser do to a naiad port: change the server's state.

Two checks, on the routes that change state only (repository load / unload, shared-memory register / unregister,
log and trace settings, SageMaker's multi-model load and unload; the dashboard's buttons call these routes):

- **DNS rebinding.** A page on ``evil.example`` whose name later resolves to 127.0.0.1 talks to naiad as its own
  origin. The ``Host`` header still says ``evil.example``: it must be an IP address, ``localhost``, this machine's
  name, or a name the operator allows (``--http-allowed-hosts``; ``*`` turns the check off).
- **Cross-site "simple" requests.** A browser sends a POST with ``Content-Type: text/plain`` (or a form type) to any
  origin without asking first. A request whose ``Origin`` is not the server it reaches must carry
  ``Content-Type: application/json``, for which browsers ask first (CORS preflight), and naiad never says yes.

Clients that are not browsers (tritonclient, curl, boto3) send no ``Origin`` and reach the server by address or
``localhost``: unaffected. The inference routes are not checked at all.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Iterable
from functools import lru_cache

FLAG = "--http-allowed-hosts"
_DEFAULT_PORTS = {"http": "80", "https": "443"}


def machine_names() -> frozenset[str]:
    """``localhost`` and this machine's host name (no DNS: that can stall where resolvers are unreachable)."""
    return frozenset(n for n in ("localhost", _normal(socket.gethostname())) if n)


@lru_cache(maxsize=1)
def _fqdn() -> str:
    """This machine's fully qualified name, looked up once, and only for a Host that nothing else admits."""
    try:
        return _normal(socket.getfqdn())
    except OSError:
        return ""


def _normal(name: str) -> str:
    return name.strip().lower().rstrip(".")


def split_host(value: str) -> tuple[str, str] | None:
    """A ``Host`` value as (name, port); port "" when absent; None when it isn't a host at all."""
    value = value.strip().lower()
    if value.startswith("["):  # an IPv6 literal
        end = value.find("]")
        if end < 0:
            return None
        name, rest = value[1:end], value[end + 1:]
        if rest and not (rest[0] == ":" and rest[1:].isdigit()):
            return None
        return name, rest[1:]
    name, colon, port = value.partition(":")
    if colon and not port.isdigit():
        return None
    return name.rstrip("."), port


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


class BrowserGuard:
    """The two checks, for one port. ``allowed``: the operator's extra host names (``*``: any host)."""

    __slots__ = ("any_host", "names")

    def __init__(self, allowed: Iterable[str] = ()) -> None:
        allowed = [_normal(name) for name in allowed]
        self.any_host = "*" in allowed
        self.names = frozenset(allowed) | machine_names()

    def known_host(self, name: str) -> bool:
        return name in self.names or name.endswith(".localhost") or _is_ip(name) or name == _fqdn()

    def refusal(self, headers: dict[bytes, bytes]) -> str | None:
        """Why a state-changing request is one a browser was made to send (the front end answers 403); None to
        serve it."""
        raw_host = headers.get(b"host")
        host = split_host(raw_host.decode("latin-1")) if raw_host is not None else None
        if raw_host is not None and not self.any_host and (host is None or not self.known_host(host[0])):
            return (
                f"Host '{raw_host.decode('latin-1')}' is not a name of this server: requests that change the "
                f"server's state are refused for other names (DNS rebinding). Reach the server by its address, "
                f"localhost or its host name, or allow the name with {FLAG}=NAME ('*' allows any)")
        origin = headers.get(b"origin")
        if origin is None or _json(headers.get(b"content-type")) or _same_origin(origin, host):
            return None
        return (
            f"cross-origin request refused: Origin '{origin.decode('latin-1')}' is not this server and the body "
            "is not 'Content-Type: application/json'. Requests that change the server's state from another "
            "origin must be sent as application/json (without a browser: send no Origin header)")


def _json(content_type: bytes | None) -> bool:
    if content_type is None:
        return False
    media = content_type.split(b";", 1)[0].strip().lower()
    return media == b"application/json" or (media.startswith(b"application/") and media.endswith(b"+json"))


def _same_origin(origin: bytes, host: tuple[str, str] | None) -> bool:
    """The Origin names the host and port the request reached (its Host); "null" never does."""
    if host is None:
        return False
    scheme, sep, rest = origin.decode("latin-1").strip().lower().partition("://")
    if not sep or "/" in rest:
        return False
    parsed = split_host(rest)
    if parsed is None:
        return False
    default = _DEFAULT_PORTS.get(scheme, "")
    return parsed[0] == host[0] and (parsed[1] or default) == (host[1] or default)
