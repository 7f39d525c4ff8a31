"""Run Triton's own QA suites and tritonclient's example scripts against naiad (or, to compare, a real
tritonserver), from checkouts you provide: nothing is fetched and nothing of theirs is copied into naiad.

    python tools/run_triton_qa.py --server-repo ~/src/server --client-repo ~/src/client \
        [--python-backend-repo ~/src/python_backend] [--suites L0_http,L0_grpc,...] [--isolate]

Take the checkouts at the release naiad follows (``r24.10``). The QA folders are copied into a work folder and
their own ``test.sh`` runs there, so the model folders are the ones each ``test.sh`` builds; ``tritonserver`` is
a wrapper that starts naiad with the same flags. What Triton's CI takes from elsewhere is made here on CPU:
``$DATADIR``'s repositories by the checkout's own ``qa/common/gen_qa_*_models.py --onnx``, and the example
repository (``simple``, ``simple_int8``, ``simple_string`` as ONNX graphs with the same names, dims and
arithmetic as Triton's TensorFlow ones; ``simple_identity`` in Python; an ONNX image classifier with densenet's
signature and random weights). Package installs, GPU probes and git clones in the scripts are stubbed.
Each test is counted from the JUnit files of its pytest run; every test runs under a timeout (a hang is a
failure). The QA files hard-code ports 8000-8002: ``--isolate`` runs everything in a private network namespace
(``unshare -rn``) so that a busy port on the host does not matter."""

from __future__ import annotations

import argparse
import importlib.util
import os
import shlex
import shutil
import signal
import subprocess
import sys
import textwrap
import time
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SUITES = ("L0_http", "L0_grpc", "L0_parameters", "L0_backend_python")
# L0_backend_python's subtests, each its own test.sh. Left out, with the reason the report prints.
BACKEND_PYTHON_SKIPPED = {
    "env": "builds conda-pack environments and a custom stub (network, C++ build)",
    "variants": "rebuilds the python backend stub with other flags (C++ build)",
    "restart": "not run by Triton's own test.sh either",
    "examples": "covered by the example clients below (jax/pytorch need packages naiad's CI lacks)",
}
# Subtests whose test.sh adds GPU-tensor models unless TEST_WINDOWS=1 ("until Windows supports GPU tensors, only
# test CPU scenarios"): run with it, i.e. their CPU variant.
BACKEND_PYTHON_CPU_VARIANT = ("ensemble", "bls", "decoupled")
# Tests that cannot pass on a GPU-less host whatever the server, by pytest node id in their folder: not run,
# reported as skipped with the reason.
_GPU_IO = "GPU: its models place tensors on the GPU as the request asks"
SKIPPED_TESTS = {
    "decoupled_test.py::DecoupledTest::test_decoupled_bls":
        "GPU: its model runs GPU-tensor BLS unless on Windows; without a GPU it never sends the final flag",
    "python_test.py::PythonTest::test_gpu_tensor_error": "GPU: CUDA shared memory (cuda-python)",
    "python_test.py::PythonTest::test_dlpack_tensor_error": "GPU: CUDA shared memory (cuda-python)",
    "python_test.py::PythonTest::test_growth_error":
        "host: assumes the CI container's 1 GiB /dev/shm (docker --shm-size) so that 1 GiB fails",
    "io_test.py::IOTest::test_ensemble_io": _GPU_IO,
    "io_test.py::IOTest::test_empty_gpu_output": _GPU_IO,
    "io_test.py::IOTest::test_variable_gpu_output": _GPU_IO,
}
BACKEND_PYTHON_SUBTESTS = ("ensemble", "bls", "decoupled", "response_sender", "io", "python_based_backends",
                           "async_execute", "lifecycle", "argument_validation", "logging", "custom_metrics",
                           "model_control", "request_rescheduling")

