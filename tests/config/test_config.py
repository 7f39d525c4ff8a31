from __future__ import annotations

from pathlib import Path

import pytest

from naiad.config.loader import load_config, parse_config_text
from naiad.config.normalize import detect_backend, fill_defaults
from naiad.config.render import config_to_dict
from naiad.config.validate import validate
from naiad.core.errors import InferError


def _checked(text: str, folder: str = "m") -> None:
    config = parse_config_text(text)
    fill_defaults(config, folder)
    validate(config, folder)


def test_int64_fields_render_as_numbers() -> None:
    config = parse_config_text('name: "m" backend: "python" max_batch_size: 8 '
                               'input [{ name: "I" data_type: TYPE_INT64 dims: [-1, 3] }] '
                               'dynamic_batching { max_queue_delay_microseconds: 100 preferred_batch_size: [2, 4] }')
    fill_defaults(config, "m")
    value = config_to_dict(config)
    assert value["input"][0]["dims"] == [-1, 3]
    assert value["dynamic_batching"]["max_queue_delay_microseconds"] == 100
    assert value["dynamic_batching"]["preferred_batch_size"] == [2, 4]
    assert value["instance_group"][0]["name"] == "m" and value["instance_group"][0]["count"] == 1
    assert list(value)[:4] == ["name", "platform", "backend", "runtime"]


def test_syntax_error_names_the_file() -> None:
    with pytest.raises(InferError, match="failed to read text proto from config.pbtxt"):
        parse_config_text('name: "m" input [ { name: "I" ')


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('name: "other" backend: "python"', "unexpected directory name 'm' for model 'other'"),
        ('name: "m" backend: "python" input [{ name: "I" dims: [1] }]', "model input 'I' must specify 'data_type'"),
        ('name: "m" backend: "python" input [{ name: "I" data_type: TYPE_FP32 dims: [0] }]',
         "model input 'I' dimension must be integer >= 1, or -1"),
        ('name: "m" backend: "python" output [{ name: "O" data_type: TYPE_FP32 dims: [-2] }]',
         "model output 'O' dimension must be integer >= 1"),
        ('name: "m" backend: "python" max_batch_size: -1', "'max_batch_size' must be non-negative value for m"),
        ('name: "m" backend: "nosuch"', "unable to find backend library for backend 'nosuch'"),
        ('name: "m"', "must specify 'platform' or 'backend' for 'm'"),
        ('name: "m" backend: "python" output [{ name: "O" data_type: TYPE_FP32 }]', "model output 'O' must specify 'dims'"),
        ('name: "m" backend: "python" max_batch_size: 2 dynamic_batching { preferred_batch_size: [4] }',
         "preferred size must be <= max batch size for m"),
    ],
)
def test_validation_messages(text: str, message: str) -> None:
    with pytest.raises(InferError) as info:
        _checked(text)
    assert message in info.value.message


def test_backend_detected_from_model_file(tmp_path: Path) -> None:
    (tmp_path / "1").mkdir()
    (tmp_path / "1" / "model.py").write_text("")
    config, found = load_config(tmp_path)
    assert not found
    detect_backend(config, [tmp_path / "1"])
    assert config.backend == "python" and config.platform == ""


def test_custom_config_name(tmp_path: Path) -> None:
    (tmp_path / "configs").mkdir()
    (tmp_path / "config.pbtxt").write_text('name: "m" backend: "python" max_batch_size: 1')
    (tmp_path / "configs" / "alt.pbtxt").write_text('name: "m" backend: "python" max_batch_size: 7')
    assert load_config(tmp_path, "alt")[0].max_batch_size == 7
    assert load_config(tmp_path, "missing")[0].max_batch_size == 1
    assert load_config(tmp_path)[0].max_batch_size == 1
