"""Reading a config's ``parameters { key: "..." value { string_value: "..." } }`` as Triton's backends do."""

from __future__ import annotations

from naiad.config import ModelConfig
from naiad.core.errors import invalid


def string_param(config: ModelConfig, key: str, default: str | None = None) -> str | None:
    param = config.parameters.get(key)
    return param.string_value if param is not None else default


def parse_bool(value: str) -> bool:
    """Triton's ParseBoolValue: true/on/1 and false/off/0, any case."""
    lowered = value.lower()
    if lowered in ("true", "on", "1"):
        return True
    if lowered in ("false", "off", "0"):
        return False
    raise invalid(f"failed to convert '{value}' to boolean")


def parse_int(value: str) -> int:
    """Triton's ParseIntValue (std::stoi: leading integer, surrounding junk after it tolerated)."""
    text = value.strip()
    digits = len(text) - len(text.lstrip("+-"))
    end = digits
    while end < len(text) and text[end].isdigit():
        end += 1
    if end == digits or digits > 1:
        raise invalid(f"failed to convert '{value}' to integral number")
    return int(text[:end])


def bool_param(config: ModelConfig, key: str, default: bool) -> bool:
    value = string_param(config, key)
    return default if value is None else parse_bool(value)


def int_param(config: ModelConfig, key: str, default: int) -> int:
    value = string_param(config, key)
    return default if value is None else parse_int(value)