SEQUENCE_CONFIG = """
    name: "simple_sequence"
    backend: "python"
    max_batch_size: 8
    sequence_batching {
      control_input [{ name: "START", control [{ kind: CONTROL_SEQUENCE_START, int32_false_true: [ 0, 1 ] }] },
                     { name: "READY", control [{ kind: CONTROL_SEQUENCE_READY, int32_false_true: [ 0, 1 ] }] }]
    }
    input [{ name: "INPUT", data_type: TYPE_INT32, dims: [ 1 ] }]
    output [{ name: "OUTPUT", data_type: TYPE_INT32, dims: [ 1 ] }]
"""
# A stand-in for the C++ simple_sequence (so the repository holds as many models as the QA files count): an
# accumulator per correlation ID, reset by START. The sequence examples check the C++ one's arithmetic (skipped).
SEQUENCE_MODEL = """
    import numpy as np
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def initialize(self, args):
            self.sums = {}

        def execute(self, requests):
            responses = []
            for r in requests:
                value = pb_utils.get_input_tensor_by_name(r, "INPUT").as_numpy().astype(np.int32)
                start = pb_utils.get_input_tensor_by_name(r, "START").as_numpy()
                key = r.correlation_id()
                total = value if start.any() else self.sums.get(key, 0) + value
                self.sums[key] = total
                responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT", total.astype(np.int32))]))
            return responses
"""
PASS_THROUGH_MODEL = """
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def execute(self, requests):
            return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", pb_utils.get_input_tensor_by_name(
                        r, "INPUT0").as_numpy())]) for r in requests]
"""
INCEPTION_CONFIG = """
    name: "inception_graphdef"
    platform: "onnxruntime_onnx"
    max_batch_size: 128
    input [{ name: "input", data_type: TYPE_FP32, format: FORMAT_NHWC, dims: [ 299, 299, 3 ] }]
    output [{ name: "InceptionV3/Predictions/Softmax", data_type: TYPE_FP32, dims: [ 1001 ],
              label_filename: "inception_labels.txt" }]
"""
CLASSIFIER_CONFIG = """
    name: "densenet_onnx"
    platform: "onnxruntime_onnx"
    max_batch_size: 0
    input [{ name: "data_0", data_type: TYPE_FP32, format: FORMAT_NCHW, dims: [ 3, 224, 224 ],
             reshape { shape: [ 1, 3, 224, 224 ] } }]
    output [{ name: "fc6_1", data_type: TYPE_FP32, dims: [ 1000 ], reshape { shape: [ 1, 1000, 1, 1 ] },
              label_filename: "labels.txt" }]
"""


def build_example_repository(repo: Path) -> None:
    """Triton's docs/examples/model_repository as far as CPU and naiad's backends go."""
    from tests import onnx_graphs as g
    from tests.models import write_model
    from tests.triton_examples import write_simple

    write_simple(repo)
    write_model(repo, "simple_sequence", SEQUENCE_CONFIG, SEQUENCE_MODEL)
    folder = g.write(repo, "densenet_onnx", g.image_classifier(), CLASSIFIER_CONFIG)
    (folder / "labels.txt").write_text("".join(f"CLASS_{i}\n" for i in range(1000)))
    folder = g.write(repo, "inception_graphdef", _inception(g), INCEPTION_CONFIG)
    (folder / "inception_labels.txt").write_text("".join(f"CLASS_{i}\n" for i in range(1001)))


def _inception(g):  # type: ignore[no-untyped-def]
    """inception_graphdef's signature (NHWC input [b,299,299,3] -> softmax [b,1001]), random weights."""
    import numpy as np
    from onnx import TensorProto, helper

    weights = np.random.default_rng(0).standard_normal((3, 1001)).astype(np.float32)
    nodes = [helper.make_node("ReduceMean", ["input"], ["pooled"], axes=[1, 2], keepdims=0),
             helper.make_node("MatMul", ["pooled", "W"], ["logits"]),
             helper.make_node("Softmax", ["logits"], ["InceptionV3/Predictions/Softmax"], axis=1)]
    return g.model(nodes, [g.tensor("input", "TYPE_FP32", ["batch", 299, 299, 3])],
                   [g.tensor("InceptionV3/Predictions/Softmax", "TYPE_FP32", ["batch", 1001])],
                   [helper.make_tensor("W", TensorProto.FLOAT, [3, 1001], weights.ravel().tolist())])


