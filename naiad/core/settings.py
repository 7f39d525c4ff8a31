"""Run-time settings clients read and change over the protocols: logging, and the checks of a trace update.

Front ends turn their wire values into plain Python ones (checking the wire types in their own words); the
checks Triton makes of the values themselves, in its order and words, are here, once for HTTP and gRPC.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

from naiad.core.errors import Code, InferError, invalid
from naiad.core.tracing import LEVELS

FORMATS = ("default", "ISO8601")


def log_level(info: bool, warning: bool, error: bool, verbose: int) -> int:
    """Triton's independent switches as one Python logging level: the most detailed one that is on."""
    if verbose > 0:
        return logging.DEBUG
    if info:
        return logging.INFO
    if warning:
        return logging.WARNING
    if error:
        return logging.ERROR
    return logging.CRITICAL + 1


def formatter(log_format: str) -> logging.Formatter:
    """Triton's two line formats: ``I1125 12:00:00.123456 42 file] msg`` and ISO 8601."""
    if log_format == "ISO8601":
        return logging.Formatter("%(asctime)s.%(msecs)03dZ %(levelname).1s %(process)d %(name)s] %(message)s",
                                 datefmt="%Y-%m-%dT%H:%M:%S")
    return logging.Formatter("%(levelname).1s%(asctime)s.%(msecs)03d %(process)d %(name)s] %(message)s",
                             datefmt="%m%d %H:%M:%S")


class LogSettings:
    """Triton's log settings, applied to the root logger whenever they change. ``--log-file`` replaces the
    stderr handler; it can't be changed over the network, as in Triton."""

    def __init__(self, logger: logging.Logger | None = None) -> None:
        self.logger = logger or logging.getLogger()
        level = self.logger.getEffectiveLevel()
        self.file = ""
        self.info = level <= logging.INFO
        self.warning = level <= logging.WARNING
        self.error = level <= logging.ERROR
        self.verbose = 1 if level <= logging.DEBUG else 0
        self.format = "default"

    def configure(self, info: bool, warning: bool, error: bool, verbose: int, log_format: str = "default",
                  file: str = "") -> None:
        """Start-up: one handler, to stderr or to ``file``, in ``log_format``."""
        for handler in list(self.logger.handlers):
            self.logger.removeHandler(handler)
            handler.close()
        self.logger.addHandler(logging.FileHandler(file) if file else logging.StreamHandler(sys.stderr))
        self.file = file
        self.update(info=info, warning=warning, error=error, verbose=verbose, format=log_format)

    def update(self, **values: Any) -> None:
        for key, value in values.items():
            setattr(self, key, value)
        self.logger.setLevel(log_level(self.info, self.warning, self.error, self.verbose))
        # --log-verbose is about naiad's own lines: libraries' debug output (HPACK tables, botocore's wire log,
        # asyncio) appears only from level 2 up; in every process that logs (front ends too), however it is set.
        library = logging.NOTSET if self.verbose >= 2 else max(self.logger.level, logging.INFO)
        for name in LIBRARY_LOGGERS:
            logging.getLogger(name).setLevel(library)
        for handler in self.logger.handlers:
            handler.setFormatter(formatter(self.format))

    def as_dict(self) -> dict[str, Any]:
        return {"log_file": self.file, "log_info": self.info, "log_warning": self.warning, "log_error": self.error,
                "log_verbose_level": self.verbose, "log_format": self.format}


LIBRARY_LOGGERS = ("hpack", "h2", "grpc", "asyncio", "botocore", "boto3", "s3transfer", "urllib3", "filelock",
                   "PIL", "matplotlib", "onnx", "torch")


# Log setting name -> LogSettings attribute and the Python type of its value.
LOG_KEYS: dict[str, tuple[str, type]] = {"log_info": ("info", bool), "log_warning": ("warning", bool),
                                         "log_error": ("error", bool), "log_verbose_level": ("verbose", int),
                                         "log_format": ("format", str)}


def log_changes(values: dict[str, Any], format_flag: str = "log_format") -> dict[str, Any]:
    """LogSettings.update's arguments from typed values (``None``: left as it is). ``format_flag`` is how the
    protocol names the format in its error (HTTP's Triton says ``--log_format``)."""
    changes: dict[str, Any] = {}
    for key, (attribute, _) in LOG_KEYS.items():
        value = values.get(key)
        if value is None:
            continue
        if key == "log_format" and value not in FORMATS:
            raise invalid(f"invalid argument for {format_flag}, got: {value}")
        changes[attribute] = value
    return changes


def no_file_change(name: str) -> InferError:
    kind = "trace" if name == "trace_file" else "log"
    return InferError(f"{kind} file location can not be updated through network protocol", Code.UNSUPPORTED)


def trace_changes(values: dict[str, list[str] | None]) -> dict[str, Any]:
    """Tracer.update's argument from a trace update whose values are lists of strings (``None``: clear it),
    with Triton's checks: an unknown level is ignored, numbers are read as C's ``stoi`` reads them."""
    if "trace_file" in values:
        raise no_file_change("trace_file")
    changes: dict[str, Any] = {}
    if "trace_level" in values:
        levels = values["trace_level"]
        if levels is None:
            changes["trace_level"] = None
        elif "OFF" in levels:
            if len(levels) > 1:
                raise invalid("Expect only one trace level 'OFF' is specified")
            changes["trace_level"] = ()
        else:
            known = tuple(level for level in LEVELS if level in levels)
            if known:
                changes["trace_level"] = known
    for key, low, high in (("trace_rate", 0, 2**32 - 1), ("trace_count", -1, 2**31 - 1),
                           ("log_frequency", 0, 2**32 - 1)):
        if key not in values:
            continue
        given = values[key]
        if given is None:
            changes[key] = None
            continue
        if len(given) > 1:
            raise invalid(f"expect only 1 value for '{key}'")
        number = _stoi(given[0], key)
        if key == "trace_count" and number < -1:
            raise invalid(f"Unable to parse '{key}'. Expecting value >= -1, got: {given[0]}")
        if not low <= number <= high:
            raise invalid(f"Unable to parse '{key}', value is out of range [ {low}, {high} ], got: {given[0]}")
        changes[key] = number
    return changes


def _stoi(text: str, key: str) -> int:
    digits = text.lstrip()
    end = 1 if digits[:1] in ("+", "-") else 0
    while end < len(digits) and digits[end].isdigit():
        end += 1
    try:
        return int(digits[:end])
    except ValueError:
        raise invalid(f"Unable to parse '{key}', got: {text}") from None
