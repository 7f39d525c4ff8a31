"""Triton's SageMaker flags, the environment its SageMaker server reads, and naiad's platform flags."""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping

INFERENCE_TYPES = ("infer", "generate", "generate_stream")


@dataclass
class SageMakerOptions:
    enabled: bool = False
    address: str = "0.0.0.0"
    port: int = 8080
    safe_port_range: str = ""
    thread_count: int = 8
    models_root: Path = Path("/opt/ml/models")
    model_data_url: str = ""  # beyond Triton: where on-demand loads fetch archives from
    memory_limit: str = ""  # beyond Triton: --model-memory-limit
    eviction_policy: str = "gdsf"  # beyond Triton: which model --model-memory-limit unloads first
    # From the environment, as Triton's SageMaker server reads it at start-up.
    default_model: str = "unspecified_SAGEMAKER_TRITON_DEFAULT_MODEL_NAME"
    ping_mode: str = "ready"
    inference_type: str = "infer"
    multi_model: bool = False  # SAGEMAKER_MULTI_MODEL: the endpoint the runtime front door plays

    def check_ports(self, ports: dict[str, int]) -> None:
        """``--sagemaker-safe-port-range``: every other enabled endpoint must listen inside it."""
        if not self.safe_port_range:
            return
        low, sep, high = self.safe_port_range.partition("-")
        try:
            first, last = int(low), int(high)
        except ValueError:
            raise ValueError(f"--sagemaker-safe-port-range expects <low>-<high>, got '{self.safe_port_range}'") from None
        if not sep or first > last:
            raise ValueError(f"--sagemaker-safe-port-range expects <low>-<high>, got '{self.safe_port_range}'")
        for name, port in ports.items():
            if not first <= port <= last:
                raise ValueError(f"The server cannot listen to {name} requests at port {port}, allowed port range "
                                 f"is [{first}, {last}]")


def add_arguments(parser: argparse.ArgumentParser, flag: Callable[..., None]) -> None:
    defaults = SageMakerOptions()
    flag(parser, "--allow-sagemaker", False, "serve SageMaker's /ping, /invocations and /models routes")
    parser.add_argument("--sagemaker-port", type=int, default=defaults.port, help="SageMaker hosting port")
    parser.add_argument("--sagemaker-safe-port-range", default="", metavar="LOW-HIGH",
                        help="the ports endpoints other than SageMaker's may use")
    parser.add_argument("--sagemaker-thread-count", type=int, default=defaults.thread_count,
                        help="accepted for Triton compatibility; naiad serves SageMaker on its event loop")
    parser.add_argument("--sagemaker-models-root", type=Path, default=defaults.models_root,
                        help="naiad only: the folder multi-model loads come from (SageMaker: /opt/ml/models)")
    parser.add_argument("--sagemaker-model-data-url", default="", metavar="URL",
                        help="naiad only: a folder or s3://bucket/prefix/ of .tar.gz model archives, loaded on the "
                             "first invocation that names them (SageMaker's ModelDataUrl)")
    parser.add_argument("--model-memory-limit", default="", metavar="SIZE",
                        help="naiad only: memory the loaded SageMaker models may use (bytes, K/M/G, or N%% of RAM); "
                             "models are unloaded to make room (--sagemaker-eviction-policy)")
    parser.add_argument("--sagemaker-eviction-policy", choices=("gdsf", "lru"), default=defaults.eviction_policy,
                        help="naiad only: which model --model-memory-limit unloads first: 'gdsf' the "
                             "lowest recent requests x load time / memory, 'lru' the least recently used")


def from_args(args: argparse.Namespace, env: Mapping[str, str] = os.environ) -> SageMakerOptions:
    inference_type = env.get("SAGEMAKER_TRITON_INFERENCE_TYPE", "infer") or "infer"
    if inference_type not in INFERENCE_TYPES:
        raise ValueError(f"invalid SAGEMAKER_TRITON_INFERENCE_TYPE '{inference_type}': must be one of: "
                         + ", ".join(INFERENCE_TYPES))
    return SageMakerOptions(
        enabled=args.allow_sagemaker,
        address=args.http_address,
        port=args.sagemaker_port,
        safe_port_range=args.sagemaker_safe_port_range,
        thread_count=args.sagemaker_thread_count,
        models_root=args.sagemaker_models_root,
        model_data_url=args.sagemaker_model_data_url,
        memory_limit=args.model_memory_limit,
        eviction_policy=args.sagemaker_eviction_policy,
        default_model=env.get("SAGEMAKER_TRITON_DEFAULT_MODEL_NAME") or SageMakerOptions.default_model,
        ping_mode=env.get("SAGEMAKER_TRITON_PING_MODE") or "ready",
        inference_type=inference_type,
        multi_model=env.get("SAGEMAKER_MULTI_MODEL", "").lower() == "true",
    )