def generate_datadir(server_repo: Path, data: Path) -> None:
    """The ONNX part of $DATADIR, made by the checkout's own generators."""
    common = server_repo / "qa" / "common"
    for script, folder in (("gen_qa_identity_models.py", "qa_identity_model_repository"),
                           ("gen_qa_models.py", "qa_model_repository"),
                           ("gen_qa_implicit_models.py", "qa_sequence_implicit_model_repository")):
        if (data / folder).exists():
            continue
        subprocess.run([sys.executable, script, "--onnx", "--models_dir", str(data / folder)], cwd=common,
                       check=True, stdout=subprocess.DEVNULL)


SHIM_NOOP = "#!/bin/sh\necho \"[qa shim] skipped: $(basename $0) $*\" >&2\nexit 0\n"
SHIM_FAIL = "#!/bin/sh\necho \"[qa shim] not available: $(basename $0) $*\" >&2\nexit 1\n"

# `python x_test.py [Class[.test]]`: run as the script would (unittest.main), with a result that also writes a
# JUnit file, so every test is counted. Anything else goes to the interpreter unchanged.
PYTHON_SHIM = """#!{python}
import itertools, os, sys
args = sys.argv[1:]
if args and args[0].endswith(".py") and os.path.exists(args[0]) and "test" in os.path.basename(args[0]):
    sys.path.insert(0, {tools!r})
    import qa_unittest_shim
    qa_unittest_shim.run(args)
if args[:2] == ["-m", "pytest"]:  # a JUnit file of its own: scripts reuse one name for several runs
    n = next(i for i in itertools.count() if not os.path.exists(f"__qa_{{i}}.xml"))
    args = [a for a in args if not a.startswith("--junitxml")] + [f"--junitxml=__qa_{{n}}.xml"]
os.execv({python!r}, [{python!r}, *args])
"""

GIT_SHIM = """#!/bin/sh
# git clone .../python_backend [-b tag] [dest]: the local checkout instead
for last; do :; done
case "$*" in
  *clone*python_backend*) dest=python_backend; case "$last" in *python_backend*|-*) ;; *) dest=$last;; esac
     rm -rf "$dest"; exec cp -r "$QA_PYTHON_BACKEND" "$dest" ;;
esac
echo "[qa shim] skipped: git $*" >&2
exit 0
"""

NAIAD_WRAPPER = """#!/bin/sh
# tritonserver's command line, served by naiad
PYTHONPATH="$QA_NAIAD_ROOT${{PYTHONPATH:+:$PYTHONPATH}}" exec {python} -m naiad serve "$@"
"""

TRITON_WRAPPER = """#!{python}
# the real tritonserver (peers/triton.sh) with its own backends folder, the flags otherwise as given
import os, sys
args, skip = [], False
for a in sys.argv[1:]:
    if skip or a.startswith("--backend-directory="):
        skip = False
        continue
    if a == "--backend-directory":
        skip = True
        continue
    args.append(a)
env = {{k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}}
env["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in (env["QA_TRITON_LIBS"], env.get("LD_LIBRARY_PATH")) if p)
binary = env["QA_TRITON_BIN"]
os.execve(binary, [binary, "--backend-directory=" + env["QA_TRITON_BACKENDS"], *args], env)
"""


