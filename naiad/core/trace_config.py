"""``--trace-config`` and the deprecated ``--trace-*`` flags, read as tritonserver reads them, into the tracer's
start-up values (``naiad.core.tracing``)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from naiad.core.tracing import LEVELS


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--trace-config", action="append", default=[], metavar="[MODE,]SETTING=VALUE",
                        help="tracing, as tritonserver: level=OFF|TIMESTAMPS|TENSORS, rate=N (every Nth request), "
                             "count=N (-1: no limit), mode=triton, triton,file=PATH, triton,log-frequency=N "
                             "(repeatable)")
    deprecated = "deprecated Triton spelling of --trace-config"
    parser.add_argument("--trace-file", default=None, metavar="PATH", help=f"{deprecated} triton,file=PATH")
    parser.add_argument("--trace-level", action="append", default=[], metavar="LEVEL",
                        help=f"{deprecated} level=LEVEL (repeatable)")
    parser.add_argument("--trace-rate", default=None, metavar="N", help=f"{deprecated} rate=N")
    parser.add_argument("--trace-count", default=None, metavar="N", help=f"{deprecated} count=N")
    parser.add_argument("--trace-log-frequency", default=None, metavar="N",
                        help=f"{deprecated} triton,log-frequency=N")


def from_args(args: argparse.Namespace) -> dict[str, Any]:
    """The tracer's values; raises ValueError with tritonserver's message for a bad setting. Deprecated flags
    warn on stderr, and --trace-config wins over them, as in tritonserver."""
    values: dict[str, Any] = {}
    levels: set[str] = set()
    disabled = False
    deprecated = {"--trace-file": ("trace_file", args.trace_file, "triton,file=<filepath>", None),
                  "--trace-rate": ("trace_rate", args.trace_rate, "rate=<rate value>", int),
                  "--trace-count": ("trace_count", args.trace_count, "count=<count value>", int),
                  "--trace-log-frequency": ("log_frequency", args.trace_log_frequency,
                                            "triton,log-frequency=<log frequency value>", int)}
    for flag, (key, value, replacement, kind) in deprecated.items():
        if value is not None:
            _warn(f"'{flag}' has been deprecated and will be removed in future releases. Use "
                  f"'--trace-config {replacement} instead.")
            values[key] = _number(value, flag) if kind else value

    def add_level(value: str) -> None:
        nonlocal disabled
        level = _level(value)
        disabled |= level is None  # an explicit OFF anywhere wins, as in tritonserver
        levels.update([level] if level else [])

    for value in args.trace_level:
        _warn("'--trace-level' has been deprecated and will be removed in future releases. Use "
              "'--trace-config level=<OFF|TIMESTAMPS|TENSORS> instead.")
        add_level(value)
    mode = "triton"
    for spec in args.trace_config:
        scope, setting, value = _split(spec)
        where = f"{scope}," if scope else ""
        try:
            if scope == "" and setting == "level":
                add_level(value)
            elif scope == "" and setting == "mode":
                mode = _mode(value)
            elif scope == "" and setting in ("rate", "count"):
                values[f"trace_{setting}"] = _number(value, setting)
            elif scope == "triton" and setting == "file":
                values["trace_file"] = value
            elif scope == "triton" and setting == "log-frequency":
                values["log_frequency"] = _number(value, setting)
        except ValueError as exc:
            raise ValueError(f'Bad option: "--trace-config {where}{setting}".\n{exc}') from None
    if mode != "triton":
        _warn(f"trace mode '{mode}' is not served by naiad: tracing is off (naiad writes Triton's trace files, "
              "--trace-config mode=triton)")
        disabled = True
    values["trace_level"] = () if disabled else tuple(level for level in LEVELS if level in levels)
    return values


def _split(spec: str) -> tuple[str, str, str]:
    """``[mode,]setting=value`` as tritonserver splits it."""
    comma = spec.find(",")
    if comma == 0:
        raise ValueError("No trace mode specified. --trace-config option format is <trace mode>,<setting>=<value> "
                         f"or <setting>=<value>. Got {spec}")
    scope = _mode(spec[:comma]) if comma > 0 else ""
    setting, equals, value = spec[comma + 1:].partition("=")
    if not equals or not setting or not value:
        raise ValueError(f"--trace-config option format is '<trace mode>,<setting>=<value>'. Got {spec}")
    return scope, setting, value


def _level(value: str) -> str | None:
    """A level's name; None for off."""
    lowered = value.lower()
    if lowered in ("false", "off"):
        return None
    if lowered in ("true", "on", "min", "max", "timestamps"):
        return "TIMESTAMPS"
    if lowered == "tensors":
        return "TENSORS"
    raise ValueError(f"invalid value for trace level option: {value}")


def _mode(value: str) -> str:
    lowered = value.lower()
    if lowered not in ("triton", "opentelemetry"):
        raise ValueError(f'invalid value for trace mode option: {value}. Available options are "triton" and '
                         '"opentelemetry"')
    return lowered


def _number(value: str, name: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"invalid value for {name}: {value}") from None


def _warn(message: str) -> None:
    print(f"Warning: {message}", file=sys.stderr)
