"""Render a ModelConfig as Triton's JSON: every field printed, int64 fields as JSON numbers.

Triton converts with protobuf's JSON printer (always printing primitive fields, in declaration
order) and then rewrites the quoted 64-bit integers as numbers; the descriptor tells which those are.
"""

from __future__ import annotations

from typing import Any

from google.protobuf import json_format
from google.protobuf.descriptor import Descriptor, FieldDescriptor

from naiad.config import ModelConfig

_INT64_TYPES = {
    FieldDescriptor.TYPE_INT64,
    FieldDescriptor.TYPE_UINT64,
    FieldDescriptor.TYPE_SINT64,
    FieldDescriptor.TYPE_FIXED64,
    FieldDescriptor.TYPE_SFIXED64,
}

_FLOAT_TYPES = {FieldDescriptor.TYPE_FLOAT, FieldDescriptor.TYPE_DOUBLE}


def _whole(value: Any) -> Any:
    return int(value) if isinstance(value, float) and value.is_integer() else value


def _message_to_dict(message: Any) -> dict[str, Any]:
    try:
        return json_format.MessageToDict(
            message, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
        )
    except TypeError:  # protobuf < 5 spells the option differently
        return json_format.MessageToDict(
            message, preserving_proto_field_name=True, including_default_value_fields=True
        )


def _normalize(descriptor: Descriptor, value: dict[str, Any]) -> dict[str, Any]:
    """Quoted 64-bit integers become numbers; keys follow the .proto declaration order, as Triton prints them."""
    out: dict[str, Any] = {}
    for field in descriptor.fields:
        if field.name not in value:
            continue
        item = value[field.name]
        if field.type in _INT64_TYPES:
            item = [int(v) for v in item] if isinstance(item, list) else int(item)
        elif field.type in _FLOAT_TYPES:
            # Triton's JSON writer prints a whole float without a fraction (fp32_false_true: [0, 1]).
            item = [_whole(v) for v in item] if isinstance(item, list) else _whole(item)
        elif field.type == FieldDescriptor.TYPE_MESSAGE:
            sub = field.message_type
            if sub.GetOptions().map_entry:
                value_field = sub.fields_by_name["value"]
                if value_field.type in _INT64_TYPES:
                    item = {k: int(v) for k, v in item.items()}
                elif value_field.type == FieldDescriptor.TYPE_MESSAGE:
                    item = {k: _normalize(value_field.message_type, v) for k, v in item.items()}
            elif isinstance(item, list):
                item = [_normalize(sub, element) for element in item]
            else:
                item = _normalize(sub, item)
        out[field.name] = item
    return out


def config_to_dict(config: ModelConfig) -> dict[str, Any]:
    return _normalize(config.DESCRIPTOR, _message_to_dict(config))


def dict_to_config(value: dict[str, Any]) -> ModelConfig:
    """The inverse, for configs that come back from a Python model's ``auto_complete_config``."""
    config = ModelConfig()
    json_format.ParseDict(value, config)
    return config
