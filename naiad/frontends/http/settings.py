"""Triton's trace and logging extensions over HTTP: ``/v2/trace/setting``, ``/v2/models/{m}/trace/setting`` and
``/v2/logging``. GET shows the settings, POST changes them and shows the result.

The values' checks are the core's (``naiad.core.settings``); here only the JSON types, with Triton's words. Triton
answers a wrong JSON type or a body that isn't JSON with a 500; naiad with a 400, the client's fault.
"""

from __future__ import annotations

from typing import Any

import orjson

from naiad.core.errors import invalid
from naiad.core.settings import LOG_KEYS, log_changes, no_file_change, trace_changes
from naiad.frontends.replies import Reply, json_reply
from naiad.service import Administration, Face

_JSON_TYPES = {bool: "boolean", int: "unsigned-integer", str: "string", list: "array"}


async def trace(service: Face, method: bytes, model: str, body: bytes | bytearray) -> Reply:
    if model and not service.model_ready(model):
        raise invalid(f"Request for unknown model : {model}")
    if method == b"POST":
        document = _document(body)
        values: dict[str, list[str] | None] = {}
        for key in ("trace_file", "trace_level", "trace_rate", "trace_count", "log_frequency"):
            if key not in document:
                continue
            value = document[key]
            if value is None:
                values[key] = None
            elif key == "trace_level":
                values[key] = [_typed(level, str) for level in _typed(value, list)]
            else:
                values[key] = [_typed(value, str)]
        await service.update_trace_settings(model, trace_changes(values))
    # The tracer lists them in Triton's order; HTTP shows the levels as a list and every other value as a string.
    return json_reply({key: value if key == "trace_level" else value[0]
                       for key, value in (await service.trace_settings(model)).items()})


async def logging(service: Administration, method: bytes, body: bytes | bytearray) -> Reply:
    if method == b"POST":
        document = _document(body)
        if document.get("log_file") is not None:
            raise no_file_change("log_file")
        values = {}
        for key, (_, kind) in LOG_KEYS.items():
            if document.get(key) is not None:
                values[key] = _typed(document[key], kind)
        await service.update_log_settings(log_changes(values, format_flag="--log_format"))
    return json_reply(await service.log_settings_values())


def _document(body: bytes | bytearray) -> dict[str, Any]:
    try:
        document = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise invalid(f"failed to parse the request JSON buffer: {exc}") from None
    return document if isinstance(document, dict) else {}  # Triton finds no settings in anything else


def _typed(value: Any, kind: type) -> Any:
    # bool is an int in Python, not in JSON; verbose levels are unsigned.
    wrong = not isinstance(value, kind) or (isinstance(value, int) and kind is int and (isinstance(value, bool)
                                                                                       or value < 0))
    if wrong:
        name = _JSON_TYPES[kind]
        raise invalid(f"attempt to access JSON non-{name} as {name}")
    return value
