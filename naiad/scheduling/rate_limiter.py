"""Triton's rate limiter (``--rate-limit execution_count``): an instance runs only when the resources its
instance group names (``rate_limiter { resources [...] priority }``) are free, across every model of the server.

Resources are per device unless marked ``global``; their counts come from ``--rate-limit-resource
name:count[:device]``, else from the largest count any instance asks for (so every instance can run alone).
Among free instances the one with the lowest ``executions * priority`` goes first, as in Triton.
"""

from __future__ import annotations

import asyncio
from typing import Callable

from naiad.backends.base import Instance
from naiad.config import ModelConfig
from naiad.core.errors import invalid

Key = tuple[str, int]  # (resource name, device; -1 for global resources)


class _Needs:
    __slots__ = ("resources", "priority", "executions")

    def __init__(self, resources: dict[Key, int], priority: int) -> None:
        self.resources = resources
        self.priority = max(priority, 1)  # Triton reads 0 as 1
        self.executions = 0


class RateLimiter:
    def __init__(self, explicit: dict[tuple[str, int | None], int] | None = None) -> None:
        # name, device (None = every device) -> count given on the command line
        self._explicit = dict(explicit or {})
        self._total: dict[Key, int] = {}
        self._used: dict[Key, int] = {}
        self._needs: dict[int, _Needs] = {}
        self._waiting: dict[Callable[[], None], None] = {}  # an ordered set of schedulers to wake
        self._wake_pending = False

    @staticmethod
    def parse_resource(value: str) -> tuple[tuple[str, int | None], int]:
        """``name:count[:device]`` from ``--rate-limit-resource``."""
        parts = value.split(":")
        try:
            if len(parts) == 2:
                return (parts[0], None), int(parts[1])
            if len(parts) == 3:
                return (parts[0], int(parts[2])), int(parts[1])
        except ValueError:
            pass
        raise ValueError(f"--rate-limit-resource expects <name>:<count>[:<device>], got '{value}'")

    def register(self, config: ModelConfig, instances: list[Instance]) -> None:
        """Record what each instance of a loaded model needs; instances follow the config's groups in order."""
        groups = []
        for group in config.instance_group:
            groups.extend([group] * max(group.count, 1))
        for index, instance in enumerate(instances):
            group = groups[index] if index < len(groups) else None
            needs: dict[Key, int] = {}
            priority = 1
            if group is not None and group.HasField("rate_limiter"):
                device = group.gpus[0] if group.gpus else 0
                for res in group.rate_limiter.resources:
                    key = (res.name, -1 if getattr(res, "global") else device)
                    needs[key] = needs.get(key, 0) + res.count
                priority = group.rate_limiter.priority
            for key, count in needs.items():
                available = self._available(key)
                if available is not None and available < count:
                    raise invalid(
                        f'Resource count for "{key[0]}" is limited to {available} which will prevent scheduling of '
                        f"one or more model instances, the minimum required count is {count}"
                    )
                self._total[key] = max(self._total.get(key, 0), count) if available is None else available
            self._needs[id(instance)] = _Needs(needs, priority)

    def unregister(self, instances: list[Instance]) -> None:
        for instance in instances:
            self._needs.pop(id(instance), None)

    def _available(self, key: Key) -> int | None:
        name, device = key
        if (name, device) in self._explicit:
            return self._explicit[(name, device)]
        return self._explicit.get((name, None))

    def score(self, instance: Instance) -> int:
        needs = self._needs.get(id(instance))
        return 0 if needs is None else needs.executions * needs.priority

    def acquire(self, instance: Instance, wake: Callable[[], None] | None) -> bool:
        needs = self._needs.get(id(instance))
        if needs is None:
            return True
        for key, count in needs.resources.items():
            if self._used.get(key, 0) + count > self._total.get(key, 0):
                if wake is not None:
                    self._waiting[wake] = None
                return False
        for key, count in needs.resources.items():
            self._used[key] = self._used.get(key, 0) + count
        needs.executions += 1
        return True

    def release(self, instance: Instance) -> None:
        needs = self._needs.get(id(instance))
        if needs is None or not needs.resources:
            return
        for key, count in needs.resources.items():
            self._used[key] -= count
        if self._waiting and not self._wake_pending:
            # Wake on the next loop turn: a scheduler finishing an execution must not re-enter another one.
            self._wake_pending = True
            asyncio.get_running_loop().call_soon(self._wake)

    def _wake(self) -> None:
        self._wake_pending = False
        waiting, self._waiting = self._waiting, {}
        for wake in waiting:
            wake()
