"""Small model repositories written by the tests themselves."""

from __future__ import annotations

import textwrap
from pathlib import Path


def write_model(repo: Path, name: str, config: str | None, model_py: str, versions: tuple[int, ...] = (1,)) -> Path:
    folder = repo / name
    folder.mkdir(parents=True, exist_ok=True)
    if config is not None:
        (folder / "config.pbtxt").write_text(textwrap.dedent(config))
    for version in versions:
        (folder / str(version)).mkdir(exist_ok=True)
        (folder / str(version) / "model.py").write_text(textwrap.dedent(model_py))
    return folder


IDENTITY_FP32 = """
    name: "{name}"
    backend: "python"
    input [{{ name: "INPUT0", data_type: TYPE_FP32, dims: [ -1 ] }}]
    output [{{ name: "OUTPUT0", data_type: TYPE_FP32, dims: [ -1 ] }}]
"""

IDENTITY_PY = """
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def execute(self, requests):
            return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", r.inputs()[0].as_numpy())])
                    for r in requests]
"""
