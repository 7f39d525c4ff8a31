"""The tracer on its own: sampling by rate and count, Triton's trace-file layout, and how updates replace settings."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from naiad.core.errors import InferError
from naiad.core.settings import trace_changes
from naiad.core.tracing import Tracer


def _tracer(path: Path, **values: object) -> Tracer:
    return Tracer({"trace_level": ("TIMESTAMPS",), "trace_rate": 1, "trace_file": str(path), **values})


def _run(tracer: Tracer, n: int, model: str = "m") -> int:
    """n requests through the tracer as the service sends them; how many were sampled."""
    sampled = 0
    for i in range(n):
        trace = tracer.sample(model, "1", f"r{i}")
        if trace is not None:
            sampled += 1
            trace.add("QUEUE_START")
            trace.end()
    return sampled


def test_off_by_default_and_costs_one_attribute() -> None:
    tracer = Tracer()
    assert not tracer.enabled
    assert tracer.settings()["trace_level"] == ["OFF"]
    assert tracer.settings()["trace_rate"] == ["1000"]


def test_file_is_written_at_close_in_tritons_format(tmp_path: Path) -> None:
    path = tmp_path / "trace.json"
    tracer = _tracer(path)
    assert tracer.enabled
    assert _run(tracer, 2) == 2
    assert not path.exists()  # as Triton: held until the setting is replaced or the server stops
    tracer.close()
    entries = json.loads(path.read_text())
    assert entries[0] == {"id": entries[0]["id"], "model_name": "m", "model_version": 1, "request_id": "r0"}
    names = [e["timestamps"][0]["name"] for e in entries if "timestamps" in e and e["id"] == entries[0]["id"]]
    assert names == ["REQUEST_START", "QUEUE_START", "REQUEST_END"]
    assert len([e for e in entries if "model_name" in e]) == 2


def test_rate_and_count(tmp_path: Path) -> None:
    tracer = _tracer(tmp_path / "t.json", trace_rate=3, trace_count=2)
    assert _run(tracer, 20) == 2  # every third request, until two were traced
    assert tracer.settings()["trace_count"] == ["0"]  # Triton shows the count left
    # Count used up and every sampled trace collected: written to the numbered file at once (Triton's rule
    # compares traces to requests seen, so with rate 3 it waits for the end).
    tracer.close()
    assert len([e for e in json.loads((tmp_path / "t.json").read_text()) if "model_name" in e]) == 2


def test_log_frequency_writes_numbered_files(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    tracer = _tracer(path, log_frequency=2)
    _run(tracer, 5)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.json.0", "t.json.1"]
    for numbered in ("t.json.0", "t.json.1"):
        assert len([e for e in json.loads((tmp_path / numbered).read_text()) if "model_name" in e]) == 2
    tracer.close()  # the fifth trace goes to a third numbered file
    assert len(json.loads((tmp_path / "t.json.2").read_text())) > 0


def test_update_replaces_the_setting_and_flushes_it(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    tracer = _tracer(path)
    _run(tracer, 1)
    tracer.update("", trace_changes({"trace_rate": ["2"]}))
    assert path.exists()  # the replaced setting's traces are written, the array stays open
    _run(tracer, 4)
    tracer.close()
    assert len([e for e in json.loads(path.read_text()) if "model_name" in e]) == 3


def test_model_setting_overrides_and_falls_back(tmp_path: Path) -> None:
    tracer = _tracer(tmp_path / "t.json")
    tracer.update("m", trace_changes({"trace_rate": ["5"]}))
    assert tracer.settings("m")["trace_rate"] == ["5"]
    assert tracer.settings("other")["trace_rate"] == ["1"]
    assert _run(tracer, 10, "m") == 2 and _run(tracer, 10, "other") == 10
    # A global change reaches the values the model doesn't override.
    tracer.update("", trace_changes({"trace_count": ["7"]}))
    assert tracer.settings("m")["trace_count"] == ["7"] and tracer.settings("m")["trace_rate"] == ["5"]
    tracer.update("m", trace_changes({"trace_rate": None}))
    assert tracer.settings("m")["trace_rate"] == ["1"]


def test_turning_off_stops_sampling(tmp_path: Path) -> None:
    tracer = _tracer(tmp_path / "t.json")
    tracer.update("", trace_changes({"trace_level": ["OFF"]}))
    assert not tracer.enabled
    assert tracer.sample("m", "1", "") is None


@pytest.mark.parametrize("values, message", [
    ({"trace_level": ["TIMESTAMPS"]}, "Attempting to set invalid trace setting :trace file name is not given"),
    ({"trace_level": ["OFF", "TIMESTAMPS"]}, "Expect only one trace level 'OFF' is specified"),
    ({"trace_rate": ["x"]}, "Unable to parse 'trace_rate', got: x"),
    ({"trace_rate": ["1", "2"]}, "expect only 1 value for 'trace_rate'"),
    ({"trace_count": ["-2"]}, "Unable to parse 'trace_count'. Expecting value >= -1, got: -2"),
    ({"log_frequency": ["99999999999"]},
     "Unable to parse 'log_frequency', value is out of range [ 0, 4294967295 ], got: 99999999999"),
    ({"trace_file": ["x"]}, "trace file location can not be updated through network protocol"),
])
def test_refused_updates_change_nothing(values: dict, message: str) -> None:
    tracer = Tracer()
    with pytest.raises(InferError) as caught:
        tracer.update("", trace_changes(values))
    assert caught.value.message == message
    assert tracer.settings() == Tracer().settings()


def test_zero_rate_is_refused_while_tracing(tmp_path: Path) -> None:
    tracer = _tracer(tmp_path / "t.json")
    with pytest.raises(InferError, match="sample rate must be non-zero"):
        tracer.update("", trace_changes({"trace_rate": ["0"]}))
    assert tracer.settings()["trace_rate"] == ["1"]


def test_trace_level_reads_like_stoi_and_ignores_unknown_levels(tmp_path: Path) -> None:
    assert trace_changes({"trace_rate": [" 7x"]}) == {"trace_rate": 7}
    assert trace_changes({"trace_level": ["FOO"]}) == {}
    assert trace_changes({"trace_level": ["TENSORS", "TIMESTAMPS"]}) == {"trace_level": ("TIMESTAMPS", "TENSORS")}


def test_an_ensembles_steps_are_child_traces_written_with_it(tmp_path: Path) -> None:
    tracer = _tracer(tmp_path / "t.json")
    parent = tracer.sample("pipeline", "1", "r")
    assert parent is not None
    step = parent.child("pre", "1", "r")
    step.add("REQUEST_END")
    parent.end()
    tracer.close()
    entries = json.loads((tmp_path / "t.json").read_text())
    headers = [e for e in entries if "model_name" in e]
    assert headers == [{"id": parent.id, "model_name": "pipeline", "model_version": 1, "request_id": "r"},
                       {"id": step.id, "model_name": "pre", "model_version": 1, "request_id": "r",
                        "parent_id": parent.id}]
    assert [e["timestamps"][0]["name"] for e in entries if e["id"] == step.id and "timestamps" in e] == [
        "REQUEST_START", "QUEUE_START", "REQUEST_END"]


def test_a_setting_holds_at_most_buffer_bytes_then_writes_where_it_would_have(tmp_path: Path) -> None:
    path = tmp_path / "trace.json"
    tracer = _tracer(path)
    _run(tracer, 5_000)  # ~600 B each: past BUFFER_BYTES, the array is already on disk with the setting in force
    written = json.loads(path.read_text() + "]")
    assert 0 < len([t for t in written if "model_name" in t]) < 5_000
    tracer.close()
    headers = [t for t in json.loads(path.read_text()) if "model_name" in t]
    assert [t["request_id"] for t in headers] == [f"r{i}" for i in range(5_000)]  # all of them, in order


def test_numbered_files_come_sooner_when_log_frequency_is_larger_than_the_buffer(tmp_path: Path) -> None:
    path = tmp_path / "trace.json"
    tracer = _tracer(path, log_frequency=1_000_000)
    _run(tracer, 5_000)
    tracer.close()
    numbered = sorted(tmp_path.glob("trace.json.*"), key=lambda p: int(p.suffix[1:]))
    assert len(numbered) >= 2
    headers = [t for p in numbered for t in json.loads(p.read_text()) if "model_name" in t]
    assert len(headers) == 5_000


def test_traces_the_file_cannot_take_are_dropped_and_counted(tmp_path: Path) -> None:
    path = tmp_path / "missing-folder" / "trace.json"
    tracer = _tracer(path)
    _run(tracer, 5_000)
    tracer.close()
    file = tracer._global.file
    assert file.dropped == 5_000
    assert tracer._global._buffered == 0 and not tracer._global._stream
