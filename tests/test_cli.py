"""``naiad serve`` takes tritonserver's command lines: every option is documented with its default, GPU-only and
C++-only flags are accepted and listed as having no effect, and deprecated spellings keep their meaning."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest

from naiad.cli import build_parser
from naiad.frontends.metrics import options as metrics_options
from tests.server import ROOT


def _serve_parser() -> argparse.ArgumentParser:
    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return commands.choices["serve"]


def test_every_option_is_documented_with_its_default() -> None:
    undocumented = [a.option_strings[0] for a in _serve_parser()._actions
                    if a.option_strings and a.option_strings[0] != "-h" and not (a.help or "").strip()]
    assert undocumented == []
    text = subprocess.run([sys.executable, "-m", "naiad", "serve", "--help"], capture_output=True, text=True,
                          cwd=ROOT, check=True).stdout
    assert "--http-port HTTP_PORT" in text and "(default: 8000)" in text
    assert "accepted for Triton compatibility, no effect in naiad" in text


COMMON_TRITON_FLAGS = [
    "--model-repository=/models", "--strict-model-config=false", "--backend-directory=/opt/tritonserver/backends",
    "--repoagent-directory=/opt/tritonserver/repoagents", "--model-load-thread-count=2",
    "--model-load-retry-count=1", "--model-namespacing=false", "--pinned-memory-pool-byte-size=0",
    "--cuda-memory-pool-byte-size=0:0", "--min-supported-compute-capability=7.0", "--buffer-manager-thread-count=2",
    "--id=prod-1", "--http-thread-count=16", "--metrics-config=summary_latencies=true",
    "--disable-auto-complete-config", "--allow-gpu-metrics=false", "--exit-on-error=true",
    "--strict-readiness=true", "--model-control-mode=explicit", "--load-model=*", "--log-verbose=0",
    "--response-cache-byte-size=1048576", "--host-policy=gpu0,numa-node=0", "--model-load-gpu-limit=0:0.8",
    "--enable-peer-access=false", "--cache-directory=/opt/tritonserver/caches", "--reuse-http-port=true",
]


def test_common_tritonserver_flags_parse() -> None:
    args = build_parser().parse_args(["serve", *COMMON_TRITON_FLAGS])
    assert args.id == "prod-1" and args.model_load_thread_count == 2 and args.model_load_retry_count == 1
    assert args.strict_model_config is False and args.disable_auto_complete_config
    assert args.response_cache_byte_size == 1048576
    assert metrics_options.from_args(args).summary_latencies


def test_metrics_config_checks_its_format() -> None:
    args = build_parser().parse_args(["serve", "--model-repository=/m", "--metrics-config=nokey"])
    with pytest.raises(ValueError, match="--metrics-config option format is <setting>=<value>. Got nokey"):
        metrics_options.from_args(args)
    args = build_parser().parse_args(["serve", "--model-repository=/m", "--metrics-config=counter_latencies=maybe"])
    with pytest.raises(ValueError, match="expected true or false"):
        metrics_options.from_args(args)
    args = build_parser().parse_args(["serve", "--model-repository=/m", "--metrics-config=some_future_setting=1",
                                      "--metrics-config=summary_quantiles=0.5:0.05,0.99:0.001"])
    assert metrics_options.from_args(args).summary_quantiles == [0.5, 0.99]  # unknown settings ignored, as Triton
