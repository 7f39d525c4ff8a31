"""``naiad sagemaker serve``: what Triton's ``docker/sagemaker/serve`` script does before it starts the server.

SageMaker starts a hosting container as ``docker run IMAGE serve`` and describes the endpoint only through the
environment (``SAGEMAKER_MULTI_MODEL``, ``SAGEMAKER_BIND_TO_PORT``, ...). Triton's script turns that environment into
``tritonserver`` flags, checks the single-model layout of ``/opt/ml/model`` and picks the default model; this module
does the same for ``naiad serve``, with the script's messages so logs read the same.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Callable, Mapping

from naiad.sagemaker.options import INFERENCE_TYPES

DEFAULT_SHM_BYTE_SIZE = "16777216"  # 16 MB, the script's default for the python backend
DEFAULT_SHM_GROWTH_BYTE_SIZE = "1048576"  # 1 MB
EXIT_TIMEOUT_SECS = 8  # within docker stop's 10 s grace, with room to finalize and exit

_TRUE = ("true", "on", "yes")
_FALSE = ("false", "off", "no")


# What the script (and the server after it) reads from the environment, as --help lists it.
ENVIRONMENT = (
    ("SAGEMAKER_MULTI_MODEL", "'true': a multi-model endpoint (models loaded through POST /models)"),
    ("SAGEMAKER_BIND_TO_PORT", "the SageMaker port (--sagemaker-port; default 8080)"),
    ("SAGEMAKER_SAFE_PORT_RANGE", "LOW-HIGH: the ports gRPC and metrics may use (--sagemaker-safe-port-range)"),
    ("SAGEMAKER_TRITON_DEFAULT_MODEL_NAME", "the single-model endpoint's model (default: the only folder there is)"),
    ("SAGEMAKER_TRITON_OVERRIDE_PING_MODE", "ready | live: what /ping reports (default: ready, live on a multi-model "
                                            "endpoint); passed on as SAGEMAKER_TRITON_PING_MODE"),
    ("SAGEMAKER_TRITON_INFERENCE_TYPE", "infer | generate | generate_stream: what /invocations runs (default infer)"),
    ("SAGEMAKER_TRITON_ADDITIONAL_ARGS", "more 'naiad serve' flags, split as a shell would, applied last"),
    ("SAGEMAKER_TRITON_THREAD_COUNT", "--sagemaker-thread-count"),
    ("SAGEMAKER_TRITON_ALLOW_GRPC", "true | false: serve gRPC too (default false)"),
    ("SAGEMAKER_TRITON_GRPC_PORT", "--grpc-port"),
    ("SAGEMAKER_TRITON_ALLOW_METRICS", "true | false: serve /metrics too (default false)"),
    ("SAGEMAKER_TRITON_METRICS_PORT", "--metrics-port"),
    ("SAGEMAKER_TRITON_BUFFER_MANAGER_THREAD_COUNT", "--buffer-manager-thread-count"),
    ("SAGEMAKER_TRITON_LOG_VERBOSE", "true: --log-verbose=1, a line per request and per /ping (default false, "
                                     "where Triton's script says true)"),
    ("SAGEMAKER_TRITON_LOG_INFO / _WARNING / _ERROR", "--log-info, --log-warning, --log-error"),
    ("SAGEMAKER_TRITON_SHM_DEFAULT_BYTE_SIZE", f"the Python backend's shm-default-byte-size (default "
                                               f"{DEFAULT_SHM_BYTE_SIZE})"),
    ("SAGEMAKER_TRITON_SHM_GROWTH_BYTE_SIZE", f"the Python backend's shm-growth-byte-size (default "
                                              f"{DEFAULT_SHM_GROWTH_BYTE_SIZE})"),
    ("SAGEMAKER_TRITON_MODEL_LOAD_GPU_LIMIT", "--model-load-gpu-limit for every GPU nvidia-smi lists"),
    ("SAGEMAKER_TRITON_TENSORFLOW_VERSION", "--backend-config=tensorflow,version=..."),
    ("SAGEMAKER_TRITON_DISABLE_MODEL_NAMESPACING", "the value of --model-namespacing (default true), as the script "
                                                   "passes it"),
)


def _environment_help() -> str:
    width = max(len(name) for name, _ in ENVIRONMENT)
    lines = [f"  {name.ljust(width)}  {text}" for name, text in ENVIRONMENT]
    return "environment variables read (as Triton's docker/sagemaker/serve script reads them):\n" + "\n".join(lines)


class SagemakerServeError(Exception):
    """The layout or environment the script refuses; the message is its ``ERROR:`` lines."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def _say(*lines: str) -> None:
    print("\n".join(lines), file=sys.stderr, flush=True)


