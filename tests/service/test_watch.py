"""The dashboard's sampler: figures from counter deltas, latency windows only while a page polls."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from naiad.core.stats import ModelStats, Window
from naiad.repository.manager import ModelEntry, ModelRepository, RepositoryOptions
from naiad.service import Service, watch
from naiad.service.watch import Series, Watcher

MS = 1_000_000


def test_rates_and_mean_times_are_counter_deltas() -> None:
    stats = ModelStats()
    stats.success.add(3 * MS)  # before watching: not in the figures
    series = Series(stats, now=100.0)
    for _ in range(10):
        stats.success.add(2 * MS)
    stats.record_failure(1 * MS, "BACKEND")
    stats.record_failure(1 * MS, "REJECTED")
    stats.queue.add(5 * MS, 10)
    stats.compute_input.add(1 * MS, 10)
    stats.compute_infer.add(8 * MS, 10)
    stats.compute_output.add(1 * MS, 10)
    series.sample(102.0)
    assert series.rate == 6.0  # 12 requests ended in 2 s
    assert series.error_rate == 1.0
    assert series.queue_ms == pytest.approx(0.5)
    assert series.compute_ms == pytest.approx(1.0)
    assert (series.p50_ms, series.p99_ms) == (2.0, 2.0)
    assert list(series.history) == [6.0]
    series.sample(103.0)  # nothing happened since
    assert (series.rate, series.queue_ms, series.compute_ms) == (0.0, None, None)


def test_percentiles_cover_the_last_seconds_only() -> None:
    stats = ModelStats()
    series = Series(stats, now=0.0)
    window = stats.success.window
    assert window is not None and window.observations.maxlen == watch.PERCENTILE_LIMIT
    window.observations.append((time.monotonic_ns() - 60 * 1_000_000_000, 900 * MS))  # a minute old
    for ms in range(1, 101):
        stats.success.add(ms * MS)
    series.sample(1.0)
    assert series.p50_ms == 51.0
    assert series.p99_ms == 100.0


def test_a_summary_window_gives_its_recent_latencies() -> None:
    stats = ModelStats()
    stats.success.window = Window(60.0)  # as --metrics-config summary_latencies=true makes it
    series = Series(stats, now=0.0)
    for _ in range(100):
        stats.success.add(900 * MS)
    for _ in range(5000):  # the page looks at the newest PERCENTILE_LIMIT only: the 900 ms ones are older
        stats.success.add(1 * MS)
    series.sample(2.0)
    assert (series.p50_ms, series.p99_ms) == (1.0, 1.0)


def test_a_window_added_for_the_page_is_removed_a_summary_window_stays(monkeypatch: pytest.MonkeyPatch) -> None:
    stats = ModelStats()
    assert stats.success.window is None  # nothing recorded per request when no page is open
    series = Series(stats, now=0.0)
    assert stats.success.window is not None
    series.release()
    assert stats.success.window is None

    monkeypatch.setattr(ModelStats, "summaries", True)  # --metrics-config summary_latencies=true
    summarized = ModelStats()
    window = summarized.success.window
    assert window is not None
    series = Series(summarized, now=0.0)
    assert series.window is window
    series.release()
    assert summarized.success.window is window


def _service_with(stats: ModelStats) -> tuple[Service, ModelEntry]:
    repository = ModelRepository(RepositoryOptions(paths=[]))
    entry = ModelEntry("m", Path("m"))
    entry.add_version(1, SimpleNamespace(stats=stats))  # type: ignore[arg-type]  # the watcher reads .stats only
    repository.models["m"] = entry
    return Service(repository), entry


def test_sampling_runs_only_while_pages_poll(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(watch, "IDLE_AFTER_S", 0.3)
    stats = ModelStats()
    service, entry = _service_with(stats)

    async def scenario() -> None:
        watcher = Watcher(service.repository)
        assert not watcher.watching
        watcher.touch()
        assert watcher.watching and stats.success.window is not None
        stats.success.add(MS)
        await asyncio.sleep(1.2)  # one tick later the page has been silent for longer than IDLE_AFTER_S
        assert not watcher.watching
        assert stats.success.window is None and not watcher.series
        watcher.touch()  # a page opens again
        assert watcher.watching and stats.success.window is not None
        entry.remove_version(1)  # unloaded while watched: its window goes with it
        watcher.sample(time.monotonic())
        assert stats.success.window is None and not watcher.series
        watcher.stop()

    asyncio.run(scenario())
