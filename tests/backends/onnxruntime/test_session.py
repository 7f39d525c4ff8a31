"""Session options and execution providers chosen from a config, as Triton's onnxruntime backend chooses them
(the GPU choices are checked here, without a GPU: which providers, with which options, or which error)."""

from __future__ import annotations

import onnxruntime as ort
import pytest

from naiad.backends.onnxruntime import session
from naiad.config import pb
from naiad.config.loader import parse_config_text
from naiad.core.errors import Code, InferError

GPU = pb.ModelInstanceGroup.KIND_GPU
CPU = pb.ModelInstanceGroup.KIND_CPU


def _config(text: str):
    return parse_config_text('name: "m"\nbackend: "onnxruntime"\n' + text)


def test_session_options_from_parameters() -> None:
    options = session.session_options(_config("""
        parameters [{ key: "intra_op_thread_count" value: { string_value: "3" } },
                    { key: "inter_op_thread_count" value: { string_value: "2" } },
                    { key: "execution_mode" value: { string_value: "1" } },
                    { key: "enable_mem_pattern" value: { string_value: "off" } },
                    { key: "session.use_device_allocator_for_initializers" value: { string_value: "1" } }]
        optimization { graph { level: 2 } }
    """))
    assert options.intra_op_num_threads == 3 and options.inter_op_num_threads == 2
    assert options.execution_mode == ort.ExecutionMode.ORT_PARALLEL
    assert options.graph_optimization_level == ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    assert options.enable_mem_pattern is False
    assert options.get_session_config_entry("session.use_device_allocator_for_initializers") == "1"
    default = session.session_options(_config(""))
    assert default.graph_optimization_level == ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    assert session.session_options(_config("optimization { graph { level: -1 } }")).graph_optimization_level == (
        ort.GraphOptimizationLevel.ORT_ENABLE_BASIC)


def test_cpu_instances_ignore_gpu_accelerators() -> None:
    config = _config('optimization { execution_accelerators { gpu_execution_accelerator [{ name: "tensorrt" }] } }')
    assert session.providers(config, CPU, 0) == ["CPUExecutionProvider"]


def test_gpu_instance_providers(monkeypatch: pytest.MonkeyPatch) -> None:
    config = _config("""
        optimization { execution_accelerators { gpu_execution_accelerator [
          { name: "tensorrt" parameters [{ key: "precision_mode" value: "FP16" },
                                         { key: "max_workspace_size_bytes" value: "1073741824" },
                                         { key: "trt_engine_cache_enable" value: "true" }] },
          { name: "cuda" parameters { key: "cudnn_conv_algo_search" value: "HEURISTIC" } }
        ] } }
    """)
    monkeypatch.setattr(ort, "get_available_providers",
                        lambda: ["TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"])
    chosen = session.providers(config, GPU, 1)
    assert chosen == [
        ("TensorrtExecutionProvider", {"trt_fp16_enable": "1", "trt_max_workspace_size": "1073741824",
                                       "trt_engine_cache_enable": "true", "device_id": "1"}),
        ("CUDAExecutionProvider", {"cudnn_conv_algo_search": "HEURISTIC", "device_id": "1"}),
        "CPUExecutionProvider",
    ]


def test_gpu_instance_without_cuda_provider_fails_clearly() -> None:
    with pytest.raises(InferError) as raised:
        session.providers(_config(""), GPU, 0)
    assert raised.value.code == Code.UNAVAILABLE
    assert "has no CUDAExecutionProvider" in raised.value.message


@pytest.mark.parametrize(("accelerator", "message"), [
    ('gpu_execution_accelerator [{ name: "rocm" }]', "unknown Execution Accelerator 'rocm' is requested"),
    ('gpu_execution_accelerator [{ name: "tensorrt" parameters { key: "precision_mode" value: "FP8" } }]',
     "unsupported precision mode 'FP8' is requested"),
    ('gpu_execution_accelerator [{ name: "tensorrt" parameters { key: "bogus" value: "1" } }]',
     "unknown parameter 'bogus' is provided for TensorRT Execution Accelerator"),
])
def test_bad_gpu_accelerators(monkeypatch: pytest.MonkeyPatch, accelerator: str, message: str) -> None:
    monkeypatch.setattr(ort, "get_available_providers",
                        lambda: ["TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"])
    with pytest.raises(InferError) as raised:
        session.providers(_config(f"optimization {{ execution_accelerators {{ {accelerator} }} }}"), GPU, 0)
    assert raised.value.message == message
