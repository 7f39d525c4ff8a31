"""Connections as a budget: the descriptors the process may open, how many connections each listening port may
serve out of them, and one port's admission (a cap for the port, and one per client address).

Why: a server that accepts until ``accept()`` fails with EMFILE stops answering everyone at once (libuv then
accepts and drops pending connections: resets), while one that refuses past a cap it can afford answers the
excess with a clear refusal and keeps serving the rest. And a cap per address keeps one client from taking every
slot of a port. Used by the HTTP and SageMaker ports (``http/protocol.py``) and the lean gRPC engine
(``grpc/lean.py``); the grpcio engine gets the port cap as ``grpc.max_allowed_incoming_connections``.
"""

from __future__ import annotations

import logging
import resource

log = logging.getLogger("naiad")

# When the hard limit is unlimited, the soft one is raised this far (Linux's default fs.nr_open).
_UNLIMITED_TARGET = 1 << 20


def raise_nofile() -> int:
    """Raise the soft RLIMIT_NOFILE to the hard limit (as nginx's ``worker_rlimit_nofile`` and Go's runtime do:
    the soft 1024 of many shells is a leftover of select()); return the soft limit now in force."""
    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (OSError, ValueError):  # no such limit here
        return _UNLIMITED_TARGET
    target = _UNLIMITED_TARGET if hard == resource.RLIM_INFINITY else hard
    if soft == resource.RLIM_INFINITY or soft >= target:
        return _UNLIMITED_TARGET if soft == resource.RLIM_INFINITY else soft
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (OSError, ValueError):  # e.g. above fs.nr_open: keep what we have
        return soft
    return target


def reserve(nofile: int) -> int:
    """Descriptors kept out of the connection caps: model workers' pipes and shared memory, log and trace files,
    files read while loading, the metrics port, and connections being refused."""
    return min(1024, max(64, nofile // 4))


def port_cap(flag: int, nofile: int, ports: int) -> int:
    """One port's connection cap: the flag's (0: none), lowered so that every port at its cap still leaves the
    reserve free."""
    room = max(1, (nofile - reserve(nofile)) // max(1, ports))
    return room if flag <= 0 else min(flag, room)


# What ``Gate.admit`` answers for a refused connection.
PORT_FULL = "port"
ADDRESS_FULL = "address"


class Gate:
    """One listening port's admission: at most ``limit`` connections at once and at most ``per_address`` from
    one client address (0: no limit). ``refusing`` counts refused connections still open (their answer going
    out): past ``max_refusing`` of them, a refusal closes at once instead of lingering, so a flood of refused
    connections can't use up the descriptors either."""

    __slots__ = ("limit", "per_address", "open", "by_address", "refusing", "max_refusing")

    def __init__(self, limit: int = 0, per_address: int = 0, max_refusing: int = 64) -> None:
        self.limit = limit
        self.per_address = per_address
        self.open = 0
        self.by_address: dict[str, int] = {}
        self.refusing = 0
        self.max_refusing = max_refusing

    def admit(self, address: str | None) -> str | None:
        """None, and the connection counts, or why it is refused (``PORT_FULL`` / ``ADDRESS_FULL``)."""
        if 0 < self.limit <= self.open:
            return PORT_FULL
        if self.per_address and address is not None:
            held = self.by_address.get(address, 0)
            if held >= self.per_address:
                return ADDRESS_FULL
            self.by_address[address] = held + 1
        self.open += 1
        return None

    def release(self, address: str | None) -> None:
        self.open -= 1
        if self.per_address and address is not None:
            held = self.by_address.get(address, 0) - 1
            if held > 0:
                self.by_address[address] = held
            else:
                self.by_address.pop(address, None)


def peer_address(transport: object) -> str | None:
    """The client's address (IP without port), or None for a socket without one (a Unix socket)."""
    extra = getattr(transport, "get_extra_info", None)  # (fakes in tests may have none)
    peer = extra("peername") if extra is not None else None
    if isinstance(peer, tuple) and peer:
        return str(peer[0])
    return None


def gates(ports: dict[str, tuple[int, int]], nofile: int) -> dict[str, Gate]:
    """Each port's admission from its flags (name -> (--*-max-connections, --*-max-connections-per-address)) and
    the open-file limit; logs the caps the limit lowered."""
    n = len(ports)
    refusals = max(8, reserve(nofile) // (4 * max(1, n)))  # a quarter of the reserve for refusals under way
    made = {name: Gate(port_cap(cap, nofile, n), per_address, refusals) for name, (cap, per_address) in ports.items()}
    lowered = [f"{name} {made[name].limit}" for name, (cap, _) in ports.items() if made[name].limit != cap]
    if lowered:
        log.info("open file limit %d: connections per port lowered to fit it: %s (%d descriptors kept for the rest)",
                 nofile, ", ".join(lowered), reserve(nofile))
    return made
