"""A Python model that answers with the request parameters it was given (as Triton hands them to a model: a JSON
string), for the header-forwarding and restricted-API tests of both protocols."""

from __future__ import annotations

from pathlib import Path

from tests.models import write_model

NAME = "echo_parameters"


def write_echo_parameters(repo: Path) -> Path:
    return write_model(repo, NAME, f"""
        name: "{NAME}"
        backend: "python"
        input [ {{ name: "INPUT0", data_type: TYPE_FP32, dims: [ -1 ] }} ]
        output [ {{ name: "PARAMETERS", data_type: TYPE_STRING, dims: [ 1 ] }} ]
    """, """
        import numpy as np
        import triton_python_backend_utils as pb_utils

        class TritonPythonModel:
            def execute(self, requests):
                return [pb_utils.InferenceResponse([pb_utils.Tensor(
                    "PARAMETERS", np.array([r.parameters().encode()], dtype=np.object_))]) for r in requests]
    """)
