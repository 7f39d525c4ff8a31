"""Render a ModelConfig as Triton's JSON: every field printed, int64 fields as JSON numbers.

Triton converts with protobuf's JSON printer (always printing primitive fields) and then rewrites
the quoted 64-bit integers as numbers; the descriptor tells which fields those are.
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


def _message_to_dict(message: Any) -> dict[str, Any]:
    try:
        return json_format.MessageToDict(
            message, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
        )
    except TypeError:  # protobuf < 5 spells the option differently
        return json_format.MessageToDict(
            message, preserving_proto_field_name=True, including_default_value_fields=True
        )


def _int64_to_numbers(descriptor: Descriptor, value: dict[str, Any]) -> None:
    for field in descriptor.fields:
        if field.name not in value:
            continue
        item = value[field.name]
        if field.type in _INT64_TYPES:
            value[field.name] = [int(v) for v in item] if isinstance(item, list) else int(item)
        elif field.type == FieldDescriptor.TYPE_MESSAGE:
            sub = field.message_type
            if sub.GetOptions().map_entry:
                value_field = sub.fields_by_name["value"]
                for key in list(item):
                    if value_field.type in _INT64_TYPES:
                        item[key] = int(item[key])
                    elif value_field.type == FieldDescriptor.TYPE_MESSAGE:
                        _int64_to_numbers(value_field.message_type, item[key])
            elif isinstance(item, list):
                for element in item:
                    _int64_to_numbers(sub, element)
            else:
                _int64_to_numbers(sub, item)


def config_to_dict(config: ModelConfig) -> dict[str, Any]:
    value = _message_to_dict(config)
    _int64_to_numbers(config.DESCRIPTOR, value)
    return value


def dict_to_config(value: dict[str, Any]) -> ModelConfig:
    """The inverse, for configs that come back from a Python model's ``auto_complete_config``."""
    config = ModelConfig()
    json_format.ParseDict(value, config)
    return config
