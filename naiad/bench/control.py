"""The control plane the bench needs from a server: model metadata and config, statistics, shared-memory
registration. Spoken over the same protocol the load uses (as perf_analyzer does), through tritonclient;
nothing here is on the hot path."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# The counters perf_analyzer takes deltas of (inference_stats.<name>.{count,ns}).
DURATIONS = ("success", "fail", "queue", "compute_input", "compute_infer", "compute_output", "cache_hit",
             "cache_miss")


@dataclass
class TensorSpec:
    name: str
    datatype: str
    shape: list[int]          # without the batch dimension


@dataclass
class ModelInfo:
    name: str
    version: str
    max_batch_size: int
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    decoupled: bool = False
    response_cache: bool = False
    platform: str = ""
    composing: list[str] = field(default_factory=list)   # an ensemble's steps
    sequence: bool = False                                # sequence_batching


class Control:
    def __init__(self, url: str, protocol: str, headers: dict[str, str] | None = None) -> None:
        self.protocol = protocol
        self.headers = headers or None
        self.versions: dict[str, str] = {}   # the version each model's statistics came from
        if protocol == "grpc":
            import tritonclient.grpc as client

            self.client: Any = client.InferenceServerClient(url)
        else:
            import tritonclient.http as client

            self.client = client.InferenceServerClient(url, connection_timeout=30, network_timeout=120)

    def close(self) -> None:
        self.client.close()

    def _json(self, method: str, *args: Any, **kwargs: Any) -> dict[str, Any]:
        if self.protocol == "grpc":
            return getattr(self.client, method)(*args, as_json=True, headers=self.headers, **kwargs)
        return getattr(self.client, method)(*args, headers=self.headers, **kwargs)

    def live(self) -> bool:
        return bool(self.client.is_server_live(headers=self.headers))

    def extensions(self) -> set[str]:
        return set(self._json("get_server_metadata").get("extensions", []))

    def model(self, name: str, version: str = "") -> ModelInfo:
        meta = self._json("get_model_metadata", name, version)
        config = self._json("get_model_config", name, version)
        config = config.get("config", config)   # gRPC wraps it in ModelConfigResponse
        max_batch = int(config.get("max_batch_size", 0) or 0)

        def specs(items: list[dict[str, Any]]) -> list[TensorSpec]:
            out = []
            for item in items:
                shape = [int(d) for d in item.get("shape", [])]
                if max_batch > 0 and shape:
                    shape = shape[1:]
                out.append(TensorSpec(item["name"], item["datatype"], shape))
            return out

        policy = config.get("model_transaction_policy", {}) or {}
        steps = (config.get("ensemble_scheduling", {}) or {}).get("step", []) or []
        return ModelInfo(
            name=name, version=version, max_batch_size=max_batch,
            inputs=specs(meta.get("inputs", [])), outputs=specs(meta.get("outputs", [])),
            decoupled=bool(policy.get("decoupled", False)),
            response_cache=bool((config.get("response_cache", {}) or {}).get("enable", False)),
            platform=config.get("platform", "") or config.get("backend", ""),
            composing=[step.get("model_name", "") for step in steps],
            sequence="sequence_batching" in config)

    def stats(self, name: str, version: str = "") -> dict[str, dict[str, int]]:
        """{model name: flat counters} for every model the statistics list (an ensemble's steps included)."""
        answer = self._json("get_inference_statistics", name, version)
        out: dict[str, dict[str, int]] = {}
        for entry in answer.get("model_stats", []):
            flat = {"inference_count": int(entry.get("inference_count", 0) or 0),
                    "execution_count": int(entry.get("execution_count", 0) or 0)}
            stats = entry.get("inference_stats", {}) or {}
            for key in DURATIONS:
                item = stats.get(key, {}) or {}
                flat[f"{key}_count"] = int(item.get("count", 0) or 0)
                flat[f"{key}_ns"] = int(item.get("ns", 0) or 0)
            self.versions[entry.get("name", name)] = str(entry.get("version", ""))
            previous = out.get(entry.get("name", name))
            if previous is None:
                out[entry.get("name", name)] = flat
            else:   # several versions of a model: summed, as one model's load
                for key, value in flat.items():
                    previous[key] += value
        return out

    def all_stats(self) -> dict[str, dict[str, int]]:
        return self.stats("")

    def register_shm(self, name: str, key: str, byte_size: int) -> None:
        self.client.register_system_shared_memory(name, key, byte_size, headers=self.headers)

    def unregister_shm(self, name: str) -> None:
        self.client.unregister_system_shared_memory(name, headers=self.headers)


def stats_delta(start: dict[str, int] | None, end: dict[str, int] | None) -> dict[str, int]:
    if end is None:
        return {}
    start = start or {}
    return {key: value - start.get(key, 0) for key, value in end.items()}
