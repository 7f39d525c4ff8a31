"""Offline replays of a model cache: the traces, the optimum, reference policies, and naiad's policy objects.

A cache of loaded models serves every request from a loaded model, so every miss loads (there is no bypass):
Belady's MIN, which evicts the model used again farthest in the future, is then the optimum for models of
equal size (sagemaker_mme.py checks it against exhaustive search). ``oracle_hits`` is the best an online policy
can do on average when requests are drawn independently from known probabilities (Aho, Denning and Ullman's
A0: evict the least probable model); it bounds what any policy can hope for on a Zipf trace.

``replay`` drives an ``naiad.repository.eviction`` policy the way the server does: make room (lowest priority
first), load (``admit`` with the load's cost), serve (``access``).
"""

from __future__ import annotations

import math
import random
import sys
from collections import Counter, OrderedDict
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from naiad.repository.eviction import EvictionPolicy  # noqa: E402


# --- traces -------------------------------------------------------------------------------------------------------

def _zipf(models: int, requests: int, s: float, seed: int) -> tuple[list[int], list[float]]:
    rng = np.random.default_rng(seed)
    weights = np.arange(1, models + 1, dtype=np.float64) ** -s
    weights /= weights.sum()
    ranks = rng.choice(models, size=requests, p=weights)
    by_rank = rng.permutation(models)
    probabilities = [0.0] * models
    for rank, model in enumerate(by_rank):
        probabilities[int(model)] = float(weights[rank])
    return [int(by_rank[r]) for r in ranks], probabilities


def zipf_trace(models: int, requests: int, s: float, seed: int) -> list[int]:
    """``requests`` model indices, P(rank r) ~ r^-s; which model holds which rank is a seeded shuffle."""
    return _zipf(models, requests, s, seed)[0]


def shift_trace(models: int, requests: int, s: float, seed: int) -> list[int]:
    """A Zipf trace whose ranks are dealt again halfway: the popular set moves on."""
    half = requests // 2
    return zipf_trace(models, half, s, seed) + zipf_trace(models, requests - half, s, seed + 7919)


def phases(models: int, requests: int, s: float, seed: int, shift: bool) -> list[tuple[int, list[float]]]:
    """The true request probabilities of ``zipf_trace`` / ``shift_trace``: (first request, by model) per phase."""
    if not shift:
        return [(0, _zipf(models, requests, s, seed)[1])]
    half = requests // 2
    return [(0, _zipf(models, half, s, seed)[1]), (half, _zipf(models, requests - half, s, seed + 7919)[1])]


# --- the optimum and the references --------------------------------------------------------------------------------

def belady_hits(trace: list[int], k: int) -> int:
    """Hits of Belady's MIN: on a miss with a full cache, evict the model used again farthest in the future.
    Every miss loads (a request is served from a loaded model), which is how the endpoint works."""
    never = len(trace)
    following = [never] * len(trace)
    seen: dict[int, int] = {}
    for i in range(len(trace) - 1, -1, -1):
        following[i] = seen.get(trace[i], never)
        seen[trace[i]] = i
    cache: dict[int, int] = {}  # model -> its next use
    hits = 0
    for i, item in enumerate(trace):
        if item in cache:
            hits += 1
        elif len(cache) >= k:
            del cache[max(cache, key=cache.__getitem__)]
        cache[item] = following[i]
    return hits


def lru_hits(trace: list[int], k: int) -> int:
    cache: OrderedDict[int, None] = OrderedDict()
    hits = 0
    for item in trace:
        if item in cache:
            hits += 1
            cache.move_to_end(item)
            continue
        if len(cache) >= k:
            cache.popitem(last=False)
        cache[item] = None
    return hits


def lfu_hits(trace: list[int], k: int) -> int:
    """LFU with counts over the whole history, ties to the least recent; every miss loads (no bypass)."""
    counts: Counter[int] = Counter()
    last: dict[int, int] = {}
    cache: set[int] = set()
    hits = 0
    for i, item in enumerate(trace):
        counts[item] += 1
        if item in cache:
            hits += 1
        else:
            if len(cache) >= k:
                cache.remove(min(cache, key=lambda m: (counts[m], last[m])))
            cache.add(item)
        last[item] = i
    return hits


def gdsf_inflation_hits(trace: list[int], k: int) -> int:
    """Classic GDSF (Cherkasova 1998) for equal sizes and costs: priority L + frequency, L rising to each
    victim's priority; frequencies count requests while the model is loaded."""
    inflation = 0.0
    priority: dict[int, float] = {}
    frequency: dict[int, int] = {}
    hits = 0
    for item in trace:
        if item in priority:
            hits += 1
            frequency[item] += 1
        else:
            if len(priority) >= k:
                victim = min(priority, key=priority.__getitem__)
                inflation = priority.pop(victim)
                del frequency[victim]
            frequency[item] = 1
        priority[item] = inflation + frequency[item]
    return hits


def oracle_hits(trace: list[int], k: int, known: list[tuple[int, list[float]]]) -> int:
    """A0: evict the model least likely to be requested next, knowing the true probabilities of each phase."""
    cache: set[int] = set()
    hits = 0
    phase = 0
    for i, item in enumerate(trace):
        while phase + 1 < len(known) and known[phase + 1][0] <= i:
            phase += 1
        if item in cache:
            hits += 1
            continue
        if len(cache) >= k:
            probabilities = known[phase][1]
            cache.remove(min(cache, key=probabilities.__getitem__))
        cache.add(item)
    return hits


# --- naiad's policies -----------------------------------------------------------------------------------------------

Cost = Callable[[int], float]  # model -> seconds this load takes


def noisy_costs(base: float, spread: float, seed: int) -> Cost:
    """Load times as measured: ``base`` seconds, each load off by a seeded log-normal factor."""
    rng = random.Random(seed)
    return lambda model: base * math.exp(rng.gauss(0.0, spread))


def replay(policy: EvictionPolicy, trace: list[int], sizes: Sequence[int], budget: int, cost: Cost) -> int:
    """Hits of ``policy`` on ``trace`` for models of ``sizes`` bytes under ``budget``, as the server drives it."""
    loaded: set[int] = set()
    used = 0
    hits = 0
    for item in trace:
        if item in loaded:
            hits += 1
        else:
            while loaded and used + sizes[item] > budget:
                victim = int(policy.victim((str(m), sizes[m]) for m in loaded))
                loaded.remove(victim)
                used -= sizes[victim]
                policy.removed(str(victim))
            loaded.add(item)
            used += sizes[item]
            policy.admit(str(item), cost(item))
        policy.access(str(item))
    return hits
