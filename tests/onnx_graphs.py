"""Tiny ONNX graphs built with the onnx helper API, written into test repositories."""

from __future__ import annotations

import textwrap
from pathlib import Path

import onnx
from onnx import TensorProto, helper

# Config datatype -> ONNX element type.
ONNX_TYPES = {
    "TYPE_BOOL": TensorProto.BOOL,
    "TYPE_UINT8": TensorProto.UINT8,
    "TYPE_UINT16": TensorProto.UINT16,
    "TYPE_UINT32": TensorProto.UINT32,
    "TYPE_UINT64": TensorProto.UINT64,
    "TYPE_INT8": TensorProto.INT8,
    "TYPE_INT16": TensorProto.INT16,
    "TYPE_INT32": TensorProto.INT32,
    "TYPE_INT64": TensorProto.INT64,
    "TYPE_FP16": TensorProto.FLOAT16,
    "TYPE_FP32": TensorProto.FLOAT,
    "TYPE_FP64": TensorProto.DOUBLE,
    "TYPE_BF16": TensorProto.BFLOAT16,
    "TYPE_STRING": TensorProto.STRING,
}


def model(nodes: list, inputs: list, outputs: list, initializers: list | None = None) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=initializers or [])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    proto.ir_version = 8  # readable by older onnxruntime releases too
    onnx.checker.check_model(proto)
    return proto


def tensor(name: str, dtype: str, shape: list) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, ONNX_TYPES[dtype], shape)


def add_sub(dtype: str, dims: list, batch: bool = True) -> onnx.ModelProto:
    """Triton's ``simple``: OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 - INPUT1."""
    shape = (["batch"] if batch else []) + dims
    io = lambda n: tensor(n, dtype, shape)
    nodes = [helper.make_node("Add", ["INPUT0", "INPUT1"], ["OUTPUT0"]),
             helper.make_node("Sub", ["INPUT0", "INPUT1"], ["OUTPUT1"])]
    return model(nodes, [io("INPUT0"), io("INPUT1")], [io("OUTPUT0"), io("OUTPUT1")])


def string_add_sub(dims: list) -> onnx.ModelProto:
    """Triton's ``simple_string``: the same arithmetic on integers written as strings."""
    shape = ["batch"] + dims
    nodes = [
        helper.make_node("Cast", ["INPUT0"], ["A"], to=TensorProto.INT32),
        helper.make_node("Cast", ["INPUT1"], ["B"], to=TensorProto.INT32),
        helper.make_node("Add", ["A", "B"], ["S"]),
        helper.make_node("Sub", ["A", "B"], ["D"]),
        helper.make_node("Cast", ["S"], ["OUTPUT0"], to=TensorProto.STRING),
        helper.make_node("Cast", ["D"], ["OUTPUT1"], to=TensorProto.STRING),
    ]
    io = lambda n: tensor(n, "TYPE_STRING", shape)
    return model(nodes, [io("INPUT0"), io("INPUT1")], [io("OUTPUT0"), io("OUTPUT1")])


def identity(dtype: str, shape: list, in_name: str = "INPUT0", out_name: str = "OUTPUT0") -> onnx.ModelProto:
    return model([helper.make_node("Identity", [in_name], [out_name])],
                 [tensor(in_name, dtype, shape)], [tensor(out_name, dtype, shape)])


def image_classifier(classes: int = 1000, size: int = 224, seed: int = 0) -> onnx.ModelProto:
    """densenet_onnx's signature (data_0 [1,3,size,size] -> fc6_1 [1,classes,1,1]): the channel means through
    random weights. Only shapes and labels matter to the tests, as to Triton's image_client example."""
    import numpy as np

    weights = np.random.default_rng(seed).standard_normal((3, classes)).astype(np.float32)
    nodes = [
        helper.make_node("ReduceMean", ["data_0"], ["pooled"], axes=[2, 3], keepdims=0),
        helper.make_node("MatMul", ["pooled", "W"], ["logits"]),
        helper.make_node("Reshape", ["logits", "out_shape"], ["fc6_1"]),
    ]
    initializers = [
        helper.make_tensor("W", TensorProto.FLOAT, [3, classes], weights.ravel().tolist()),
        helper.make_tensor("out_shape", TensorProto.INT64, [4], [1, classes, 1, 1]),
    ]
    return model(nodes, [tensor("data_0", "TYPE_FP32", [1, 3, size, size])],
                 [tensor("fc6_1", "TYPE_FP32", [1, classes, 1, 1])], initializers)


def write(repo: Path, name: str, proto: onnx.ModelProto | bytes, config: str | None = None,
          version: int = 1, filename: str = "model.onnx") -> Path:
    folder = repo / name
    (folder / str(version)).mkdir(parents=True, exist_ok=True)
    data = proto if isinstance(proto, bytes) else proto.SerializeToString()
    (folder / str(version) / filename).write_bytes(data)
    if config is not None:
        (folder / "config.pbtxt").write_text(textwrap.dedent(config))
    return folder
