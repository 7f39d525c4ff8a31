"""Ports picked for servers naiad starts itself (``naiad recommend``'s variants, Ray's gRPC ingress) and for the
tests' servers: the kernel's ephemeral ports, or where ``NAIAD_PORT_RANGE=LOW-HIGH`` is set (a firewall that opens
only some ports, a machine shared with other runs), a free port in that range.

In a range, a port is free when it binds; the search starts at a random port of the range, so that runs side by
side rarely try the same ones first, and this process never hands out one port twice while others are left.
"""

from __future__ import annotations

import os
import random
import socket

ENV = "NAIAD_PORT_RANGE"

_given: set[int] = set()  # handed out by this process (the caller binds it later: a bind test can't see it)


def port_range(text: str | None = None) -> tuple[int, int] | None:
    """``LOW-HIGH`` (inclusive) from ``text``, else from NAIAD_PORT_RANGE; None when unset. ValueError names the
    variable when it is malformed."""
    value = os.environ.get(ENV, "") if text is None else text
    if not value.strip():
        return None
    low, sep, high = value.strip().partition("-")
    try:
        first, last = int(low), int(high)
    except ValueError:
        first = last = -1
    if not sep or not 1024 <= first <= last <= 65535:
        raise ValueError(f"{ENV} must be LOW-HIGH, two ports from 1024 to 65535 with LOW <= HIGH, not '{value}'")
    return first, last


def free_port(address: str = "127.0.0.1") -> int:
    """A port nothing is bound to on ``address`` now: from NAIAD_PORT_RANGE when it is set, else the kernel's."""
    span = port_range()
    if span is None:
        with socket.socket() as probe:
            probe.bind((address, 0))
            return int(probe.getsockname()[1])
    first, last = span
    count = last - first + 1
    start = random.randrange(count)
    for fresh in (True, False):  # ports not handed out yet first; then any that binds
        for offset in range(count):
            port = first + (start + offset) % count
            if fresh and port in _given:
                continue
            with socket.socket() as probe:
                try:
                    probe.bind((address, port))
                except OSError:
                    continue
            _given.add(port)
            return port
    raise OSError(f"no free port in {ENV}={first}-{last} on {address or 'every address'}")
