"""The pytorch backend on a live server, driven by tritonclient: Triton's naming conventions (forward argument
names, ``INPUT__0`` / ``OUTPUT__0``, config order, a Dict input), datatypes, List[str] tensors, thread settings,
and Triton's messages for a missing file, a broken file, dtype mismatches and GPUs asked of a CPU host."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

pytest.importorskip("torch")

from tests import torch_models as tm
from tests.server import RunningServer
from tests.tensors import infer_inputs

TYPES = [("b", "TYPE_BOOL", np.bool_), ("u8", "TYPE_UINT8", np.uint8), ("i8", "TYPE_INT8", np.int8),
         ("i16", "TYPE_INT16", np.int16), ("i32", "TYPE_INT32", np.int32), ("i64", "TYPE_INT64", np.int64),
         ("f16", "TYPE_FP16", np.float16), ("f32", "TYPE_FP32", np.float32), ("f64", "TYPE_FP64", np.float64)]


def _write(repo: Path, name: str, module, config: str) -> None:
    if module is not None:
        tm.save(module, repo / name / "1" / "model.pt")
    else:
        (repo / name / "1").mkdir(parents=True)
    (repo / name / "config.pbtxt").write_text(f'name: "{name}"\nplatform: "pytorch_libtorch"\n{config}')


def _io(kind: str, names: list[str], dtype: str = "TYPE_FP32", dims: str = "[ 4 ]") -> str:
    entries = ", ".join(f'{{ name: "{n}", data_type: {dtype}, dims: {dims} }}' for n in names)
    return f"{kind} [{entries}]\n"


BROKEN = {
    "missing_file": "Unavailable: unable to find '{repo}/missing_file/1/model.pt' for model instance 'missing_file_0'",
    "not_torchscript": "Internal: failed to load model 'not_torchscript': ",
    "wrong_input_count": "Invalid argument: unable to load model 'wrong_input_count', configuration expects 1 inputs, "
                         "model provides 2",
    "unsupported_type": "Internal: unsupported datatype TYPE_UINT32 for input 'INPUT__0' for model 'unsupported_type'",
    "gpu_instance": "Invalid argument: instance group gpu_instance_0 of model gpu_instance has kind KIND_GPU but no "
                    "GPUs are available",
}


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = tmp_path_factory.mktemp("torch")
    # Inputs by forward argument name, listed in the config in the other order.
    _write(repo, "by_argument", tm.AddSub(), "max_batch_size: 8\n" + _io("input", ["INPUT1", "INPUT0"])
           + _io("output", ["OUTPUT__0", "OUTPUT__1"])
           + 'parameters [{ key: "INTRA_OP_THREAD_COUNT" value: { string_value: "1" } },'
             ' { key: "INFERENCE_MODE" value: { string_value: "false" } }]\n')
    # <name>__<index>: y__0 reaches forward's first argument whatever the config order.
    _write(repo, "by_index", tm.Ordered(), "max_batch_size: 8\n" + _io("input", ["y__1", "x__0"])
           + _io("output", ["OUT__0"]))
    # Neither: config order decides.
    _write(repo, "by_order", tm.Ordered(), "max_batch_size: 8\n" + _io("input", ["FIRST", "SECOND"])
           + _io("output", ["DIFF"]))
    _write(repo, "dict_input", tm.DictInput(), _io("input", ["A", "B"]) + _io("output", ["OUTPUT__0"]))
    _write(repo, "strings", tm.Upper(), _io("input", ["WORDS"], "TYPE_STRING", "[ -1 ]")
           + _io("output", ["UPPER"], "TYPE_STRING", "[ -1 ]"))
    _write(repo, "wrong_output_type", tm.Halve(), _io("input", ["INPUT__0"]) + _io("output", ["OUTPUT__0"]))
    _write(repo, "casts", tm.Casts(), "max_batch_size: 2\n" + "input [" + ", ".join(
        f'{{ name: "{n}", data_type: {t}, dims: [ 3 ] }}' for n, t, _ in TYPES) + "]\noutput [" + ", ".join(
        f'{{ name: "OUT__{i}", data_type: {t}, dims: [ 3 ] }}' for i, (_, t, _) in enumerate(TYPES)) + "]\n")
    _write(repo, "missing_file", None, _io("input", ["INPUT__0"]) + _io("output", ["OUTPUT__0"]))
    _write(repo, "not_torchscript", None, _io("input", ["INPUT__0"]) + _io("output", ["OUTPUT__0"]))
    (repo / "not_torchscript" / "1" / "model.pt").write_bytes(b"definitely not a zip archive")
    _write(repo, "wrong_input_count", tm.AddSub(), _io("input", ["INPUT0"]) + _io("output", ["OUTPUT__0"]))
    _write(repo, "unsupported_type", tm.Halve(), _io("input", ["INPUT__0"], "TYPE_UINT32")
           + _io("output", ["OUTPUT__0"]))
    _write(repo, "gpu_instance", tm.Halve(), _io("input", ["INPUT__0"]) + _io("output", ["OUTPUT__0"], "TYPE_FP64")
           + "instance_group [{ kind: KIND_GPU }]\n")
    return repo


@pytest.fixture(scope="module")
def server(repo: Path) -> Iterator[RunningServer]:
    running = RunningServer([repo], "--strict-readiness=false")
    yield running
    running.stop()


def test_inputs_by_forward_argument_name(client: httpclient.InferenceServerClient) -> None:
    a = np.arange(8, dtype=np.float32).reshape(2, 4)
    b = np.ones((2, 4), dtype=np.float32)
    result = client.infer("by_argument", infer_inputs(httpclient, INPUT0=a, INPUT1=b))
    np.testing.assert_array_equal(result.as_numpy("OUTPUT__0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT__1"), a - b)
    config = client.get_model_config("by_argument")
    assert config["default_model_filename"] == "model.pt" and config["backend"] == "pytorch"
    assert [(g["kind"], g["count"]) for g in config["instance_group"]] == [("KIND_CPU", 1)]


def test_inputs_by_index_suffix(client: httpclient.InferenceServerClient) -> None:
    x = np.full((1, 4), 10, dtype=np.float32)
    y = np.full((1, 4), 3, dtype=np.float32)
    result = client.infer("by_index", infer_inputs(httpclient, x__0=x, y__1=y))
    np.testing.assert_array_equal(result.as_numpy("OUT__0"), x - y)


def test_inputs_in_config_order(client: httpclient.InferenceServerClient) -> None:
    first = np.full((1, 4), 10, dtype=np.float32)
    second = np.full((1, 4), 3, dtype=np.float32)
    result = client.infer("by_order", infer_inputs(httpclient, SECOND=second, FIRST=first))
    np.testing.assert_array_equal(result.as_numpy("DIFF"), first - second)


def test_dict_input(client: httpclient.InferenceServerClient) -> None:
    a = np.full(4, 2, dtype=np.float32)
    b = np.arange(4, dtype=np.float32)
    result = client.infer("dict_input", infer_inputs(httpclient, A=a, B=b))
    np.testing.assert_array_equal(result.as_numpy("OUTPUT__0"), a * 10 + b)


def test_string_lists(client: httpclient.InferenceServerClient) -> None:
    words = np.array([b"hello", "caf\u00e9".encode(), b""], dtype=np.object_)
    result = client.infer("strings", infer_inputs(httpclient, WORDS=words))
    # TorchScript's upper() changes ASCII only; the UTF-8 bytes come back as they went in.
    assert result.as_numpy("UPPER").tolist() == [b"HELLO", "CAF\u00e9".encode(), b""]


def test_datatypes(client: httpclient.InferenceServerClient) -> None:
    arrays = {n: (np.arange(6).reshape(2, 3) % 2).astype(t) if t is np.bool_ else np.arange(6).reshape(2, 3).astype(t)
              for n, _, t in TYPES}
    result = client.infer("casts", infer_inputs(httpclient, **arrays))
    expected = [~arrays["b"]] + [arrays[n] + 1 for n in ("u8", "i8", "i16", "i32", "i64")] + [
        arrays[n] * 2 for n in ("f16", "f32", "f64")]
    for index, want in enumerate(expected):
        got = result.as_numpy(f"OUT__{index}")
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(got, want)


def test_output_dtype_mismatch_fails_the_request(client: httpclient.InferenceServerClient) -> None:
    with pytest.raises(InferenceServerException) as raised:
        client.infer("wrong_output_type", infer_inputs(httpclient, INPUT__0=np.ones(4, dtype=np.float32)))
    assert raised.value.message() == (
        "configuration expects datatype TYPE_FP32 for output 'OUTPUT__0', model provides TYPE_FP64")
    assert raised.value.status() == "400"


def test_broken_models_give_tritons_reasons(server: RunningServer, repo: Path) -> None:
    status, _, body = server.request("POST", "/v2/repository/index", "{}")
    assert status == 200
    rows = {row["name"]: row for row in json.loads(body)}
    for name, reason in BROKEN.items():
        assert rows[name]["state"] == "UNAVAILABLE", name
        assert rows[name]["reason"].startswith(reason.format(repo=repo)), (name, rows[name]["reason"])
