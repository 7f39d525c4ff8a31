"""Which loaded model a memory-bounded model cache unloads first.

Two policies behind one small interface, keyed by model name:

``gdsf``  the default: GreedyDual-Size-Frequency's priority, ``frequency x load cost / size``; the model with the
          lowest goes first. Load cost is the time the model took to load (download, extraction and start),
          smoothed over its loads; size is the memory it holds, measured when a victim is chosen. The frequency
          counts a model's requests, each weighted by how recent it is (it halves every ``half_life`` requests
          to the cache, 1,000 by default: long memory estimates a steady popularity well). GDSF's own aging, an
          inflation value ``L`` added to a model's priority when it is used, behaves like recency and cost 0.02
          to 0.05 of the optimum on Zipf traces (``benchmarks/sagemaker_mme.py --simulate`` shows it as
          ``gdsf-L``). A model's history outlives its eviction, so a model that comes back is judged on all its
          requests, as TinyLFU's admission does, and is forgotten once what is left of it is negligible.

          Long memory is slow to see the popular set move on, so a second count with a short half-life
          (``shift_half_life``, 60) watches for that: a CUSUM test on how much better it predicts each request
          than the long count (the product of the ratios of the probabilities they gave it, floored at 1).
          When the evidence passes ``shift_evidence`` (3,000 to 1, about 8 nats), the popular set has
          changed: the long count restarts from the requests since the evidence began to grow, read back
          from a ring of the last ``window`` requests. On stationary Zipf traces this fires about once per
          10,000 requests and costs nothing measurable (a threshold of 30,000 gives the same hit ratios); on
          the shifted trace it fires 10 to 60 requests after the shift. It took that trace from 0.89 to 0.90
          of Belady and the stationary ones up by ~0.005, where a fixed half-life only trades one for the
          other (75 to 600 requests: shift 0.890 to 0.861, Zipf 0.8 0.817 to 0.835).
``lru``   least recently used.

Per request the cache pays one dictionary lookup, a few float operations and a ring append (``access``, ~0.7 µs
in CPython); priorities are computed only when a victim is chosen.
"""

from __future__ import annotations

from collections import deque
from itertools import islice
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

    PRIOR = 0.5  # requests every known model is credited with when a count predicts the next request

    def __init__(self, half_life: int = 1000, smoothing: float = 0.3, shift_half_life: int = 60,
                 shift_evidence: float = 3000.0, window: int = 1024) -> None:
        self.half_life = half_life  # in requests (to all models): how fast a model's past requests fade
        self.smoothing = smoothing  # the weight of the newest load time in a model's cost
        self.shift_evidence = shift_evidence  # math.inf: never restart the long count
        self.shifts = 0  # times the popular set was seen to move on
        # name -> [long count, short count], each the sum over its requests of the count's weight at the time,
        # a weight that grows by its step per request: the aged counts scaled by the same factor for every
        # model, so a request adds one term and nothing else changes. _forget rebases them.
        self._counts: dict[str, list[float]] = {}
        self._step = 2.0 ** (1 / half_life)
        self._weight = 1.0
        self._total = 0.0
        self._fast_step = 2.0 ** (1 / shift_half_life)
        self._fast_weight = 1.0
        self._fast_total = 0.0
        self._evidence = 1.0  # the CUSUM, as a likelihood ratio
        self._run = 0  # requests since the evidence was last at 1: how far back the change began
        self._recent: deque[str] = deque(maxlen=window)
        self._cost: dict[str, float] = {}  # name -> seconds one load takes
        self._resident: set[str] = set()

    def admit(self, name: str, cost: float) -> None:
        known = self._cost.get(name)
        self._cost[name] = cost if known is None else known + self.smoothing * (cost - known)
        self._resident.add(name)

    def access(self, name: str) -> None:
        counts = self._counts.get(name)
        if counts is None:
            counts = self._counts[name] = [0.0, 0.0]
        weight, fast_weight = self._weight * self._step, self._fast_weight * self._fast_step
        # How much likelier the short count found this request than the long one did; both credit every
        # known model with PRIOR requests, so that a model neither has seen is not impossible.
        known = self.PRIOR * len(self._counts)
        evidence = self._evidence * ((counts[1] + self.PRIOR * fast_weight) * (self._total + known * weight)
                                     / ((self._fast_total + known * fast_weight) * (counts[0] + self.PRIOR * weight)))
        if evidence <= 1.0:
            self._evidence, self._run = 1.0, 0
        else:
            self._evidence = evidence
            self._run += 1
        counts[0] += weight
        counts[1] += fast_weight
        self._weight, self._fast_weight = weight, fast_weight
        self._total += weight
        self._fast_total += fast_weight
        self._recent.append(name)
        if evidence > self.shift_evidence:
            self._shifted()
        if weight > 256.0 or fast_weight > 1e100:
            self._forget()

    def frequency(self, name: str) -> float:
        """Requests for ``name``, each weighted by 2^-(requests since it / half_life)."""
        counts = self._counts.get(name)
        return 0.0 if counts is None else counts[0] / self._weight

    def priority(self, name: str, size: int) -> float:
        return self.frequency(name) * self._cost.get(name, 1.0) / max(size, 1)

    def removed(self, name: str) -> None:
        self._resident.discard(name)

    def _shifted(self) -> None:
        """The popular set moved on: the long count keeps only the requests since the change began (older
        ones would hold the models that were popular before for many half-lives)."""
        self.shifts += 1
        for counts in self._counts.values():
            counts[0] = 0.0
        weight = self._weight
        for name in islice(reversed(self._recent), self._run):
            self._counts.setdefault(name, [0.0, 0.0])[0] += weight  # _forget may have dropped it
            weight /= self._step
        self._total = sum(counts[0] for counts in self._counts.values())
        self._evidence, self._run = 1.0, 0

    def _forget(self) -> None:
        """Rebase the counts to weight 1 and drop what is left of models not loaded and not requested for a
        while (~4 long half-lives): the history stays bounded however many models come and go."""
        weight, fast_weight = self._weight, self._fast_weight
        self._counts = {name: [slow / weight, fast / fast_weight] for name, (slow, fast) in self._counts.items()
                        if name in self._resident or slow / weight >= 0.05}
        self._total /= weight
        self._fast_total /= fast_weight
        self._weight = self._fast_weight = 1.0
        self._cost = {name: cost for name, cost in self._cost.items()
                      if name in self._counts or name in self._resident}


def make_policy(name: str) -> EvictionPolicy:
    if name == "gdsf":
        return GdsfPolicy()
    if name == "lru":
        return LruPolicy()
    raise ValueError(f"unknown eviction policy '{name}': expected one of {', '.join(POLICIES)}")