def make_tools(work: Path, target: str, triton_bin: str | None) -> dict[str, str]:
    shims = work / "shims"
    shims.mkdir(parents=True, exist_ok=True)
    for name in ("pip", "pip3", "apt", "apt-get", "wget", "nginx", "service", "go", "virtualenv", "conda",
                 "aws", "gsutil", "az", "nvidia-smi", "valgrind"):
        (shims / name).write_text(SHIM_NOOP)
    for name in ("python", "python3"):
        (shims / name).write_text(PYTHON_SHIM.format(python=sys.executable, tools=str(ROOT / "tools")))
    (shims / "git").write_text(GIT_SHIM)
    (shims / "pytest").write_text(f'#!/bin/sh\nexec "{shims}/python" -m pytest "$@"\n')
    triton_dir = work / "tritonserver"
    (triton_dir / "bin").mkdir(parents=True, exist_ok=True)
    (triton_dir / "backends").mkdir(exist_ok=True)
    env = {}
    if target == "naiad":
        (triton_dir / "bin" / "tritonserver").write_text(NAIAD_WRAPPER.format(python=sys.executable))
    else:
        assert triton_bin
        root = Path(triton_bin).resolve().parent.parent
        (triton_dir / "bin" / "tritonserver").write_text(TRITON_WRAPPER.format(python=sys.executable))
        env = {"QA_TRITON_BIN": triton_bin, "QA_TRITON_BACKENDS": str(root / "backends"),
               "QA_TRITON_LIBS": str(root.parent.parent / "nvidia_pytriton.libs")}
    for f in list(shims.iterdir()) + [triton_dir / "bin" / "tritonserver"]:
        f.chmod(0o755)
    return {"PATH": f"{shims}:{os.environ['PATH']}", "TRITON_DIR": str(triton_dir), **env}


UTIL_OVERRIDES = """

# --- naiad QA harness: no virtual environments (the harness's interpreter has the packages) ---
function setup_virtualenv() { :; }
function deactivate_virtualenv() { :; }
function gdb_helper() { :; }
"""


def add_repeat_model(repo: Path, python_backend: Path) -> None:
    folder = repo / "repeat_int32"
    (folder / "1").mkdir(parents=True, exist_ok=True)
    shutil.copy(python_backend / "examples" / "decoupled" / "repeat_model.py", folder / "1" / "model.py")
    shutil.copy(python_backend / "examples" / "decoupled" / "repeat_config.pbtxt", folder / "config.pbtxt")


def prepare_qa(server_repo: Path, qa: Path, examples: Path, python_backend: Path | None) -> None:
    src = server_repo / "qa"
    for name in ("common", "python_models", "images", *SUITES):
        if (qa / name).exists():
            shutil.rmtree(qa / name)
        shutil.copytree(src / name, qa / name, symlinks=True)
    with open(qa / "common" / "util.sh", "a") as f:
        f.write(UTIL_OVERRIDES)
    for suite in ("L0_http", "L0_grpc"):
        shutil.copytree(examples, qa / suite / "models", dirs_exist_ok=True)
    # L0_grpc's aio test counts 8 models where L0_http's counts 7 (Triton's CI serves them different folders):
    # python_backend's decoupled repeat_int32 example is the eighth.
    if python_backend is not None:
        add_repeat_model(qa / "L0_grpc" / "models", python_backend)
    # L0_parameters names its server by absolute path; the harness's wrapper stands in.
    script = qa / "L0_parameters" / "test.sh"
    script.write_text(script.read_text().replace("SERVER=/opt/tritonserver/bin/tritonserver",
                                                 "SERVER=${TRITON_DIR}/bin/tritonserver"))
    # L0_parameters' ensemble goes through Triton's C++ test backend "identity"; a Python identity stands in.
    identity = qa / "L0_parameters" / "model_repository" / "identity"
    config = identity / "config.pbtxt"
    config.write_text(config.read_text().replace('backend: "identity"', 'backend: "python"'))
    (identity / "1").mkdir(exist_ok=True)
    (identity / "1" / "model.py").write_text(textwrap.dedent(PASS_THROUGH_MODEL))
    # L0_backend_python's top-level script: its own checks, then the harness runs the subtests one by one.
    script = qa / "L0_backend_python" / "test.sh"
    text = script.read_text()
    cut = text.find('if [ "$TEST_JETSON" == "0" ]; then\n    SUBTESTS=')
    if cut > 0:
        text = text[:cut] + "exit $RET\n"
    # it wants the container's Python 3.10; the models here run on the harness's interpreter
    for check in ('python3 --version | grep "3.10"', 'python3 --version | grep "3.${PYTHON_ENV_VERSION}"'):
        text = text.replace(check, 'python3 --version | grep "3."')
    script.write_text(text)


