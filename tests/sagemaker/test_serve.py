"""``naiad sagemaker serve``: the flags, checks and messages of Triton's docker/sagemaker/serve script."""

from __future__ import annotations

import json
import os
import re
import shlex
from pathlib import Path

import pytest

from naiad.sagemaker import serve as sagemaker_serve
from naiad.sagemaker.serve import SagemakerServeError, build_serve_args

ROOT = Path(__file__).resolve().parent.parent.parent

FIXED = ["serve", "--allow-sagemaker=true", "--allow-http=false", "--model-control-mode=explicit"]
ENV_DEFAULTS = [
    "--model-namespacing=true",
    "--allow-grpc=false",
    "--allow-metrics=false",
    "--log-verbose=0",  # Triton's script says 1: a line per /ping and per request
    "--exit-timeout-secs=8",  # docker stop's grace is 10 s
    "--backend-config=python,shm-default-byte-size=16777216",
    "--backend-config=python,shm-growth-byte-size=1048576",
]


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    """/opt/ml/model as SageMaker extracts a single-model archive: one model folder."""
    root = tmp_path / "model"
    (root / "add_sub" / "1").mkdir(parents=True)
    (root / "add_sub" / "config.pbtxt").write_text('backend: "python"\n')
    return root


def sme(env: dict[str, str], model_dir: Path) -> tuple[list[str], dict[str, str]]:
    return build_serve_args(env, model_dir=model_dir)


def mme(env: dict[str, str], tmp_path: Path) -> tuple[list[str], dict[str, str]]:
    return build_serve_args({"SAGEMAKER_MULTI_MODEL": "true", **env}, model_dir=tmp_path / "unused",
                            multi_model_repo=tmp_path / "sagemaker", models_root=tmp_path / "models")


def flag_values(args: list[str], flag: str) -> list[str]:
    return [arg.split("=", 1)[1] for arg in args if arg.startswith(flag + "=")]


# -- single-model endpoint ------------------------------------------------------------------------------------------


