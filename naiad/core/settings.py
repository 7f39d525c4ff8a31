"""Run-time settings clients read and change over the protocols: logging and trace settings.

Front ends check the wire types and Triton's wording; these classes hold and apply the values.
"""

from __future__ import annotations

import logging
from typing import Any

from naiad.core.errors import invalid


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


class LogSettings:
    """Triton's log settings, applied to the root logger whenever they change."""

    def __init__(self, logger: logging.Logger | None = None) -> None:
        self.logger = logger or logging.getLogger()
        level = self.logger.getEffectiveLevel()
        self.file = ""
        self.info = level <= logging.INFO
        self.warning = level <= logging.WARNING
        self.error = level <= logging.ERROR
        self.verbose = 1 if level <= logging.DEBUG else 0
        self.format = "default"

    def update(self, **values: Any) -> None:
        for key, value in values.items():
            setattr(self, key, value)
        self.logger.setLevel(log_level(self.info, self.warning, self.error, self.verbose))
        formatter = logging.Formatter(
            "%(asctime)s %(levelname).1s %(process)d %(name)s] %(message)s" if self.format == "ISO8601"
            else "%(levelname).1s%(asctime)s %(process)d %(name)s] %(message)s",
            datefmt="%Y-%m-%dT%H:%M:%SZ" if self.format == "ISO8601" else "%m%d %H:%M:%S",
        )
        for handler in self.logger.handlers:
            handler.setFormatter(formatter)

    def as_dict(self) -> dict[str, Any]:
        return {"log_file": self.file, "log_info": self.info, "log_warning": self.warning, "log_error": self.error,
                "log_verbose_level": self.verbose, "log_format": self.format}


# Triton's defaults (tritonserver --help): tracing off, every 1000th request, no count limit.
TRACE_DEFAULTS: dict[str, list[str]] = {
    "trace_level": ["OFF"],
    "trace_rate": ["1000"],
    "trace_count": ["-1"],
    "log_frequency": ["0"],
    "trace_file": [""],
    "trace_mode": ["triton"],
}


class TraceSettings:
    """Global trace settings and per-model overrides; a cleared model setting falls back to the global one.

    naiad collects no traces yet; with no trace file every level but OFF is refused, as Triton refuses it.
    """

    def __init__(self) -> None:
        self.global_settings = {k: list(v) for k, v in TRACE_DEFAULTS.items()}
        self.models: dict[str, dict[str, list[str]]] = {}

    def get(self, model: str = "") -> dict[str, list[str]]:
        settings = dict(self.global_settings)
        if model:
            settings.update(self.models.get(model, {}))
        return settings

    def update(self, model: str, changes: dict[str, list[str] | None]) -> None:
        """``None`` clears a setting: a model's returns to the global value, a global one to Triton's default.

        Like Triton, tracing can't be switched on without a trace file, and no file can be set remotely.
        """
        level = changes.get("trace_level", self.get(model)["trace_level"])
        if level is not None and level != ["OFF"] and self.get(model)["trace_file"] == [""]:
            raise invalid("Attempting to set invalid trace setting :trace file name is not given")
        for key, value in changes.items():
            if model:
                overrides = self.models.setdefault(model, {})
                if value is None:
                    overrides.pop(key, None)
                else:
                    overrides[key] = value
            else:
                self.global_settings[key] = list(TRACE_DEFAULTS[key]) if value is None else value
