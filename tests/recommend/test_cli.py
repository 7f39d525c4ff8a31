"""``naiad recommend``'s arguments: the job's JSON documents, shapes, and the refusals before any server starts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from naiad.cli import build_parser, main
from naiad.recommend.cli import DEFAULT_TRAFFIC, _pattern, _shapes

STAIRS = {"TrafficType": "STAIRS", "Stairs": {"DurationInSeconds": 1, "NumberOfSteps": 2, "UsersPerStep": 1}}
STOPPING = {"MaxInvocations": 1000, "ModelLatencyThresholds": [{"Percentile": "P95", "ValueInMilliseconds": 10}]}


@pytest.mark.parametrize("document", [
    STAIRS,                                                     # the TrafficPattern alone
    {"TrafficPattern": STAIRS},                                 # the job's InputConfig
    {"JobName": "j", "InputConfig": {"TrafficPattern": STAIRS}},   # the whole CreateInferenceRecommendationsJob
])
def test_a_traffic_pattern_in_each_shape(tmp_path: Path, document: dict) -> None:
    path = tmp_path / "traffic.json"
    path.write_text(json.dumps(document))
    pattern, whole = _pattern(path, "TrafficPattern")
    assert pattern == STAIRS and whole == document


def test_a_whole_job_carries_its_stopping_conditions(tmp_path: Path) -> None:
    path = tmp_path / "job.json"
    path.write_text(json.dumps({"InputConfig": {"TrafficPattern": STAIRS}, "StoppingConditions": STOPPING}))
    assert _pattern(path, "StoppingConditions")[0] == STOPPING
    assert _pattern(None, "TrafficPattern") == (None, None)


def test_shapes() -> None:
    assert _shapes(["INPUT0:1,16", "ns:x:3"]) == {"INPUT0": [1, 16], "ns:x": [3]}
    with pytest.raises(ValueError, match="NAME:D1,D2"):
        _shapes(["16"])


def test_cpu_lists() -> None:
    parse = lambda *flags: build_parser().parse_args(["recommend", "m", *flags])
    args = parse("--server-cpus", "1", "--bench-cpus", "0-2,5")
    assert (args.server_cpus, args.bench_cpus) == ({1}, {0, 1, 2, 5})
    with pytest.raises(SystemExit):
        parse("--server-cpus", "one")


def test_defaults() -> None:
    args = build_parser().parse_args(["recommend", "some/model"])
    assert (args.model_dir, args.output_dir, args.traffic, args.sla_p95_ms, args.price_per_hour,
            args.server_cmd, args.protocol) == (Path("some/model"), None, None, None, None, None, "http")
    assert DEFAULT_TRAFFIC["TrafficType"] == "STAIRS"


def test_refusals_before_serving(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["recommend", str(tmp_path / "missing")]) == 2
    assert "is not a folder" in capsys.readouterr().err
    model = tmp_path / "m"
    (model / "1").mkdir(parents=True)
    assert main(["recommend", str(model)]) == 2
    assert "no model file found" in capsys.readouterr().err
    (model / "config.pbtxt").write_text("name: 'm' max_batch_size: eight")
    assert main(["recommend", str(model)]) == 2
    assert "failed to read text proto from" in capsys.readouterr().err
    (model / "config.pbtxt").unlink()
    (model / "1" / "model.onnx").write_bytes(b"")
    bad = tmp_path / "bad.json"
    bad.write_text("[1, 2]")
    assert main(["recommend", str(model), "--traffic", str(bad)]) == 2
    assert "expected a JSON object" in capsys.readouterr().err
    assert not list(tmp_path.glob("naiad-recommend-*")) and not Path("naiad-recommend-m").exists()


def test_output_goes_outside_a_git_work_tree_by_default(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from naiad.recommend.cli import default_output

    home = tmp_path / "home"
    monkeypatch.setenv("HOME", str(home))
    plain = tmp_path / "work"
    plain.mkdir()
    monkeypatch.chdir(plain)
    assert default_output("m") == Path("naiad-recommend-m")   # beside the user, as before
    clone = tmp_path / "clone"
    (clone / ".git").mkdir(parents=True)
    (clone / "sub").mkdir()
    monkeypatch.chdir(clone / "sub")   # anywhere inside the work tree
    assert default_output("m") == home / "naiad-recommend-m"
    (tmp_path / "worktree").mkdir()
    (tmp_path / "worktree" / ".git").write_text("gitdir: /elsewhere\n")   # a linked worktree's .git is a file
    monkeypatch.chdir(tmp_path / "worktree")
    assert default_output("m") == home / "naiad-recommend-m"
