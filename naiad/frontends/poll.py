"""The event loop keeps polling for a moment after an answer, rather than sleeping at once (``--idle-poll-us``).

At one connection a server sleeps between its answer and the client's next request. A sleeping core halts, and
waking it (an interrupt, often a virtual machine exit, the scheduler, then caches and branch predictors refilled)
costs more CPU than naiad's whole work on a small request: measured on a 2-core VM with add_sub, 250 µs of CPU per
request at one connection against 110 µs at eight, for the same Python work. So once an answer has left and
nothing is in flight, the loop keeps polling (a handle that queues itself again, so each turn of the loop polls
with a zero timeout) until a request arrives, one is in flight again, or the window closes. Nothing polls while a
request is in flight: a Python worker or the model host may need this very core.

The window adapts as the Linux guest's halt-polling does: it starts at a quarter of the maximum, doubles (up to
the maximum) when a request came after the window closed but within the maximum, and halves (to nothing below
the start) when one came later than the maximum. A client that pauses between requests costs no polling; a busy
server polls, if at all, between answers it sends while no request is in flight.

Under a CPU quota (``docker run --cpus``, a Kubernetes limit) polling is paid from the quota, and a cgroup that
runs out of it stops until its next period: at one connection and half a CPU, polling cost 5-10 % of the
requests served. So where a quota applies, the poll reads the cgroup's ``cpu.stat`` once a period, and stays off for
a second after any period the cgroup was throttled in (when CPU, not waking, is what runs short).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from pathlib import Path

from naiad.core import cores

DEFAULT_US = 200  # the Linux guest halt-polling default (guest_halt_poll_ns)
CHECK_NS = 100_000_000  # how often cpu.stat is read under a quota: the CFS period's default
HOLD_NS = 1_000_000_000  # polling stays off this long after a period the cgroup was throttled in

_now = time.perf_counter_ns
log = logging.getLogger("naiad")


class IdlePoll:
    def __init__(self, max_us: int = DEFAULT_US) -> None:
        self._window(max_us)
        self.busy: Callable[[], int] | None = None  # requests in flight, process-wide; None: never poll
        self.idle_since = 0  # when the last answer left with nothing in flight (0: not idle)
        self.deadline = 0
        self.polling = False
        self.quota: Path | None = None  # the cgroup holding this process to a CPU quota (found by configure)
        self.throttled = 0  # its cpu.stat's nr_throttled, when last read
        self.check_at = 0  # when to read it again
        self.off_until = 0  # no polling before this (the cgroup was throttled lately)

    def configure(self, max_us: int, quota: Path | None = None) -> None:
        """The window's maximum, and the cgroup of a CPU quota to watch: ``quota``, or by default the one
        ``/proc/self/cgroup`` leads to (none where no quota applies, and then nothing is read)."""
        self._window(max_us)
        self.quota = (quota or cores.quota_cgroup()) if self.max_ns else None
        count = cores.throttled(self.quota) if self.quota is not None else None
        if count is None:
            self.quota = None
        else:
            self.throttled = count

    def _window(self, max_us: int) -> None:
        self.max_ns = max(0, max_us) * 1000
        self.start_ns = self.max_ns // 4
        self.window_ns = self.start_ns

    def watch(self, in_flight: Callable[[], int]) -> None:
        """Poll after answers, while ``in_flight()`` (the service's requests in flight) is 0."""
        self.busy = in_flight

    def answered(self, loop: asyncio.AbstractEventLoop | None) -> None:
        """An answer went out: poll if nothing else is in flight."""
        busy = self.busy
        if busy is None or loop is None or busy():
            return
        now = self.idle_since = _now()
        if self.window_ns and ((quota := self.quota) is None or not self._short_of_cpu(now, quota)):
            self.deadline = now + self.window_ns
            if not self.polling:
                self.polling = True
                loop.call_soon(self._poll, loop)

    def arrived(self) -> None:
        """Bytes came from a client: the window learns how long the server was idle."""
        since = self.idle_since
        if not since:
            return
        self.idle_since = 0
        idle = _now() - since
        window = self.window_ns
        if idle <= window:
            return
        if idle <= self.max_ns:  # a longer window would have caught it
            self.window_ns = min(self.max_ns, max(window * 2, self.start_ns))
        elif window:  # polling was wasted: the client pauses longer than any window
            window //= 2
            self.window_ns = window if window >= self.start_ns else 0

    def _short_of_cpu(self, now: int, quota: Path) -> bool:
        """The cgroup ran out of its quota in a period less than ``HOLD_NS`` ago (cpu.stat read once a period)."""
        if now >= self.check_at:
            self.check_at = now + CHECK_NS
            count = cores.throttled(quota)
            if count is None:  # (gone: nothing more to read)
                self.quota = None
                return False
            if count > self.throttled:
                if now >= self.off_until:  # (said once per pause, not at every read that extends it)
                    log.debug("idle polling paused: cgroup %s ran out of its CPU quota (%d periods throttled)",
                              quota, count)
                self.off_until = now + HOLD_NS
            self.throttled = count
        return now < self.off_until

    def _poll(self, loop: asyncio.AbstractEventLoop) -> None:
        if _now() < self.deadline and not self.busy():  # type: ignore[misc]
            loop.call_soon(self._poll, loop)
        else:
            self.polling = False


POLL = IdlePoll()  # one per process: its one event loop serves every front end