def test_defaults_single_model(model_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args, updates = sme({}, model_dir)
    assert args == FIXED + [f"--model-repository={model_dir}", *ENV_DEFAULTS, "--load-model=add_sub"]
    assert updates == {"SAGEMAKER_TRITON_PING_MODE": "ready", "SAGEMAKER_TRITON_DEFAULT_MODEL_NAME": "add_sub"}
    assert capsys.readouterr().err.splitlines() == [
        "WARNING: No SAGEMAKER_TRITON_DEFAULT_MODEL_NAME provided.",
        "         Starting with the only existing model directory add_sub",
    ]


def test_default_model_name_given(model_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (model_dir / "other").mkdir()
    args, updates = sme({"SAGEMAKER_TRITON_DEFAULT_MODEL_NAME": "other"}, model_dir)
    assert flag_values(args, "--load-model") == ["other"]
    assert updates == {"SAGEMAKER_TRITON_PING_MODE": "ready"}  # the name is already in the environment
    assert capsys.readouterr().err == ""


def test_default_model_name_missing_folder(model_dir: Path) -> None:
    with pytest.raises(SagemakerServeError) as caught:
        sme({"SAGEMAKER_TRITON_DEFAULT_MODEL_NAME": "nope"}, model_dir)
    assert caught.value.message == \
        "ERROR: Directory with provided SAGEMAKER_TRITON_DEFAULT_MODEL_NAME nope does not exist"


def test_default_model_name_that_is_a_file(model_dir: Path) -> None:
    (model_dir / "notes.txt").write_text("x")
    with pytest.raises(SagemakerServeError, match="notes.txt does not exist"):
        sme({"SAGEMAKER_TRITON_DEFAULT_MODEL_NAME": "notes.txt"}, model_dir)


def test_empty_default_model_name_counts_as_unset(model_dir: Path) -> None:
    args, updates = sme({"SAGEMAKER_TRITON_DEFAULT_MODEL_NAME": ""}, model_dir)
    assert flag_values(args, "--load-model") == ["add_sub"]
    assert updates["SAGEMAKER_TRITON_DEFAULT_MODEL_NAME"] == "add_sub"


def test_config_at_top_level_is_incorrect_structure(tmp_path: Path) -> None:
    (tmp_path / "1").mkdir()
    (tmp_path / "config.pbtxt").write_text('backend: "python"\n')
    with pytest.raises(SagemakerServeError) as caught:
        sme({"SAGEMAKER_TRITON_DEFAULT_MODEL_NAME": "1"}, tmp_path)
    assert caught.value.message == ("ERROR: Incorrect directory structure.\n"
                                    "       Model directory needs to contain the top level folder")


def test_no_model_folder(tmp_path: Path) -> None:
    (tmp_path / "readme.txt").write_text("files are not models")
    with pytest.raises(SagemakerServeError) as caught:
        sme({}, tmp_path)
    # Triton's line, plus the folder it looked in.
    assert caught.value.message == f"ERROR: No model found in model repository {tmp_path}"


def test_missing_model_dir_is_no_model(tmp_path: Path) -> None:
    with pytest.raises(SagemakerServeError) as caught:
        sme({}, tmp_path / "absent")
    assert caught.value.message == f"ERROR: No model found in model repository {tmp_path / 'absent'}"


def test_linked_folders_are_not_models(tmp_path: Path, model_dir: Path) -> None:
    # find -type d does not follow links, so a link to a model folder is not one of the model folders.
    repo = tmp_path / "linked"
    repo.mkdir()
    (repo / "add_sub").symlink_to(model_dir / "add_sub", target_is_directory=True)
    with pytest.raises(SagemakerServeError, match="No model found"):
        sme({}, repo)
    # ... while a name given explicitly only has to be a directory, as [ -d ] follows it.
    args, _ = sme({"SAGEMAKER_TRITON_DEFAULT_MODEL_NAME": "add_sub"}, repo)
    assert flag_values(args, "--load-model") == ["add_sub"]


def test_more_than_one_model_folder(model_dir: Path) -> None:
    (model_dir / "ensemble").mkdir()
    (model_dir / ".hidden").mkdir()  # find lists hidden folders too
    with pytest.raises(SagemakerServeError) as caught:
        sme({}, model_dir)
    assert caught.value.message == (
        "ERROR: More than 1 model directory found in model repository.\n"
        "       Either provide a single directory or set SAGEMAKER_TRITON_DEFAULT_MODEL_NAME to run the ensemble "
        "backend.\n"
        "       Directories found in model repository: .hidden add_sub ensemble")


def test_many_folders_with_a_default_name(model_dir: Path) -> None:
    (model_dir / "ensemble").mkdir()
    args, _ = sme({"SAGEMAKER_TRITON_DEFAULT_MODEL_NAME": "ensemble"}, model_dir)
    assert flag_values(args, "--load-model") == ["ensemble"]


def test_multi_model_must_be_exactly_true(model_dir: Path) -> None:
    for value in ("false", "True", "1", ""):
        args, updates = sme({"SAGEMAKER_MULTI_MODEL": value}, model_dir)
        assert flag_values(args, "--model-repository") == [str(model_dir)]
        assert updates["SAGEMAKER_TRITON_PING_MODE"] == "ready"


def test_ping_mode_override_single_model(model_dir: Path) -> None:
    _, updates = sme({"SAGEMAKER_TRITON_OVERRIDE_PING_MODE": "live"}, model_dir)
    assert updates["SAGEMAKER_TRITON_PING_MODE"] == "live"


# -- multi-model endpoint -------------------------------------------------------------------------------------------


def test_defaults_multi_model(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args, updates = mme({}, tmp_path)
    assert args == FIXED + [f"--model-repository={tmp_path / 'sagemaker'}",
                            f"--sagemaker-models-root={tmp_path / 'models'}", *ENV_DEFAULTS]
    assert (tmp_path / "sagemaker").is_dir()  # the placeholder repository exists, as mkdir -p makes it
    assert updates == {"SAGEMAKER_TRITON_PING_MODE": "live"}
    assert capsys.readouterr().err == 'naiad is running in SageMaker MME mode. Using naiad ping mode: "live"\n'


def test_multi_model_ignores_the_single_model_layout(tmp_path: Path) -> None:
    # No model folder, a stray config.pbtxt, a default name that does not exist: none of it matters in MME mode.
    single = tmp_path / "unused"
    single.mkdir()
    (single / "config.pbtxt").write_text("")
    args, updates = mme({"SAGEMAKER_TRITON_DEFAULT_MODEL_NAME": "nope"}, tmp_path)
    assert flag_values(args, "--load-model") == []
    assert "SAGEMAKER_TRITON_DEFAULT_MODEL_NAME" not in updates


def test_ping_mode_override_multi_model(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _, updates = mme({"SAGEMAKER_TRITON_OVERRIDE_PING_MODE": "ready"}, tmp_path)
    assert updates == {"SAGEMAKER_TRITON_PING_MODE": "ready"}
    assert 'ping mode: "ready"' in capsys.readouterr().err


def test_multi_model_repo_that_cannot_be_made(tmp_path: Path) -> None:
    (tmp_path / "sagemaker").write_text("a file where the folder should be")
    with pytest.raises(SagemakerServeError, match="^ERROR: Cannot create the multi-model repository"):
        mme({}, tmp_path)


# -- flags from the environment -------------------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "value", "flag"), [
    ("SAGEMAKER_BIND_TO_PORT", "9090", "--sagemaker-port=9090"),
    ("SAGEMAKER_SAFE_PORT_RANGE", "9000-9999", "--sagemaker-safe-port-range=9000-9999"),
    ("SAGEMAKER_TRITON_METRICS_PORT", "9002", "--metrics-port=9002"),
    ("SAGEMAKER_TRITON_GRPC_PORT", "9001", "--grpc-port=9001"),
    ("SAGEMAKER_TRITON_BUFFER_MANAGER_THREAD_COUNT", "4", "--buffer-manager-thread-count=4"),
    ("SAGEMAKER_TRITON_THREAD_COUNT", "16", "--sagemaker-thread-count=16"),
    ("SAGEMAKER_TRITON_LOG_INFO", "false", "--log-info=false"),
    ("SAGEMAKER_TRITON_LOG_WARNING", "false", "--log-warning=false"),
    ("SAGEMAKER_TRITON_LOG_ERROR", "false", "--log-error=false"),
    ("SAGEMAKER_TRITON_TENSORFLOW_VERSION", "2", "--backend-config=tensorflow,version=2"),
])
def test_optional_flags(model_dir: Path, name: str, value: str, flag: str) -> None:
    without, _ = sme({}, model_dir)
    assert flag not in without
    args, _ = sme({name: value}, model_dir)
    assert [arg for arg in args if arg not in without] == [flag]
    assert sme({name: ""}, model_dir)[0] == without  # empty is unset, as the script's -n test has it


@pytest.mark.parametrize(("name", "flag", "default"), [
    ("SAGEMAKER_TRITON_ALLOW_GRPC", "--allow-grpc", "false"),
    ("SAGEMAKER_TRITON_ALLOW_METRICS", "--allow-metrics", "false"),
    ("SAGEMAKER_TRITON_DISABLE_MODEL_NAMESPACING", "--model-namespacing", "true"),
])
def test_flags_with_defaults(model_dir: Path, name: str, flag: str, default: str) -> None:
    assert flag_values(sme({}, model_dir)[0], flag) == [default]
    assert flag_values(sme({name: ""}, model_dir)[0], flag) == [default]
    # The value goes through as given (the script passes the DISABLE variable's value itself too).
    other = "true" if default == "false" else "false"
    assert flag_values(sme({name: other}, model_dir)[0], flag) == [other]


@pytest.mark.parametrize(("value", "level"), [
    ("", "0"), ("true", "1"), ("TRUE", "1"), ("false", "0"), ("False", "0"), ("0", "0"), ("1", "1"), ("3", "3"),
])
def test_log_verbose_becomes_a_level(model_dir: Path, value: str, level: str) -> None:
    env = {"SAGEMAKER_TRITON_LOG_VERBOSE": value} if value else {}
    assert flag_values(sme(env, model_dir)[0], "--log-verbose") == [level]


def test_shared_memory_sizes(model_dir: Path) -> None:
    args, _ = sme({"SAGEMAKER_TRITON_SHM_DEFAULT_BYTE_SIZE": "33554432",
                   "SAGEMAKER_TRITON_SHM_GROWTH_BYTE_SIZE": "2097152"}, model_dir)
    assert flag_values(args, "--backend-config") == ["python,shm-default-byte-size=33554432",
                                                     "python,shm-growth-byte-size=2097152"]


def test_additional_args_come_last_split_as_a_shell_would(model_dir: Path) -> None:
    extra = "--model-config-name=cpu --backend-config='python,execution-env=/opt/env with space' --strict-readiness"
    args, _ = sme({"SAGEMAKER_TRITON_ADDITIONAL_ARGS": extra, "SAGEMAKER_BIND_TO_PORT": "9090"}, model_dir)
    assert args[-3:] == shlex.split(extra)
    assert args[-3:] == ["--model-config-name=cpu", "--backend-config=python,execution-env=/opt/env with space",
                         "--strict-readiness"]
    assert args.index("--load-model=add_sub") < args.index("--model-config-name=cpu")


def test_additional_args_with_unbalanced_quotes(model_dir: Path) -> None:
    with pytest.raises(SagemakerServeError, match="^ERROR: Cannot split SAGEMAKER_TRITON_ADDITIONAL_ARGS"):
        sme({"SAGEMAKER_TRITON_ADDITIONAL_ARGS": "--model-config-name='cpu"}, model_dir)


def test_every_variable_at_once_keeps_the_script_order(model_dir: Path) -> None:
    env = {
        "SAGEMAKER_TRITON_DISABLE_MODEL_NAMESPACING": "false",
        "SAGEMAKER_BIND_TO_PORT": "9090",
        "SAGEMAKER_SAFE_PORT_RANGE": "9000-9999",
        "SAGEMAKER_TRITON_ALLOW_GRPC": "true",
        "SAGEMAKER_TRITON_ALLOW_METRICS": "true",
        "SAGEMAKER_TRITON_METRICS_PORT": "9002",
        "SAGEMAKER_TRITON_GRPC_PORT": "9001",
        "SAGEMAKER_TRITON_BUFFER_MANAGER_THREAD_COUNT": "2",
        "SAGEMAKER_TRITON_THREAD_COUNT": "4",
        "SAGEMAKER_TRITON_LOG_VERBOSE": "false",
        "SAGEMAKER_TRITON_LOG_INFO": "true",
        "SAGEMAKER_TRITON_LOG_WARNING": "true",
        "SAGEMAKER_TRITON_LOG_ERROR": "true",
        "SAGEMAKER_TRITON_SHM_DEFAULT_BYTE_SIZE": "1",
        "SAGEMAKER_TRITON_SHM_GROWTH_BYTE_SIZE": "2",
        "SAGEMAKER_TRITON_TENSORFLOW_VERSION": "2",
        "SAGEMAKER_TRITON_INFERENCE_TYPE": "generate",
        "SAGEMAKER_TRITON_DEFAULT_MODEL_NAME": "add_sub",
        "SAGEMAKER_TRITON_ADDITIONAL_ARGS": "--exit-on-error=false",
    }
    args, updates = sme(env, model_dir)
    assert args == FIXED + [
        f"--model-repository={model_dir}",
        "--model-namespacing=false",
        "--sagemaker-port=9090",
        "--sagemaker-safe-port-range=9000-9999",
        "--allow-grpc=true",
        "--allow-metrics=true",
        "--metrics-port=9002",
        "--grpc-port=9001",
        "--buffer-manager-thread-count=2",
        "--sagemaker-thread-count=4",
        "--log-verbose=0",
        "--log-info=true",
        "--log-warning=true",
        "--log-error=true",
        "--exit-timeout-secs=8",
        "--backend-config=python,shm-default-byte-size=1",
        "--backend-config=python,shm-growth-byte-size=2",
        "--backend-config=tensorflow,version=2",
        "--load-model=add_sub",
        "--exit-on-error=false",
    ]
    assert updates == {"SAGEMAKER_TRITON_PING_MODE": "ready"}


# -- SAGEMAKER_TRITON_INFERENCE_TYPE (the newest script's check) ----------------------------------------------------


@pytest.mark.parametrize("value", ["infer", "generate", "generate_stream", ""])
def test_inference_types_accepted(model_dir: Path, value: str) -> None:
    sme({"SAGEMAKER_TRITON_INFERENCE_TYPE": value}, model_dir)


@pytest.mark.parametrize("multi_model", [False, True])
def test_invalid_inference_type(model_dir: Path, tmp_path: Path, multi_model: bool) -> None:
    env = {"SAGEMAKER_TRITON_INFERENCE_TYPE": "Generate"}
    with pytest.raises(SagemakerServeError) as caught:
        mme(env, tmp_path) if multi_model else sme(env, model_dir)
    assert caught.value.message == ("ERROR: Invalid SAGEMAKER_TRITON_INFERENCE_TYPE 'Generate'\n"
                                    "       Must be one of: infer, generate, generate_stream")


def test_checks_run_in_the_script_order(tmp_path: Path) -> None:
    # A bad layout is reported before a bad inference type, which is reported before a missing default model.
    (tmp_path / "config.pbtxt").write_text("")
    env = {"SAGEMAKER_TRITON_INFERENCE_TYPE": "bad", "SAGEMAKER_TRITON_DEFAULT_MODEL_NAME": "nope"}
    with pytest.raises(SagemakerServeError, match="Incorrect directory structure"):
        sme(env, tmp_path)
    (tmp_path / "config.pbtxt").unlink()
    with pytest.raises(SagemakerServeError, match="Invalid SAGEMAKER_TRITON_INFERENCE_TYPE"):
        sme(env, tmp_path)


# -- SAGEMAKER_TRITON_MODEL_LOAD_GPU_LIMIT --------------------------------------------------------------------------


def fake_nvidia_smi(folder: Path, stdout: str, status: int = 0) -> None:
    folder.mkdir(exist_ok=True)
    program = folder / "nvidia-smi"
    program.write_text(f"#!/bin/sh\nprintf '%s' {shlex.quote(stdout)}\nexit {status}\n")
    program.chmod(0o755)


def test_gpu_limit_per_gpu(model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_nvidia_smi(tmp_path / "bin", "GPU 0: A10G (UUID: GPU-0)\nGPU 1: A10G (UUID: GPU-1)\n")
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    args, _ = sme({"SAGEMAKER_TRITON_MODEL_LOAD_GPU_LIMIT": "0.8"}, model_dir)
    assert flag_values(args, "--model-load-gpu-limit") == ["0:0.8", "1:0.8"]


def test_gpu_limit_without_nvidia_smi(model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "empty").mkdir()
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    args, _ = sme({"SAGEMAKER_TRITON_MODEL_LOAD_GPU_LIMIT": "0.8"}, model_dir)
    assert flag_values(args, "--model-load-gpu-limit") == []
    assert args == sme({}, model_dir)[0]
    assert "SAGEMAKER_TRITON_MODEL_LOAD_GPU_LIMIT ignored" in capsys.readouterr().err


def test_gpu_limit_with_a_failing_driver(model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # nvidia-smi prints its complaint on stdout; that line is not a GPU.
    fake_nvidia_smi(tmp_path / "bin", "NVIDIA-SMI has failed because it couldn't communicate with the driver.\n", 9)
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    args, _ = sme({"SAGEMAKER_TRITON_MODEL_LOAD_GPU_LIMIT": "0.8"}, model_dir)
    assert flag_values(args, "--model-load-gpu-limit") == []


# -- main -----------------------------------------------------------------------------------------------------------


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """No SageMaker variable from the machine running the tests; whatever main() exports is undone after."""
    for name in list(os.environ):
        if name.startswith("SAGEMAKER_"):
            monkeypatch.delenv(name)
    for name in ("SAGEMAKER_TRITON_PING_MODE", "SAGEMAKER_TRITON_DEFAULT_MODEL_NAME"):
        # Set, then removed: monkeypatch records only what it changes, so an absent name must be changed to be
        # removed again after main() exports it (it leaked into the servers later tests start).
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    return monkeypatch


def test_main_bad_layout_prints_the_error_lines(tmp_path: Path, clean_env: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "config.pbtxt").write_text('backend: "python"\n')
    (tmp_path / "1").mkdir()
    assert sagemaker_serve.main(["serve", "--model-dir", str(tmp_path)], _never) == 1
    assert capsys.readouterr().err.splitlines() == [
        "ERROR: Incorrect directory structure.",
        "       Model directory needs to contain the top level folder",
    ]


def test_main_two_models_prints_the_error_lines(model_dir: Path, clean_env: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    (model_dir / "b").mkdir()
    assert sagemaker_serve.main(["serve", "--model-dir", str(model_dir)], _never) == 1
    err = capsys.readouterr().err.splitlines()
    assert err[0] == "ERROR: More than 1 model directory found in model repository."
    assert err[-1] == "       Directories found in model repository: add_sub b"


def _never(argv: list[str]) -> int:
    raise AssertionError(f"naiad serve started with {argv}")


def test_main_starts_naiad_serve(model_dir: Path, tmp_path: Path, clean_env: pytest.MonkeyPatch) -> None:
    started: list[list[str]] = []
    seen_env: dict[str, str | None] = {}

    def fake_cli_main(argv: list[str]) -> int:
        started.append(argv)
        seen_env.update({name: os.environ.get(name)
                         for name in ("SAGEMAKER_TRITON_PING_MODE", "SAGEMAKER_TRITON_DEFAULT_MODEL_NAME")})
        return 7

    clean_env.setenv("SAGEMAKER_BIND_TO_PORT", "9123")
    code = sagemaker_serve.main(["serve", "--model-dir", str(model_dir), "--models-root", str(tmp_path / "r"),
                                 "--multi-model-repo", str(tmp_path / "m")], fake_cli_main)
    assert code == 7
    assert started == [build_serve_args({"SAGEMAKER_BIND_TO_PORT": "9123"}, model_dir=model_dir)[0]]
    assert seen_env == {"SAGEMAKER_TRITON_PING_MODE": "ready", "SAGEMAKER_TRITON_DEFAULT_MODEL_NAME": "add_sub"}


def test_main_multi_model_paths(tmp_path: Path, clean_env: pytest.MonkeyPatch) -> None:
    started: list[list[str]] = []
    clean_env.setenv("SAGEMAKER_MULTI_MODEL", "true")
    assert sagemaker_serve.main(["serve", "--models-root", str(tmp_path / "r"), "--multi-model-repo",
                                 str(tmp_path / "m")], lambda argv: started.append(argv) or 0) == 0
    assert f"--model-repository={tmp_path / 'm'}" in started[0]
    assert f"--sagemaker-models-root={tmp_path / 'r'}" in started[0]
    assert os.environ["SAGEMAKER_TRITON_PING_MODE"] == "live"


def test_main_usage(capsys: pytest.CaptureFixture[str]) -> None:
    assert sagemaker_serve.main([], _never) == 2
    assert sagemaker_serve.main(["train"], _never) == 2
    assert sagemaker_serve.main(["serve", "--help"], _never) == 0
    assert "--model-dir" in capsys.readouterr().out


def test_help_lists_every_environment_variable_read(capsys: pytest.CaptureFixture[str]) -> None:
    # Every SAGEMAKER_* name the script and the server's SageMaker options read, found in their source.
    sources = [ROOT / "naiad" / "sagemaker" / "serve.py", ROOT / "naiad" / "sagemaker" / "options.py"]
    read = {name for path in sources for name in re.findall(r"SAGEMAKER_[A-Z_]*[A-Z]", path.read_text())}
    read -= {"SAGEMAKER_TRITON_LOG"}  # the prefix of SAGEMAKER_TRITON_LOG_{level}
    assert sagemaker_serve.main(["serve", "--help"], lambda _: 1) == 0
    shown = capsys.readouterr().out
    for level in ("INFO", "WARNING", "ERROR"):  # read as SAGEMAKER_TRITON_LOG_{level}
        assert f"_{level}" in shown
    missing = sorted(name for name in read if name not in shown)
    assert not missing, missing


# -- Dockerfile -----------------------------------------------------------------------------------------------------


def dockerfile_instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, with comments dropped and continuation lines joined."""
    instructions: list[tuple[str, str]] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        keyword, _, rest = (pending + line).partition(" ")
        instructions.append((keyword.upper(), rest.strip()))
        pending = ""
    assert not pending, "the Dockerfile ends inside a continued line"
    return instructions


def test_dockerfile() -> None:
    instructions = dockerfile_instructions((ROOT / "Dockerfile").read_text())
    final = [i for i, (keyword, _) in enumerate(instructions) if keyword == "FROM"][-1]
    assert instructions[final][1] == "python:3.11-slim"
    stage = instructions[final:]
    values = {keyword: [rest for kw, rest in stage if kw == keyword] for keyword, _ in stage}

    assert [json.loads(rest) for rest in values["ENTRYPOINT"]] == [["naiad", "sagemaker"]]
    assert [json.loads(rest) for rest in values["CMD"]] == [["serve"]]
    assert values["EXPOSE"] == ["8080"]
    labels = {label for rest in values["LABEL"] for label in shlex.split(rest)}
    assert "com.amazonaws.sagemaker.capabilities.accept-bind-to-port=true" in labels
    assert "com.amazonaws.sagemaker.capabilities.multi-models=true" in labels


def test_dockerfile_copies_what_the_build_context_holds() -> None:
    """Every COPY source from the build context exists and is not excluded by .dockerignore."""
    instructions = dockerfile_instructions((ROOT / "Dockerfile").read_text())
    ignored = {line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
               if line.strip() and not line.startswith("#")}
    copied = [rest.split() for keyword, rest in instructions if keyword == "COPY" and "--from=" not in rest]
    sources = [source for parts in copied for source in parts[:-1]]
    assert {"pyproject.toml", "README.md", "naiad"} <= set(sources)
    for source in sources:
        assert (ROOT / source).exists(), source
        assert source not in ignored, source
