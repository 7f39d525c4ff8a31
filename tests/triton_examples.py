"""Stand-ins for Triton's docs/examples/model_repository ``simple`` models, with their names, datatypes, dims and
arithmetic: ``simple``, ``simple_int8`` and ``simple_string`` as ONNX graphs, ``simple_identity`` in Python. Used by
the example-client tests and by tools/run_triton_qa.py."""

from __future__ import annotations

from pathlib import Path

from tests import onnx_graphs as g
from tests.models import write_model

SIMPLE = """
    name: "{name}"
    platform: "onnxruntime_onnx"
    max_batch_size: 8
    input [{{ name: "INPUT0", data_type: {t}, dims: [ 16 ] }}, {{ name: "INPUT1", data_type: {t}, dims: [ 16 ] }}]
    output [{{ name: "OUTPUT0", data_type: {t}, dims: [ 16 ] }}, {{ name: "OUTPUT1", data_type: {t}, dims: [ 16 ] }}]
"""

IDENTITY_CONFIG = """
    name: "simple_identity"
    backend: "python"
    max_batch_size: 8
    input [{ name: "INPUT0", data_type: TYPE_STRING, dims: [ -1 ] }]
    output [{ name: "OUTPUT0", data_type: TYPE_STRING, dims: [ -1 ] }]
"""

IDENTITY_PY = """
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def execute(self, requests):
            return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", r.inputs()[0].as_numpy())])
                    for r in requests]
"""


def write_simple(repo: Path, names: tuple[str, ...] = ("simple", "simple_int8", "simple_string",
                                                           "simple_identity")) -> None:
    datatypes = {"simple": "TYPE_INT32", "simple_int8": "TYPE_INT8"}
    for name in names:
        if name in datatypes:
            g.write(repo, name, g.add_sub(datatypes[name], [16]), SIMPLE.format(name=name, t=datatypes[name]))
        elif name == "simple_string":
            g.write(repo, name, g.string_add_sub([16]), SIMPLE.format(name=name, t="TYPE_STRING"))
        else:
            write_model(repo, name, IDENTITY_CONFIG, IDENTITY_PY)