def _verbosity(value: str) -> str:
    """The script passes ``--log-verbose=true``; ``naiad serve`` takes a level, so booleans become 1 / 0."""
    lowered = value.strip().lower()
    if lowered in _TRUE:
        return "1"
    if lowered in _FALSE:
        return "0"
    return value


def _gpu_count() -> int:
    """GPUs as ``nvidia-smi -L`` lists them; none when it is missing or fails (a CPU host)."""
    program = shutil.which("nvidia-smi")
    if program is None:
        return 0
    try:
        listing = subprocess.run([program, "-L"], capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.SubprocessError):
        return 0
    if listing.returncode != 0:
        return 0
    # Count only "GPU n: ..." lines: a failing driver prints its complaint on stdout too.
    return sum(1 for line in listing.stdout.splitlines() if line.startswith("GPU "))


def _model_folders(model_dir: Path) -> list[str]:
    """Folders directly in ``model_dir`` (as ``find -mindepth 1 -maxdepth 1 -type d``: links not followed)."""
    try:
        entries = list(os.scandir(model_dir))
    except OSError:
        return []  # a missing model dir is "No model found", as find's empty answer is in the script
    return sorted(entry.name for entry in entries if entry.is_dir(follow_symlinks=False))


def _flags_from_env(env: Mapping[str, str]) -> list[str]:
    """The flags the script derives from the environment alone, in its order."""
    args: list[str] = []

    def given(name: str) -> str:
        return env.get(name, "")  # the script tests with -n: an empty value counts as unset

    # The script hands the DISABLE variable's value straight to --model-namespacing; kept as it does.
    args.append(f"--model-namespacing={given('SAGEMAKER_TRITON_DISABLE_MODEL_NAMESPACING') or 'true'}")
    if given("SAGEMAKER_BIND_TO_PORT"):
        args.append(f"--sagemaker-port={env['SAGEMAKER_BIND_TO_PORT']}")
    if given("SAGEMAKER_SAFE_PORT_RANGE"):
        args.append(f"--sagemaker-safe-port-range={env['SAGEMAKER_SAFE_PORT_RANGE']}")
    args.append(f"--allow-grpc={given('SAGEMAKER_TRITON_ALLOW_GRPC') or 'false'}")
    args.append(f"--allow-metrics={given('SAGEMAKER_TRITON_ALLOW_METRICS') or 'false'}")
    optional = (
        ("SAGEMAKER_TRITON_METRICS_PORT", "--metrics-port"),
        ("SAGEMAKER_TRITON_GRPC_PORT", "--grpc-port"),
        ("SAGEMAKER_TRITON_BUFFER_MANAGER_THREAD_COUNT", "--buffer-manager-thread-count"),
        ("SAGEMAKER_TRITON_THREAD_COUNT", "--sagemaker-thread-count"),
    )
    args.extend(f"{flag}={env[name]}" for name, flag in optional if given(name))
    # Triton's script turns verbose logging on unless told otherwise: a line per /ping and per request, which
    # fills an endpoint's CloudWatch log with health checks. Off here unless the environment asks for it.
    args.append(f"--log-verbose={_verbosity(given('SAGEMAKER_TRITON_LOG_VERBOSE') or 'false')}")
    for level in ("INFO", "WARNING", "ERROR"):
        if given(f"SAGEMAKER_TRITON_LOG_{level}"):
            args.append(f"--log-{level.lower()}={env[f'SAGEMAKER_TRITON_LOG_{level}']}")
    # docker stop (and SageMaker's) sends SIGTERM, then SIGKILL 10 s later; naiad's own default (30 s, Triton's)
    # would be cut short by it. In-flight requests get 8 s, and the process exits within docker's grace. Longer
    # requests: SAGEMAKER_TRITON_ADDITIONAL_ARGS=--exit-timeout-secs=N, with docker stop -t above N.
    args.append(f"--exit-timeout-secs={EXIT_TIMEOUT_SECS}")
    shm_default = given("SAGEMAKER_TRITON_SHM_DEFAULT_BYTE_SIZE") or DEFAULT_SHM_BYTE_SIZE
    shm_growth = given("SAGEMAKER_TRITON_SHM_GROWTH_BYTE_SIZE") or DEFAULT_SHM_GROWTH_BYTE_SIZE
    args.append(f"--backend-config=python,shm-default-byte-size={shm_default}")
    args.append(f"--backend-config=python,shm-growth-byte-size={shm_growth}")
    if given("SAGEMAKER_TRITON_TENSORFLOW_VERSION"):
        args.append(f"--backend-config=tensorflow,version={env['SAGEMAKER_TRITON_TENSORFLOW_VERSION']}")
    if given("SAGEMAKER_TRITON_MODEL_LOAD_GPU_LIMIT"):
        gpus = _gpu_count()
        if gpus == 0:
            _say("INFO: SAGEMAKER_TRITON_MODEL_LOAD_GPU_LIMIT ignored: no GPU found (nvidia-smi -L lists none)")
        limit = env["SAGEMAKER_TRITON_MODEL_LOAD_GPU_LIMIT"]
        args.extend(f"--model-load-gpu-limit={gpu}:{limit}" for gpu in range(gpus))
    return args


