"""Request tracing as Triton's trace extension does it: settings per server and per model, sampling by rate and
count, and Triton's trace file.

A sampled request carries a ``Trace``; every other request carries None, so tracing that is off costs one
attribute test per request. Timestamps are CLOCK_MONOTONIC nanoseconds, the clock Triton's trace files use.

The file is Triton's: a JSON array of objects, per trace first ``{"id", "model_name", "model_version",
"request_id"?}`` and then one ``{"id", "timestamps": [{"name", "ns"}]}`` per activity. Like Triton, traces are
kept in memory and written when the setting that sampled them is replaced or the server stops (to the file named
by ``trace_file``), or every ``log_frequency`` traces to ``<trace_file>.<index>``, one complete array each.
Unlike Triton, what a setting holds is bounded (``BUFFER_BYTES``): past it the traces go where they would have
gone anyway, appended to ``trace_file``'s array or as the next numbered file, so a client that switches tracing
on cannot grow the server's memory. Traces the file can't take are dropped and counted (``TraceFile.dropped``).
"""

from __future__ import annotations

import itertools
import json
import logging
import time
from typing import Any

from naiad.core.errors import invalid

log = logging.getLogger("naiad.trace")

KEYS = ("trace_level", "trace_rate", "trace_count", "log_frequency", "trace_file")
# Triton's defaults (tritonserver --help): tracing off, every 1000th request, no count limit.
DEFAULTS: dict[str, Any] = {"trace_level": (), "trace_rate": 1000, "trace_count": -1, "log_frequency": 0,
                            "trace_file": ""}
LEVELS = ("TIMESTAMPS", "TENSORS")
# What one setting keeps in memory before writing: ~1,700 traces of ~600 B, one write per MiB.
BUFFER_BYTES = 1 << 20

_ids = itertools.count(1)  # one sequence for the server, as Triton numbers its traces


class Trace:
    """One sampled request's activities, in the order they happened."""

    __slots__ = ("id", "sampler", "header", "events", "children")

    def __init__(self, sampler: "Sampler", model_name: str, model_version: str, request_id: str,
                 parent_id: int = 0) -> None:
        self.id = next(_ids)
        self.sampler = sampler
        header: dict[str, Any] = {"id": self.id, "model_name": model_name,
                                  "model_version": int(model_version) if model_version.isdigit() else -1}
        if request_id:
            header["request_id"] = request_id
        if parent_id:
            header["parent_id"] = parent_id
        self.header = header
        self.events: list[tuple[str, int]] = []
        self.children: list[Trace] = []

    def child(self, model_name: str, model_version: str, request_id: str) -> "Trace":
        """The trace of a request this one made (an ensemble's step): written with this one, naming it parent."""
        child = Trace(self.sampler, model_name, model_version, request_id, self.id)
        child.add("REQUEST_START")
        child.add("QUEUE_START")
        self.children.append(child)
        return child

    def add(self, name: str, ns: int | None = None) -> None:
        self.events.append((name, time.monotonic_ns() if ns is None else ns))

    def end(self) -> None:
        """REQUEST_END: the trace is complete and goes to its setting's stream."""
        self.add("REQUEST_END")
        self.sampler.collect(self)

    def json(self) -> str:
        parts = [json.dumps(self.header, separators=(",", ":"))]
        if "TIMESTAMPS" in self.sampler.level:
            parts += [f'{{"id":{self.id},"timestamps":[{{"name":"{name}","ns":{ns}}}]}}' for name, ns in self.events]
        parts += [child.json() for child in self.children]
        return ",".join(parts)


