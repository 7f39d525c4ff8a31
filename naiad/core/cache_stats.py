"""A memory-bounded model cache's counters (``naiad.repository.cache``): plain numbers that cross the service
face, which the metrics page and the dashboard read and SageMaker's endpoint counters extend."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Timing:
    """A CloudWatch-style statistic: how many, and their sum in microseconds."""
    count: int = 0
    sum_us: float = 0.0

    def add(self, seconds: float) -> None:
        self.count += 1
        self.sum_us += seconds * 1e6


@dataclass
class CacheStats:
    cache_hits: int = 0
    cache_misses: int = 0
    evictions: int = 0
    loading_wait: Timing = field(default_factory=Timing)  # how long requests waited for a missing model
    downloading: Timing = field(default_factory=Timing)  # fetching and extracting an archive
    loading: Timing = field(default_factory=Timing)
    unloading: Timing = field(default_factory=Timing)  # until the model's memory is released
    last_evicted: list[tuple[float, str]] = field(default_factory=list)  # (time, target), newest last