def junit_results(folder: Path, since: float) -> list[tuple[str, str, str]]:
    out = []
    for xml in sorted(folder.rglob("*.xml")):
        if xml.stat().st_mtime < since or "models" in xml.parts:
            continue
        try:
            root = ET.parse(xml).getroot()
        except ET.ParseError:
            continue
        for case in root.iter("testcase"):
            name = f"{case.get('classname')}.{case.get('name')}"
            status, why = "pass", ""
            for child in case:
                if child.tag in ("failure", "error"):
                    status, why = "fail", (child.get("message") or "").splitlines()[0][:160] if child.get(
                        "message") else child.tag
                elif child.tag == "skipped":
                    status, why = "skip", (child.get("message") or "")[:160]
            out.append((name, status, why))
    return out


def run_script(folder: Path, env: dict[str, str], timeout: float, log: Path) -> None:
    with open(log, "wb") as f:
        proc = subprocess.Popen(["bash", "-x", "test.sh", "24.10"], cwd=folder, env=env, stdout=f,
                                stderr=subprocess.STDOUT, start_new_session=True)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            f.write(b"\n[qa harness] test.sh timed out\n")
        except BaseException:
            os.killpg(proc.pid, 9)
            raise
        # a server the script left behind (timed out, or not killed) must not hold the ports for the next one
        try:
            os.killpg(proc.pid, 9)
        except ProcessLookupError:
            pass
        proc.wait()
    time.sleep(1)


# tritonclient's example scripts: (script, arguments, server repository flags, what the output must contain)
EXAMPLES: list[tuple[str, list[str], list[str], str]] = [
    ("simple_http_infer_client.py", ["-v"], [], ""),
    ("simple_http_async_infer_client.py", ["-v"], [], ""),
    ("simple_http_aio_infer_client.py", ["-v"], [], ""),
    ("simple_http_string_infer_client.py", ["-v"], [], ""),
    ("simple_http_health_metadata.py", ["-v"], [], ""),
    ("simple_http_shm_client.py", ["-v"], [], ""),
    ("simple_http_shm_string_client.py", ["-v"], [], ""),
    ("reuse_infer_objects_client.py", ["-v"], [], ""),
    ("simple_grpc_infer_client.py", ["-v"], [], ""),
    ("simple_grpc_async_infer_client.py", ["-v"], [], ""),
    ("simple_grpc_aio_infer_client.py", ["-v"], [], ""),
    ("simple_grpc_string_infer_client.py", ["-v"], [], ""),
    ("simple_grpc_health_metadata.py", ["-v"], [], ""),
    ("simple_grpc_shm_client.py", ["-v"], [], ""),
    ("simple_grpc_shm_string_client.py", ["-v"], [], ""),
    ("simple_grpc_custom_args_client.py", ["-v"], [], ""),
    ("simple_grpc_custom_repeat.py", ["-v"], [], ""),
    ("simple_grpc_keepalive_client.py", ["-v"], [], ""),
    ("grpc_client.py", ["-v"], [], ""),
    ("grpc_explicit_byte_content_client.py", ["-v"], [], ""),
    ("grpc_explicit_int_content_client.py", ["-v"], [], ""),
    ("grpc_explicit_int8_content_client.py", ["-v"], [], ""),
    ("image_client.py", ["-m", "densenet_onnx", "-s", "INCEPTION", "-c", "3", "@IMAGE"], [], "CLASS_"),
    ("image_client.py", ["-m", "inception_graphdef", "-s", "INCEPTION", "-c", "1", "-b", "1", "@IMAGE"], [],
     "CLASS_"),
    ("image_client.py", ["-m", "densenet_onnx", "-s", "INCEPTION", "-c", "1", "-a", "@IMAGE"], [], "CLASS_"),
    ("image_client.py", ["-m", "densenet_onnx", "-s", "INCEPTION", "-c", "1", "--streaming", "-i", "gRPC",
                         "-u", "localhost:8001", "@IMAGE"], [], "CLASS_"),
    ("image_client.py", ["-m", "densenet_onnx", "-s", "INCEPTION", "-c", "1", "-a", "-i", "gRPC",
                         "-u", "localhost:8001", "@IMAGE"], [], "CLASS_"),
    ("grpc_image_client.py", ["-m", "densenet_onnx", "-s", "INCEPTION", "-c", "3", "@IMAGE"], [], "CLASS_"),
    ("grpc_image_client.py", ["-m", "densenet_onnx", "-s", "INCEPTION", "-c", "1", "--streaming", "@IMAGE"], [],
     "CLASS_"),
    ("simple_http_model_control.py", ["-v"], ["--model-control-mode=explicit"], ""),
    ("simple_grpc_model_control.py", ["-v"], ["--model-control-mode=explicit", "--allow-model-code-upload"], ""),
]
EXAMPLES_SKIPPED = {
    "simple_http_cudashm_client.py": "CUDA shared memory (GPU)",
    "simple_grpc_cudashm_client.py": "CUDA shared memory (GPU)",
    "simple_http_sequence_sync_infer_client.py": "simple_sequence/simple_dyna_sequence are C++ custom backends",
    "simple_grpc_sequence_sync_infer_client.py": "simple_sequence/simple_dyna_sequence are C++ custom backends",
    "simple_grpc_sequence_stream_infer_client.py": "simple_sequence/simple_dyna_sequence are C++ custom backends",
    "simple_grpc_aio_sequence_stream_infer_client.py": "simple_sequence/simple_dyna_sequence are C++ custom "
                                                       "backends",
    "ensemble_image_client.py": "its ensemble uses the DALI/image-preprocess C++ backends",
    "memory_growth_test.py": "a soak test, run by L0_memory_growth",
}