def _check_inference_type(env: Mapping[str, str]) -> None:
    inference_type = env.get("SAGEMAKER_TRITON_INFERENCE_TYPE", "")
    if inference_type and inference_type not in INFERENCE_TYPES:
        raise SagemakerServeError(
            f"ERROR: Invalid SAGEMAKER_TRITON_INFERENCE_TYPE '{inference_type}'\n"
            f"       Must be one of: {', '.join(INFERENCE_TYPES)}")


def _default_model(env: Mapping[str, str], model_dir: Path, updates: dict[str, str]) -> str:
    """The single-model endpoint's model: the one named, or the only folder there is."""
    named = env.get("SAGEMAKER_TRITON_DEFAULT_MODEL_NAME", "")
    if named:
        if not (model_dir / named).is_dir():
            raise SagemakerServeError(
                f"ERROR: Directory with provided SAGEMAKER_TRITON_DEFAULT_MODEL_NAME {named} does not exist")
        return named
    folders = _model_folders(model_dir)
    if not folders:
        raise SagemakerServeError(f"ERROR: No model found in model repository {model_dir}")
    if len(folders) > 1:
        raise SagemakerServeError(
            "ERROR: More than 1 model directory found in model repository.\n"
            "       Either provide a single directory or set SAGEMAKER_TRITON_DEFAULT_MODEL_NAME to run the "
            "ensemble backend.\n"
            f"       Directories found in model repository: {' '.join(folders)}")
    _say("WARNING: No SAGEMAKER_TRITON_DEFAULT_MODEL_NAME provided.",
         f"         Starting with the only existing model directory {folders[0]}")
    # The server serves /invocations to this model: it reads the name from the environment.
    updates["SAGEMAKER_TRITON_DEFAULT_MODEL_NAME"] = folders[0]
    return folders[0]


