"""The dashboard's JSON feed: the service's state as one document the page redraws from (``Service.dashboard_feed``
assembles it; the dashboard's routes only serve it).

Everything here is read from the objects the service holds: the repository index (states and
failure reasons), each version's ``ModelStats`` (totals) and the watcher's per-second figures, each version's
instances, SageMaker's residency in multi-model mode, and the GPUs where there are any. Built at most twice a second
however many pages poll.
"""

from __future__ import annotations

import os
import time
from typing import Any

import psutil

from naiad.core.devices import devices
from naiad.core.stats import ModelStats
from naiad.repository.manager import ModelRepository
from naiad.repository.model import ModelVersion
from naiad.sagemaker.residency import Residency
from naiad.service.watch import Series, Watcher


def process() -> dict[str, Any]:
    """The serving process's own figures."""
    me = psutil.Process()
    return {"pid": me.pid, "rss": me.memory_info().rss, "uptime_s": round(time.time() - me.create_time(), 1)}


def gpus() -> list[dict[str, Any]] | None:
    """Each GPU's utilization, memory and power as NVML reports them now; None on a host without any."""
    source = devices()
    if source is None:
        return None
    return [{"index": r.index, "uuid": r.uuid, "name": r.name, "utilization": r.utilization,
             "memory_used": r.memory_used, "memory_total": r.memory_total, "power_usage": r.power_usage,
             "power_limit": r.power_limit} for r in source.readings()] or None


def models(repository: ModelRepository, index: list[dict[str, str]], watcher: Watcher) -> list[dict[str, Any]]:
    """One row per index entry; a loaded version's carries its platform, statistics and instances."""
    loaded = repository.models
    server_pid = os.getpid()
    rows = []
    for entry in index:
        name, version = entry["name"], entry.get("version", "")
        row: dict[str, Any] = {"name": name, "version": version, "state": entry.get("state", ""),
                               "reason": entry.get("reason", "")}
        model = loaded[name].versions.get(int(version)) if version and name in loaded else None
        if model is not None:
            row["platform"] = model.platform
            row["ready"] = model.ready
            row["in_flight"] = model.in_flight
            row["stats"] = _stats(model, watcher.series.get((name, model.version)))
            row["instances"] = _instances(model, server_pid)
        rows.append(row)
    return rows


def _stats(model: ModelVersion, series: Series | None) -> dict[str, Any]:
    stats = model.stats
    figures: dict[str, Any] = {
        "success": stats.success.count,
        "failed": stats.fail.count,
        "fail_reasons": _reasons(stats),
        "last_refusal": stats.last_refusal,
        "inferences": stats.inference_count,
        "executions": stats.execution_count,
    }
    if series is not None:
        figures.update(rate=round(series.rate, 2), error_rate=round(series.error_rate, 2), p50_ms=_ms(series.p50_ms),
                       p99_ms=_ms(series.p99_ms), queue_ms=_ms(series.queue_ms), compute_ms=_ms(series.compute_ms),
                       history=list(series.history))
    return figures


def _reasons(stats: ModelStats) -> dict[str, int]:
    """Triton's failure reasons, with the requests the model refused (a wrong input name, shape or datatype)
    told apart from the rest of OTHER."""
    reasons = dict(stats.fail_reasons)
    if stats.refused:
        reasons["OTHER"] -= stats.refused
        reasons["refused"] = stats.refused
    return {k: v for k, v in reasons.items() if v}


def _ms(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


def _instances(model: ModelVersion, server_pid: int) -> list[dict[str, Any]]:
    """A Python model's worker processes (its backend keeps them as ``processes``: pid, restarts, readiness);
    any other backend's instances run inside the server process."""
    processes = getattr(model.loaded, "processes", None)
    if processes:
        rows = []
        for process in processes:
            pid = process.proc.pid if process.proc is not None else None
            rows.append({"name": process.name, "pid": pid, "rss": _rss(pid), "restarts": process.restarts,
                         "ready": process.ready, "in_server": False})
        return rows
    # Several scheduler slots may share one instance name: list each instance once.
    names = dict.fromkeys(getattr(instance, "name", "") for instance in model.loaded.instances)
    return [{"name": name, "pid": server_pid, "rss": None, "restarts": None, "ready": model.ready,
             "in_server": True} for name in names]


def _rss(pid: int | None) -> int | None:
    if pid is None:
        return None
    try:
        return int(psutil.Process(pid).memory_info().rss)
    except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
        return None  # gone (restarting)


def residency_summary(repository: ModelRepository, residency: Residency | None) -> dict[str, Any] | None:
    """SageMaker's multi-model residency, once in use (None before, and without SageMaker)."""
    if residency is None or not _multi_model(residency):
        return None
    stats = residency.stats
    now = time.monotonic()
    return {
        "limit": residency.memory_limit,
        # As measured at each load and before each eviction: the figure evictions are decided on.
        "used": residency.used(),
        "models": [{"key": r.key, "model": r.target, "memory": r.memory, "idle_s": round(now - r.last_used, 1),
                    "url": r.url, "ready": repository.is_ready(r.target),
                    "device": {str(gpu): size for gpu, size in sorted(r.device.items())}}
                   for r in sorted(residency.models.values(), key=lambda r: r.target)],
        "cache_hits": stats.cache_hits,
        "cache_misses": stats.cache_misses,
        "evictions": stats.evictions,
        "last_evicted": [{"at": at, "model": target} for at, target in reversed(stats.last_evicted[-10:])],
        "loads": stats.loading.count,
        "mean_load_ms": round(stats.loading.sum_us / stats.loading.count / 1000, 1) if stats.loading.count else None,
    }


def _multi_model(residency: Residency) -> bool:
    """A multi-model endpoint in use: shown once it has a memory limit, a model data url, or any load."""
    return bool(residency.models or residency.memory_limit is not None or residency.fetch is not None
                or residency.stats.loading.count or residency.stats.cache_misses)
