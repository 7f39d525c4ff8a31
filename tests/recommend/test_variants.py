"""The tuning table's variants for one model folder, and the repositories they are served from."""

from __future__ import annotations

from pathlib import Path

import pytest

from naiad.config import pb
from naiad.config.loader import load_config
from naiad.recommend.variants import plan, write_repository
from tests import onnx_graphs

BATCHING = """
name: "arith"
backend: "onnxruntime"
max_batch_size: 8
input [{ name: "INPUT0", data_type: TYPE_FP32, dims: [ 4 ] }, { name: "INPUT1", data_type: TYPE_FP32, dims: [ 4 ] }]
output [{ name: "OUTPUT0", data_type: TYPE_FP32, dims: [ 4 ] }, { name: "OUTPUT1", data_type: TYPE_FP32, dims: [ 4 ] }]
parameters { key: "intra_op_thread_count" value: { string_value: "1" } }
"""


def _model(tmp_path: Path, config: str, torch_export: bool = False) -> Path:
    folder = onnx_graphs.write(tmp_path / "repo", "arith", onnx_graphs.add_sub("TYPE_FP32", [4]), config)
    if torch_export:
        (folder / "1" / "model.pt").write_bytes(b"a TorchScript export would sit here")
    return folder


def test_four_variants_of_a_batching_model(tmp_path: Path) -> None:
    result = plan(_model(tmp_path, BATCHING), available=None)
    assert [v.kind for v in result.variants] == ["base", "dynamic batching", "instance group x2",
                                                 "dynamic batching + instance group x2"]
    assert [v.label for v in result.variants] == [v.kind for v in result.variants]   # one backend: no prefix
    assert result.skipped == []
    base, batching, doubled, both = (v.config for v in result.variants)
    original, _ = load_config(result.model_dir)
    assert base == original
    assert batching.HasField("dynamic_batching") and not batching.instance_group
    assert not doubled.HasField("dynamic_batching") and [g.count for g in doubled.instance_group] == [2]
    assert both.HasField("dynamic_batching") and [g.count for g in both.instance_group] == [2]
    assert len({v.slug for v in result.variants}) == 4


def test_queue_delay_and_doubling_every_group(tmp_path: Path) -> None:
    config = BATCHING + 'instance_group [{ kind: KIND_CPU, count: 3 }, { kind: KIND_CPU }]\n'
    result = plan(_model(tmp_path, config), available=None, queue_delay_us=500)
    both = result.variants[-1].config
    assert both.dynamic_batching.max_queue_delay_microseconds == 500
    assert [(g.kind, g.count) for g in both.instance_group] == [(pb.ModelInstanceGroup.KIND_CPU, 6),
                                                                (pb.ModelInstanceGroup.KIND_CPU, 2)]


def test_a_model_that_does_not_batch_has_no_dynamic_batching_variants(tmp_path: Path) -> None:
    result = plan(_model(tmp_path, BATCHING.replace("max_batch_size: 8", "")), available=None)
    assert [v.kind for v in result.variants] == ["base", "instance group x2"]
    assert result.skipped == [("dynamic batching", "max_batch_size is 0: the model does not batch"),
                              ("dynamic batching + instance group x2", "max_batch_size is 0: the model does not batch")]


def test_a_config_that_already_batches(tmp_path: Path) -> None:
    result = plan(_model(tmp_path, BATCHING + "dynamic_batching { }\n"), available=None)
    assert [v.kind for v in result.variants] == ["base", "instance group x2"]
    assert all("already has dynamic_batching" in why for _, why in result.skipped)


def test_each_export_of_the_model_is_a_backend(tmp_path: Path) -> None:
    result = plan(_model(tmp_path, BATCHING, torch_export=True), available=None)
    assert [(v.backend, v.label) for v in result.variants][::4] == [("onnxruntime", "onnxruntime: base"),
                                                                    ("pytorch", "pytorch: base")]
    assert len(result.variants) == 8
    onnx_base, torch_base = result.variants[0].config, result.variants[4].config
    # the config's own backend is named, so the server cannot pick the other file
    assert onnx_base.backend == "onnxruntime" and len(onnx_base.parameters) == 1
    assert (torch_base.backend, torch_base.platform, torch_base.default_model_filename) == (
        "pytorch", "pytorch_libtorch", "model.pt")
    assert not torch_base.parameters   # onnxruntime's settings do not follow it
    assert list(torch_base.input) == list(onnx_base.input)


def test_a_backend_that_is_not_installed_is_skipped(tmp_path: Path) -> None:
    missing = {"pytorch": "torch is not installed"}
    result = plan(_model(tmp_path, BATCHING, torch_export=True), available=missing.get)
    assert {v.backend for v in result.variants} == {"onnxruntime"}
    assert result.skipped == [(f"pytorch: {kind}", "torch is not installed") for kind in (
        "base", "dynamic batching", "instance group x2", "dynamic batching + instance group x2")]


def test_python_model_without_framework_exports() -> None:
    examples = Path(__file__).resolve().parents[2] / "examples" / "model_repository"
    result = plan(examples / "identity_bytes", available=None)
    assert {v.backend for v in result.variants} == {"python"} and len(result.variants) == 4


def test_an_ensemble_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / "ens"
    (folder / "1").mkdir(parents=True)
    (folder / "config.pbtxt").write_text('name: "ens"\nplatform: "ensemble"\n')
    with pytest.raises(ValueError, match="ensemble"):
        plan(folder, available=None)


def test_the_variant_repository_links_the_model(tmp_path: Path) -> None:
    model = _model(tmp_path, BATCHING)
    (model / "labels.txt").write_text("a\nb\n")
    (model / "configs").mkdir()
    variant = plan(model, available=None).variants[3]
    repo = write_repository(variant, model, tmp_path / "variants")
    served = repo / "arith"
    assert repo.name == variant.slug
    assert (served / "1").is_symlink() and (served / "1" / "model.onnx").read_bytes() == (
        model / "1" / "model.onnx").read_bytes()
    assert (served / "labels.txt").is_symlink() and not (served / "configs").exists()
    parsed, found = load_config(served)
    assert found and parsed == variant.config
