"""What a front-end process keeps of the model host's own (``remote.RemoteService``): the shared-memory registry as
the host tells it (regions registered and gone), and SageMaker's invocation counters, sent to the host's as they
change."""

from __future__ import annotations

import gc
import os
from typing import Any, Callable

from naiad.core.cache_stats import Timing
from naiad.core.shared_memory import Region, SharedMemoryRegistry, shm_open
from naiad.sagemaker.counters import EndpointStats
from naiad.service import wire


class SharedRegistry(SharedMemoryRegistry):
    """The host's registry, as one front end sees it: the host registers, checks, caps and answers status; it tells
    every front end of each region (``REGION``) before it answers the register, and of each that goes (``SHM``)
    before it answers the unregister. A front end opens a region itself, by its key, the first time a request
    names it here: nothing to ask the host then."""

    def __init__(self) -> None:
        super().__init__()
        self.known: dict[str, tuple[str, int, int]] = {}  # every region the host holds: key, offset, byte_size

    def learn(self, name: str, key: str, offset: int, byte_size: int) -> None:
        if self.known.get(name) != (key, offset, byte_size):
            self.forget([name])
        self.known[name] = (key, offset, byte_size)

    def attach(self, name: str, key: str, offset: int, byte_size: int) -> None:
        """Open a region the host registered, and checked: by its key, without checking its size again (one
        truncated since is refused at its read or write, in those words)."""
        if name in self.regions or shm_open is None:
            return
        try:
            fd = shm_open(key, os.O_RDWR, 0o600)
        except (OSError, ValueError):
            return  # gone since: "Unable to find shared memory region"
        self.regions[name] = Region(name, key, offset, byte_size, fd)

    def find(self, name: str, offset: int, byte_size: int) -> Any:
        if name not in self.regions:
            found = self.known.get(name)
            if found is not None:
                self.attach(name, *found)
        return super().find(name, offset, byte_size)

    def in_use(self, names: list[str] | None) -> list[str]:
        """Which of ``names`` (None: all) a request in this process holds."""
        held = [name for name in (list(self.regions) if names is None else names)
                if name in self.regions and self.regions[name].users]
        if held:
            gc.collect()  # a finished request's hold may wait in cyclic garbage
            held = [name for name in held if self.regions[name].users]
        return held

    def forget(self, names: list[str] | None) -> None:
        """Close this front end's copies of regions the host dropped (None: all)."""
        for name in list(self.regions) if names is None else names:
            region = self.regions.pop(name, None)
            if region is not None:
                region.close()
        if names is None:
            self.known.clear()
        else:
            for name in names:
                self.known.pop(name, None)


class _Timing(Timing):
    def __init__(self, changed: Callable[[], None]) -> None:
        super().__init__()
        self.changed = changed

    def add(self, seconds: float) -> None:
        super().add(seconds)
        self.changed()


class ForwardedStats(EndpointStats):
    """The SageMaker front end's counters in this process; each change is sent to the host's at the end of the
    loop's turn (before the client can ask /metrics), and these start again from zero."""

    def __init__(self, changed: Callable[[], None]) -> None:
        super().__init__(model_latency=_Timing(changed), overhead_latency=_Timing(changed))
        object.__setattr__(self, "changed", changed)

    def __setattr__(self, name: str, value: Any) -> None:
        object.__setattr__(self, name, value)
        changed = self.__dict__.get("changed")  # (None while the dataclass's __init__ sets the fields)
        if changed is not None and name in ("invocations", "errors_4xx", "errors_5xx"):
            changed()

    def take(self) -> tuple:
        """The counts since the last take, as a STATS message; zero again."""
        ml, ol = self.model_latency, self.overhead_latency
        message = (wire.STATS, self.invocations, self.errors_4xx, self.errors_5xx, ml.count, ml.sum_us, ol.count,
                   ol.sum_us)
        for name in ("invocations", "errors_4xx", "errors_5xx"):
            object.__setattr__(self, name, 0)
        ml.count = ol.count = 0
        ml.sum_us = ol.sum_us = 0.0
        return message