ATTRDICT = """
# image_client.py imports attrdict, whose last release does not import on Python 3.10+; this is all it uses.
class AttrDict(dict):
    def __getattr__(self, name):
        try:
            value = self[name]
        except KeyError:
            raise AttributeError(name) from None
        return _wrap(value)


def _wrap(value):
    if isinstance(value, dict):
        return AttrDict(value)
    return [_wrap(v) for v in value] if isinstance(value, list) else value
"""


SHM_MONITOR = """
# Triton's CI builds triton_shm_monitor (C++) for qa/common/shm_util.py's leak probe, which reads the free space
# of the python backend's /dev/shm/triton_python_backend_shm_region* pools. naiad makes no such pools; against
# a real tritonserver this stand-in reports no change, i.e. the leak probe is not run.
class SharedMemoryManager:
    def __init__(self, name):
        self.name = name

    def free_memory(self):
        return 0
"""


def run_examples(client_repo: Path, examples: Path, env: dict[str, str], image: Path,
                 log_dir: Path, python_backend: Path | None) -> list[tuple[str, str, str]]:
    scripts = client_repo / "src" / "python" / "examples"
    shutil.rmtree(examples.with_name("examples-7"), ignore_errors=True)
    shutil.copytree(examples, examples.with_name("examples-7"))
    if python_backend is not None:
        add_repeat_model(examples, python_backend)

    results = []
    by_flags: dict[tuple[str, ...], list] = {}
    for entry in EXAMPLES:
        by_flags.setdefault(tuple(entry[2]), []).append(entry)
    server = Path(env["TRITON_DIR"]) / "bin" / "tritonserver"
    for flags, entries in by_flags.items():
        log = open(log_dir / f"examples-server{len(results)}.log", "wb")
        # simple_http_model_control counts 7 models in its repository, simple_grpc_model_control 8: Triton's
        # CI serves them different folders. The decoupled repeat_int32 (python_backend's example) is the eighth.
        repo = examples if "--allow-model-code-upload" in flags or not any("explicit" in f for f in flags) \
            else examples.with_name("examples-7")
        proc = subprocess.Popen([str(server), f"--model-repository={repo}", *flags], env=env, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
        try:
            _wait_ready(proc)
            for script, args, _, expect in entries:
                argv = [sys.executable, str(scripts / script), *[str(image) if a == "@IMAGE" else a for a in args]]
                name = f"examples.{script} {' '.join(args).replace('@IMAGE', 'IMAGE')}".strip()
                try:
                    run = subprocess.run(argv, env=env, capture_output=True, timeout=60, cwd=log_dir)
                    text = (run.stdout + run.stderr).decode(errors="replace")
                    (log_dir / f"example-{len(results)}.log").write_text(" ".join(argv) + "\n" + text)
                    ok = run.returncode == 0 and expect in text
                    why = "" if ok else (text.strip().splitlines() or [f"exit {run.returncode}"])[-1][:160]
                except subprocess.TimeoutExpired:
                    ok, why = False, "timed out (60 s)"
                results.append((name, "pass" if ok else "fail", why))
        finally:
            os.killpg(proc.pid, 15)
            proc.wait(timeout=30)
            log.close()
    results += [(f"examples.{s}", "skip", why) for s, why in EXAMPLES_SKIPPED.items()]
    return results


def _wait_ready(proc: subprocess.Popen, timeout: float = 90) -> None:
    import http.client

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError("the server exited before it was ready")
        try:
            conn = http.client.HTTPConnection("localhost", 8000, timeout=2)
            conn.request("GET", "/v2/health/ready")
            if conn.getresponse().status == 200:
                return
        except OSError:
            pass
        time.sleep(0.2)
    raise RuntimeError("the server did not become ready")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--server-repo", type=Path, required=True, help="checkout of triton-inference-server/server")
    parser.add_argument("--client-repo", type=Path, required=True, help="checkout of triton-inference-server/client")
    parser.add_argument("--python-backend-repo", type=Path,
                        help="checkout of triton-inference-server/python_backend (for the subtests that clone it)")
    parser.add_argument("--work", type=Path, default=Path("/tmp/naiad-triton-qa"), help="work folder")
    parser.add_argument("--suites", default=",".join((*SUITES, "examples")),
                        help="comma-separated: L0_http, L0_grpc, L0_parameters, L0_backend_python, "
                             "L0_backend_python/<subtest>, examples")
    parser.add_argument("--target", choices=("naiad", "triton"), default="naiad")
    parser.add_argument("--triton-bin", help="tritonserver binary, for --target=triton (peers/triton.sh path)")
    parser.add_argument("--timeout", type=int, default=120, help="seconds per test")
    parser.add_argument("--suite-timeout", type=int, default=1500, help="seconds per test.sh")
    parser.add_argument("--naiad-root", type=Path, default=ROOT,
                        help="the naiad checkout to serve (default: this one), e.g. an older commit to compare")
    parser.add_argument("--isolate", action="store_true", help="run in a private network namespace")
    args = parser.parse_args(argv)
    if args.isolate and os.environ.get("QA_ISOLATED") != "1":
        inner = [sys.executable, *sys.argv]
        cmd = f"ip link set lo up 2>/dev/null; QA_ISOLATED=1 exec {shlex.join(inner)}"
        return subprocess.call(["unshare", "-rn", "sh", "-c", cmd])

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so that a running test.sh's group is ended too
    work = args.work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    # the QA folder inside TRITON_DIR, as in Triton's containers (init_args checks its model_repository path)
    data, qa, examples = work / "data", work / "tritonserver" / "qa", work / "examples"
    generate_datadir(args.server_repo.resolve(), data)
    if examples.exists():
        shutil.rmtree(examples)
    build_example_repository(examples)
    python_backend = args.python_backend_repo.resolve() if args.python_backend_repo else None
    prepare_qa(args.server_repo.resolve(), qa, examples, python_backend)
    env = {**os.environ, **make_tools(work, args.target, args.triton_bin), "DATADIR": str(data),
           "REPO_VERSION": "24.10", "NVIDIA_TRITON_SERVER_VERSION": "24.10", "TEST_JETSON": "0",
           "TEST_WINDOWS": "0", "QA_NAIAD_ROOT": str(args.naiad_root.resolve()),
           "QA_PYTHON_BACKEND": str((args.python_backend_repo or work / "missing-python-backend").resolve()),
           "PYTEST_ADDOPTS": " ".join([f"-p no:cacheprovider --timeout={args.timeout}",
                                       *(f"--deselect {node}" for node in SKIPPED_TESTS)]),
           "QA_SKIP_TESTS": "\n".join(SKIPPED_TESTS), "SERVER_TIMEOUT": "120"}
    client_libs = work / "client-libs"
    client_libs.mkdir(exist_ok=True)
    if importlib.util.find_spec("attrdict") is None:
        (client_libs / "attrdict.py").write_text(ATTRDICT)
    if importlib.util.find_spec("triton_shm_monitor") is None:
        (client_libs / "triton_shm_monitor.py").write_text(SHM_MONITOR)
    # the caller's PYTHONPATH goes on (e.g. torch's CPU build, which L0_backend_python's dlpack/pytorch models need)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(client_libs), os.environ.get("PYTHONPATH", "")) if p)

    wanted = args.suites.split(",")
    results: list[tuple[str, str, str]] = []
    logs = work / "logs"
    logs.mkdir(exist_ok=True)
    for suite in wanted:
        if suite == "examples":
            continue
        parts = suite.split("/")
        if parts[0] == "L0_backend_python" and len(parts) == 1:
            units = [qa / "L0_backend_python"] + [qa / "L0_backend_python" / s for s in BACKEND_PYTHON_SUBTESTS]
        else:
            units = [qa.joinpath(*parts)]
        for unit in units:
            started = time.time()
            label = unit.relative_to(qa).as_posix()
            print(f"== {label}", flush=True)
            unit_env = env
            if label.startswith("L0_backend_python/"):  # what the top-level script exports for its subtests
                unit_env = {**env, "SERVER": f"{env['TRITON_DIR']}/bin/tritonserver",
                            "BACKEND_DIR": f"{env['TRITON_DIR']}/backends", "MODELDIR": str(qa / "L0_backend_python"),
                            "TEST_WINDOWS": "1" if unit.name in BACKEND_PYTHON_CPU_VARIANT else "0"}
            run_script(unit, unit_env, args.suite_timeout, logs / (label.replace("/", "_") + ".log"))
            # a test run several times (lifecycle's iterations) counts once, failed if any run failed
            merged: dict[str, tuple[str, str]] = {}
            for n, st, w in junit_results(unit, started):
                if n not in merged or st == "fail":
                    merged[n] = (st, w)
            found = [(f"{label}:{n}", st, w) for n, (st, w) in merged.items()]
            found += [(f"{label}:{node}", "skip", why) for node, why in SKIPPED_TESTS.items()
                      if (unit / node.split("::")[0]).exists()]
            if not found:
                found = [(f"{label}:(no test ran)", "fail", "see " + str(logs / (label.replace('/', '_') + '.log')))]
            results += found
            _print(found)
    if "L0_backend_python" in wanted:
        results += [(f"L0_backend_python/{s}", "skip", why) for s, why in BACKEND_PYTHON_SKIPPED.items()]
    if "examples" in wanted:
        print("== examples", flush=True)
        found = run_examples(args.client_repo.resolve(), examples, env, qa / "images" / "vulture.jpeg", logs,
                             python_backend)
        results += found
        _print(found)
    counts = {s: sum(1 for _, st, _ in results if st == s) for s in ("pass", "fail", "skip")}
    print(f"\n{counts['pass']} passed, {counts['fail']} failed, {counts['skip']} skipped "
          f"(target: {args.target}; logs in {logs})")
    return 1 if counts["fail"] else 0


def _print(results: list[tuple[str, str, str]]) -> None:
    for name, status, why in results:
        print(f"  {status.upper():4} {name}" + (f"  -- {why}" if why and status != "pass" else ""), flush=True)


if __name__ == "__main__":
    sys.exit(main())
