"""Which loaded model a memory-bounded model cache unloads first.

Two policies behind one small interface, keyed by model name:

``gdsf``  the default: GreedyDual-Size-Frequency's priority, ``frequency x load cost / size``; the model with the
          lowest goes first. Load cost is the time the model took to load (download, extraction and start),
          smoothed over its loads; size is the memory it holds, measured when a victim is chosen. The frequency
          counts a model's requests, each weighted by how recent it is (it halves every ``half_life`` requests
          to the cache): that is what ages a model whose popularity has passed. GDSF's own aging, an inflation
          value ``L`` added to a model's priority when it is used, behaves like recency and cost 0.02 to 0.05 of
          the optimum on Zipf traces (``benchmarks/sagemaker_mme.py --simulate`` shows it as
          ``gdsf-L``). A model's history outlives its eviction, so a model that comes back is judged on all its
          requests, as TinyLFU's admission does, and is forgotten once what is left of it is negligible.
``lru``   least recently used.

Per request the cache pays one dictionary update (``access``); priorities are computed only when a victim is
chosen.
"""

from __future__ import annotations

import math
from typing import Iterable

POLICIES = ("gdsf", "lru")
DEFAULT_POLICY = "gdsf"


class EvictionPolicy:
    """``admit`` when a model has loaded, ``access`` on every request it serves, ``priority`` when a victim is
    chosen (the lowest goes first), ``removed`` once it is unloaded."""

    name = ""
    describes = ""  # why a victim was chosen, for the log

    def admit(self, name: str, cost: float) -> None:
        """``name`` loaded, taking ``cost`` seconds."""

    def access(self, name: str) -> None:
        """A request for the loaded model ``name``."""

    def priority(self, name: str, size: int) -> float:
        raise NotImplementedError

    def removed(self, name: str) -> None:
        """``name`` was unloaded."""

    def victim(self, candidates: Iterable[tuple[str, int]]) -> str:
        """Of (name, size) pairs, the name to unload first."""
        return min(candidates, key=lambda c: self.priority(*c))[0]


class LruPolicy(EvictionPolicy):
    name = "lru"
    describes = "least recently used"

    def __init__(self) -> None:
        self._clock = 0
        self._last: dict[str, int] = {}

    def admit(self, name: str, cost: float) -> None:
        self.access(name)  # loaded is used

    def access(self, name: str) -> None:
        self._clock += 1
        self._last[name] = self._clock

    def priority(self, name: str, size: int) -> float:
        return self._last.get(name, 0)

    def removed(self, name: str) -> None:
        self._last.pop(name, None)


class GdsfPolicy(EvictionPolicy):
    name = "gdsf"
    describes = "lowest requests x load time / memory"

    def __init__(self, half_life: int = 150, smoothing: float = 0.3) -> None:
        self.half_life = half_life  # in requests (to all models): how fast a model's past requests fade
        self.smoothing = smoothing  # the weight of the newest load time in a model's cost
        self._decay = math.log(2) / half_life
        self._clock = 0  # requests since the last rebase
        # name -> sum over its requests of 2^(clock at the request / half_life): the aged count, scaled by the
        # same factor for every model, so a request adds one term and nothing else changes. _forget rebases it.
        self._frequency: dict[str, float] = {}
        self._cost: dict[str, float] = {}  # name -> seconds one load takes
        self._resident: set[str] = set()

    def admit(self, name: str, cost: float) -> None:
        known = self._cost.get(name)
        self._cost[name] = cost if known is None else known + self.smoothing * (cost - known)
        self._resident.add(name)

    def access(self, name: str) -> None:
        self._clock += 1
        self._frequency[name] = self._frequency.get(name, 0.0) + math.exp(self._decay * self._clock)
        if self._clock >= 8 * self.half_life:
            self._forget()

    def frequency(self, name: str) -> float:
        """Requests for ``name``, each weighted by 2^-(requests since it / half_life)."""
        return self._frequency.get(name, 0.0) * math.exp(-self._decay * self._clock)

    def priority(self, name: str, size: int) -> float:
        return self.frequency(name) * self._cost.get(name, 1.0) / max(size, 1)

    def removed(self, name: str) -> None:
        self._resident.discard(name)

    def _forget(self) -> None:
        """Drop what is left of models not loaded and not requested for a while (~4 half-lives): the history
        stays bounded however many models come and go."""
        scale = math.exp(-self._decay * self._clock)
        self._frequency = {name: total * scale for name, total in self._frequency.items()
                           if name in self._resident or total * scale >= 0.05}
        self._clock = 0
        self._cost = {name: cost for name, cost in self._cost.items()
                      if name in self._frequency or name in self._resident}


def make_policy(name: str) -> EvictionPolicy:
    if name == "gdsf":
        return GdsfPolicy()
    if name == "lru":
        return LruPolicy()
    raise ValueError(f"unknown eviction policy '{name}': expected one of {', '.join(POLICIES)}")