class TraceFile:
    """One trace file path, shared by every setting that names it: an array opened on the first write and
    closed when the server stops, plus the numbered files that ``log_frequency`` writes."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._stream: Any = None
        self._index = 0
        self.closed = False
        self.dropped = 0  # traces lost to write failures

    def save(self, text: str, indexed: bool, count: int = 1) -> None:
        """Write ``text``, ``count`` traces joined by commas."""
        if self.closed:
            return  # a request that outlived shutdown: the array is already closed
        try:
            if indexed:
                with open(f"{self.path}.{self._index}", "w") as numbered:
                    numbered.write(f"[{text}]")
                self._index += 1
            elif self._stream is None:
                self._stream = open(self.path, "w")
                self._stream.write(f"[{text}")
            else:
                self._stream.write(f",{text}")
            if self._stream is not None:
                self._stream.flush()
        except OSError as exc:
            self.dropped += count
            # Once, then at each power of two: a full disk must not flood the log as well.
            if self.dropped == count or self.dropped & (self.dropped - 1) == 0:
                log.error("failed creating trace file: %s (%d traces dropped so far)", exc, self.dropped)

    def close(self) -> None:
        self.closed = True
        if self._stream is not None:
            self._stream.write("]")
            self._stream.close()
            self._stream = None


class Sampler:
    """Triton's TraceSetting: one set of values with its own counters; an update replaces it, never edits it,
    so the traces already sampled keep the setting they were sampled under."""

    def __init__(self, values: dict[str, Any], file: TraceFile) -> None:
        self.level: tuple[str, ...] = values["trace_level"]
        self.rate: int = values["trace_rate"]
        self.count: int = values["trace_count"]
        self.log_frequency: int = values["log_frequency"]
        self.file = file
        self.sampled = 0  # requests seen (Triton's sample_)
        self.collected = 0
        self._stream: list[str] = []
        self._buffered = 0  # characters in _stream: bounded by BUFFER_BYTES
        self.retired = False  # replaced by an update; its traces still in flight are written as they end
        self.reason = ("tracing is disabled" if not self.level else "sample rate must be non-zero" if not self.rate
                       else "trace file name is not given" if not file.path else "")

    @property
    def valid(self) -> bool:
        return not self.reason and self.count != 0

    def values(self) -> dict[str, Any]:
        return {"trace_level": self.level, "trace_rate": self.rate, "trace_count": self.count,
                "log_frequency": self.log_frequency, "trace_file": self.file.path}

    def sample(self, model_name: str, model_version: str, request_id: str) -> Trace | None:
        if not self.valid:
            return None
        self.sampled += 1
        if self.sampled % self.rate:
            return None
        if self.count > 0:
            self.count -= 1
        trace = Trace(self, model_name, model_version, request_id)
        trace.add("REQUEST_START")
        return trace

    def collect(self, trace: Trace) -> None:
        if self.retired:
            self.file.save(trace.json(), indexed=self.log_frequency != 0)
            return
        text = trace.json()
        self._stream.append(text)
        self._buffered += len(text)
        self.collected += 1
        # Triton writes a numbered file once the count is used up and every sampled trace is in, or every
        # log_frequency traces.
        if (self.count == 0 and self.collected == self.sampled) or (
                self.log_frequency and len(self._stream) >= self.log_frequency):
            self._write(indexed=True)
        elif self._buffered >= BUFFER_BYTES:
            self._write(indexed=self.log_frequency != 0)  # where flush() would put them, only sooner

    def flush(self) -> None:
        """The setting is replaced or the server stops: what is left goes to the trace file."""
        self.retired = True
        if self._stream:
            self._write(indexed=self.log_frequency != 0)

    def _write(self, indexed: bool) -> None:
        self.file.save(",".join(self._stream), indexed, len(self._stream))
        self._stream = []
        self._buffered = 0


class Tracer:
    """The server's trace settings: a global one and per-model ones. A model setting names only the values it
    overrides; the rest follow the global setting, and clearing them all returns the model to it."""

    def __init__(self, values: dict[str, Any] | None = None) -> None:
        self._files: dict[str, TraceFile] = {}
        self._global = self._sampler({**DEFAULTS, **(values or {})})
        self._models: dict[str, tuple[Sampler, dict[str, Any]]] = {}  # name -> (sampler, overrides)
        self.enabled = self._global.valid  # the hot path's one test

    def _sampler(self, values: dict[str, Any]) -> Sampler:
        path = values["trace_file"]
        file = self._files.get(path)
        if file is None:
            file = self._files[path] = TraceFile(path)
        return Sampler(values, file)

    def _for(self, model: str) -> Sampler:
        """The setting a model's requests are sampled under: its own, or the global one."""
        entry = self._models.get(model) if model else None
        return entry[0] if entry is not None else self._global

    def settings(self, model: str = "") -> dict[str, list[str]]:
        """The values as Triton's protocols show them: lists of strings, ``OFF`` for no level."""
        values = self._for(model).values()
        shown = {key: [str(values[key])] for key in KEYS}
        shown["trace_level"] = list(values["trace_level"]) or ["OFF"]
        shown["trace_mode"] = ["triton"]
        return shown

    def update(self, model: str, changes: dict[str, Any]) -> None:
        """Apply checked changes (``None`` clears a value: a model's falls back to the global one, a global one to
        Triton's default). Like Triton, a setting that would trace but can't (no trace file, a zero rate) is
        refused and nothing changes."""
        if model:
            overrides = dict(self._models[model][1]) if model in self._models else {}
            for key, value in changes.items():
                if value is None:
                    overrides.pop(key, None)
                else:
                    overrides[key] = value
            if not overrides:
                old = self._models.pop(model, None)
                if old is not None:
                    old[0].flush()
                self._refresh()
                return
            sampler = self._checked({**self._global.values(), **overrides})
            old = self._models.get(model)
            self._models[model] = (sampler, overrides)
            if old is not None:
                old[0].flush()
        else:
            values = self._global.values()
            for key, value in changes.items():
                values[key] = DEFAULTS[key] if value is None else value
            sampler = self._checked(values)
            self._global.flush()
            self._global = sampler
            # Models that follow the global setting for some values get a setting built on the new one.
            for name, (replaced, overrides) in list(self._models.items()):
                if len(overrides) < len(KEYS):
                    self._models[name] = (self._sampler({**values, **overrides}), overrides)
                    replaced.flush()
        self._refresh()

    def _checked(self, values: dict[str, Any]) -> Sampler:
        sampler = self._sampler(values)
        if not sampler.valid and values["trace_level"]:
            raise invalid(f"Attempting to set invalid trace setting :{sampler.reason}")
        return sampler

    def _refresh(self) -> None:
        self.enabled = self._global.valid or any(s.valid for s, _ in self._models.values())

    def sample(self, model_name: str, model_version: str, request_id: str) -> Trace | None:
        return self._for(model_name).sample(model_name, model_version, request_id)

    def close(self) -> None:
        """At shutdown: every setting's remaining traces written, every trace file closed."""
        self._global.flush()
        for sampler, _ in self._models.values():
            sampler.flush()
        for file in self._files.values():
            file.close()
        self.enabled = False