def build_serve_args(env: Mapping[str, str], model_dir: Path = Path("/opt/ml/model"),
                     multi_model_repo: Path = Path("/tmp/sagemaker"),
                     models_root: Path = Path("/opt/ml/models")) -> tuple[list[str], dict[str, str]]:
    """The ``naiad serve ...`` argument list (starting with "serve") and the environment variables the server
    needs on top of ``env``, as Triton's serve script computes them.

    Multi-model mode creates ``multi_model_repo`` (an empty placeholder repository, as in the script: each model
    SageMaker loads is its own repository under ``models_root``). Raises SagemakerServeError with the script's
    ERROR lines; its warnings and notes go to stderr.
    """
    override = env.get("SAGEMAKER_TRITON_OVERRIDE_PING_MODE", "")
    multi_model = env.get("SAGEMAKER_MULTI_MODEL", "") == "true"  # exactly "true", as the script compares
    ping_mode = override or ("live" if multi_model else "ready")
    updates = {"SAGEMAKER_TRITON_PING_MODE": ping_mode}
    if multi_model:
        try:
            multi_model_repo.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise SagemakerServeError(f"ERROR: Cannot create the multi-model repository {multi_model_repo}: "
                                      f"{exc.strerror}") from None
        _say(f'naiad is running in SageMaker MME mode. Using naiad ping mode: "{ping_mode}"')

    args = ["serve", "--allow-sagemaker=true", "--allow-http=false", "--model-control-mode=explicit",
            f"--model-repository={multi_model_repo if multi_model else model_dir}"]
    if multi_model:
        args.append(f"--sagemaker-models-root={models_root}")
    args.extend(_flags_from_env(env))

    # The script's checks, in its order: layout first, then the inference type, then the default model.
    if not multi_model and (model_dir / "config.pbtxt").is_file():
        raise SagemakerServeError("ERROR: Incorrect directory structure.\n"
                                  "       Model directory needs to contain the top level folder")
    _check_inference_type(env)
    if not multi_model:
        args.append(f"--load-model={_default_model(env, model_dir, updates)}")

    extra = env.get("SAGEMAKER_TRITON_ADDITIONAL_ARGS", "")
    if extra:
        try:
            args.extend(shlex.split(extra))  # last, so they can override anything above
        except ValueError as exc:  # unbalanced quotes: bash would have refused the line too
            raise SagemakerServeError(f"ERROR: Cannot split SAGEMAKER_TRITON_ADDITIONAL_ARGS: {exc}") from None
    return args, updates


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="naiad sagemaker",
        description="Run as a SageMaker hosting container: read SageMaker's environment as Triton's serve "
                    "script does, then start 'naiad serve'.")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="start the server the way 'docker run IMAGE serve' asks for",
                                description="Read SageMaker's environment as Triton's serve script does, then start "
                                            "'naiad serve'.",
                                epilog=_environment_help(), formatter_class=argparse.RawDescriptionHelpFormatter)
    serve.add_argument("--model-dir", type=Path, default=Path("/opt/ml/model"),
                       help="the single-model endpoint's model folder (SageMaker: /opt/ml/model)")
    serve.add_argument("--models-root", type=Path, default=Path("/opt/ml/models"),
                       help="where SageMaker puts multi-model endpoint models (SageMaker: /opt/ml/models)")
    serve.add_argument("--multi-model-repo", type=Path, default=Path("/tmp/sagemaker"),
                       help="the empty placeholder repository of multi-model mode")
    return parser


def main(argv: list[str], serve: Callable[[list[str]], int]) -> int:
    """``serve``: what runs ``naiad serve`` with the flags built here (``naiad.cli.main``, which calls this:
    passed in, so this module needs nothing from the command line's)."""
    try:
        options = _parser().parse_args(argv)
    except SystemExit as exc:  # --help or a usage error: argparse has printed it
        return exc.code if isinstance(exc.code, int) else 2
    try:
        args, updates = build_serve_args(os.environ, model_dir=options.model_dir,
                                         multi_model_repo=options.multi_model_repo,
                                         models_root=options.models_root)
    except SagemakerServeError as exc:
        _say(exc.message)
        return 1
    os.environ.update(updates)
    return serve(args)
