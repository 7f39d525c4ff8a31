"""What an operator sees when a SageMaker endpoint can't work: an ``s3://`` model data url on a host without boto3
stops the server at start with the install command (it used to start, then answer 503 to every invocation)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from tests.server import ROOT, free_port

# Makes `import boto3` fail in the process it is loaded into, as on a host where naiad[s3] isn't installed.
HIDE_BOTO3 = """
    import sys

    class HideBoto3:
        def find_spec(self, name, path=None, target=None):
            if name == "boto3" or name.startswith("boto3."):
                raise ImportError(f"No module named '{name}' (hidden by the test)")
            return None

    sys.meta_path.insert(0, HideBoto3())
"""


def _without_boto3(tmp_path: Path) -> dict[str, str]:
    shim = tmp_path / "shim"
    shim.mkdir()
    (shim / "sitecustomize.py").write_text(textwrap.dedent(HIDE_BOTO3))
    return {**os.environ, "PYTHONPATH": f"{shim}{os.pathsep}{ROOT}", "SAGEMAKER_MULTI_MODEL": "true"}


def test_s3_model_data_url_without_boto3_fails_at_start(tmp_path: Path) -> None:
    env = _without_boto3(tmp_path)
    # The shim works: boto3 is importable here, not there.
    probe = subprocess.run([sys.executable, "-c", "import boto3"], env=env, capture_output=True, text=True)
    assert probe.returncode == 1 and "hidden by the test" in probe.stderr
    (tmp_path / "empty").mkdir()
    ports = [str(free_port()) for _ in range(4)]
    started = subprocess.run(
        [sys.executable, "-m", "naiad", "serve", "--model-repository", str(tmp_path / "empty"),
         "--allow-sagemaker=true", "--model-control-mode=explicit", f"--sagemaker-models-root={tmp_path / 'models'}",
         "--sagemaker-model-data-url=s3://models/prod/", "--http-address=127.0.0.1", "--grpc-address=127.0.0.1",
         "--metrics-address=127.0.0.1", "--http-port", ports[0], "--grpc-port", ports[1], "--metrics-port", ports[2],
         "--sagemaker-port", ports[3]],
        env=env, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert started.returncode == 1, started.stdout + started.stderr
    assert started.stderr.strip().splitlines()[-1] == (
        "error: --sagemaker-model-data-url s3://models/prod/: s3:// urls need boto3, which is not installed: "
        "pip install 'naiad[s3]'")
