"""Model statistics for the whole application: each model replica pushes its own (Triton's model_stats, as
``GET /v2/models/stats`` gives them) to one board, a small named Ray actor, and the ingress answers the
statistics routes by summing the board's rows, so a model served by several replicas counts every request once.

A replica pushes every ``PUSH_INTERVAL_S`` (a heartbeat when nothing changed), so the figures lag by at most
that; a replica that stops pushing (it died) drops out after ``STALE_S``, with the models it held, as the
models of a stopped server do.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import orjson

log = logging.getLogger("naiad.ray")

PUSH_INTERVAL_S = 1.0
STALE_S = 5 * PUSH_INTERVAL_S
NAMESPACE = "naiad-ray"


class StatisticsBoard:
    """The Ray actor: each replica's latest statistics (orjson bytes) and when they came."""

    def __init__(self) -> None:
        self.rows: dict[str, tuple[float, bytes]] = {}

    def put(self, replica: str, stats: bytes) -> None:
        self.rows[replica] = (time.monotonic(), stats)

    def drop(self, replica: str) -> None:
        self.rows.pop(replica, None)

    def current(self) -> list[bytes]:
        cutoff = time.monotonic() - STALE_S
        for replica in [r for r, (at, _) in self.rows.items() if at < cutoff]:
            del self.rows[replica]
        return [stats for _, stats in self.rows.values()]


def board(app: str) -> Any:
    """The application's board, started by whichever of its processes asks first and owned by it: it goes
    with its owner (the application's end ends it; a replica that dies takes it along, and the next push
    starts another, losing at most one interval of figures)."""
    import ray

    actor: Any = ray.remote(num_cpus=0)(StatisticsBoard)
    return actor.options(name=f"statistics:{app}", namespace=NAMESPACE, get_if_exists=True).remote()


def app_name(default: str) -> str:
    try:
        from ray import serve

        return str(serve.get_replica_context().app_name)
    except Exception:  # outside a replica (unit use)
        return default


def _add(into: dict[str, Any], stats: dict[str, Any]) -> None:
    """Sum ``stats`` (one model version's entry, or a part of it) into ``into``: counts and durations add up,
    the last inference is the latest, batch sizes match by size."""
    for key, value in stats.items():
        if key == "last_inference":
            into[key] = max(into.get(key, 0), value)
        elif key == "batch_stats":
            by_size = {row["batch_size"]: row for row in into.setdefault(key, [])}
            for row in value:
                if row["batch_size"] in by_size:
                    _add(by_size[row["batch_size"]], {k: v for k, v in row.items() if k != "batch_size"})
                else:
                    into[key].append(row)
                    by_size[row["batch_size"]] = row
            into[key].sort(key=lambda row: row["batch_size"])
        elif isinstance(value, dict):
            _add(into.setdefault(key, {}), value)
        elif isinstance(value, (int, float)) and not isinstance(value, bool) and key in into:
            into[key] += value
        elif key not in into:
            into[key] = value


def merge(snapshots: list[bytes], name: str = "", version: str = "") -> dict[str, Any]:
    """Triton's ``{"model_stats": [...]}`` over every replica's snapshot, sorted by model and version; only
    ``name`` (and ``version``) when given."""
    totals: dict[tuple[str, str], dict[str, Any]] = {}
    for snapshot in snapshots:
        for entry in orjson.loads(snapshot).get("model_stats", ()):
            if (name and entry["name"] != name) or (version and entry["version"] != version):
                continue
            key = (entry["name"], entry["version"])
            if key not in totals:
                totals[key] = orjson.loads(orjson.dumps(entry))  # a copy: merged into below
            else:
                _add(totals[key], {k: v for k, v in entry.items() if k not in ("name", "version")})
    return {"model_stats": [totals[key] for key in sorted(totals, key=lambda k: (k[0], _number(k[1])))]}


def _number(version: str) -> int:
    return int(version) if version.isdigit() else -1


class Pusher:
    """A replica's side: a task that sends the replica's statistics to the board every PUSH_INTERVAL_S."""

    def __init__(self, replica: str, app: str, snapshot: Any) -> None:
        self.replica = replica
        self.app = app
        self.snapshot = snapshot  # () -> awaitable dict, the replica service's model_statistics
        self.task: asyncio.Task | None = None

    def start(self) -> None:
        self.task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        target = None
        while True:
            try:
                if target is None:
                    target = board(self.app)
                await target.put.remote(self.replica, orjson.dumps(await self.snapshot()))
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the board is being replaced (its app redeployed): ask again next time
                log.debug("statistics push: %s", exc)
                target = None
            await asyncio.sleep(PUSH_INTERVAL_S)

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
        try:
            await board(self.app).drop.remote(self.replica)
        except Exception as exc:
            log.debug("statistics drop: %s", exc)
