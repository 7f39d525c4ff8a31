"""``--trace-config`` and the deprecated ``--trace-*`` flags, as tritonserver reads them."""

from __future__ import annotations

import pytest

from naiad.cli import build_parser
from naiad.core import trace_config


def _values(*flags: str) -> dict:
    return trace_config.from_args(build_parser().parse_args(["serve", "--model-repository", "/r", *flags]))


def test_defaults_trace_nothing() -> None:
    assert _values() == {"trace_level": ()}


def test_trace_config() -> None:
    assert _values("--trace-config", "triton,file=/tmp/t.json", "--trace-config", "level=TIMESTAMPS",
                   "--trace-config", "level=TENSORS", "--trace-config", "rate=5", "--trace-config", "count=10",
                   "--trace-config", "triton,log-frequency=50", "--trace-config", "mode=triton") == {
        "trace_file": "/tmp/t.json", "trace_level": ("TIMESTAMPS", "TENSORS"), "trace_rate": 5, "trace_count": 10,
        "log_frequency": 50}


def test_an_explicit_off_wins() -> None:
    assert _values("--trace-config", "level=TIMESTAMPS", "--trace-config", "level=OFF")["trace_level"] == ()


def test_deprecated_flags_warn_and_trace_config_wins(capsys: pytest.CaptureFixture[str]) -> None:
    values = _values("--trace-file", "/tmp/old.json", "--trace-level", "TIMESTAMPS", "--trace-rate", "1",
                     "--trace-count", "3", "--trace-log-frequency", "2", "--trace-config", "rate=9")
    assert values == {"trace_file": "/tmp/old.json", "trace_level": ("TIMESTAMPS",), "trace_rate": 9,
                      "trace_count": 3, "log_frequency": 2}
    err = capsys.readouterr().err
    assert "Warning: '--trace-file' has been deprecated" in err and "'--trace-config triton,file=<filepath>" in err


def test_opentelemetry_is_refused_with_a_warning(capsys: pytest.CaptureFixture[str]) -> None:
    assert _values("--trace-config", "mode=opentelemetry", "--trace-config", "level=TIMESTAMPS")["trace_level"] == ()
    assert "trace mode 'opentelemetry' is not served by naiad" in capsys.readouterr().err


@pytest.mark.parametrize("spec, message", [
    (",file=x", "No trace mode specified."),
    ("rate", "--trace-config option format is '<trace mode>,<setting>=<value>'. Got rate"),
    ("level=loud", 'Bad option: "--trace-config level".\ninvalid value for trace level option: loud'),
    ("jaeger,file=x", 'invalid value for trace mode option: jaeger'),
    ("rate=often", 'Bad option: "--trace-config rate".'),
])
def test_bad_settings(spec: str, message: str) -> None:
    with pytest.raises(ValueError) as caught:
        _values("--trace-config", spec)
    assert message in str(caught.value)
