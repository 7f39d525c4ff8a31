"""What counts as code in a load request, and the model file's place (naiad/repository/consent.py). The live
attacks are in tests/reliability/test_consent.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from naiad.config import ModelConfig
from naiad.core.errors import InferError
from naiad.repository.consent import CodeConsent, check_model_file, code_in, refusal


def _config(**fields: object) -> ModelConfig:
    config = ModelConfig(name="m", backend="python")
    for key, value in fields.items():
        if key == "env":
            config.parameters["EXECUTION_ENV_PATH"].string_value = str(value)
        else:
            setattr(config, key, value)
    return config


def test_files_are_code() -> None:
    assert code_in(None, {"1/model.py": b""}, []) == "model files (file: parameters)"
    assert code_in(None, None, []) is None


@pytest.mark.parametrize("override, own, carries", [
    (_config(), [], None),
    (_config(default_model_filename="model.py"), [], None),  # a backend's standard name
    (_config(default_model_filename="model.onnx"), [], None),
    (_config(default_model_filename="/tmp/evil.py"), [], "default_model_filename '/tmp/evil.py'"),
    (_config(default_model_filename="other.py"), [], "default_model_filename 'other.py'"),
    (_config(default_model_filename="other.py"), [_config(default_model_filename="other.py")], None),  # its own
    (_config(env="/tmp/env"), [], "EXECUTION_ENV_PATH '/tmp/env'"),
    (_config(env="/tmp/env"), [_config(env="/srv/env")], "EXECUTION_ENV_PATH '/tmp/env'"),
    (_config(env="$$TRITON_MODEL_DIRECTORY/env.tar.gz"), [_config(env="$$TRITON_MODEL_DIRECTORY/env.tar.gz")], None),
    (_config(env=""), [], None),
])
def test_overrides_that_carry_code(override: ModelConfig, own: list[ModelConfig], carries: str | None) -> None:
    assert code_in(override, None, own) == carries


def test_refusal_says_how_to_allow_it() -> None:
    error = refusal("model files (file: parameters)", CodeConsent(False, "--grpc-restricted-protocol"))
    assert error.code.name == "INVALID_ARG"
    assert "--grpc-restricted-protocol=model-repository:<key>=<value>" in error.message
    assert "--allow-model-code-upload" in error.message


@pytest.mark.parametrize("name", ["/etc/passwd", "../model.py", "a/../../model.py", "..", "x\0y"])
def test_model_file_names_outside_the_folder(tmp_path: Path, name: str) -> None:
    with pytest.raises(InferError, match="must name a file inside the version folder"):
        check_model_file(_config(default_model_filename=name), [tmp_path])


def test_links_the_operator_made_are_followed(tmp_path: Path) -> None:
    version = tmp_path / "m" / "1"
    version.mkdir(parents=True)
    (tmp_path / "elsewhere.py").write_text("")
    (version / "model.py").symlink_to(tmp_path / "elsewhere.py")
    check_model_file(_config(), [version])
    check_model_file(_config(default_model_filename="missing.py"), [version])  # the backend says it is missing
    check_model_file(ModelConfig(name="e", platform="ensemble"), [version])  # no file at all
