"""Restricted API categories (``--http-restricted-api``, ``--grpc-restricted-protocol``), as Triton defines them
(restricted_features.h): a request in a restricted category must carry a header (HTTP) or metadata key (gRPC)
with the configured value. Each front end maps its routes / RPCs onto these categories and answers a refusal
with its own status code, but the flag syntax, the categories and the wording live here.
"""

from __future__ import annotations

from collections.abc import Iterable

CATEGORIES = ("health", "metadata", "inference", "shared-memory", "model-config", "model-repository", "statistics",
              "trace", "logging")


class Restrictions:
    """category -> (key, value) for the restricted categories of one protocol. Falsy when nothing is restricted,
    so a front end tests it once at start-up and adds no per-request work otherwise."""

    __slots__ = ("kind", "rules")

    def __init__(self, kind: str = "api", rules: dict[str, tuple[str, str]] | None = None) -> None:
        self.kind = kind  # "api" (HTTP) or "protocol" (gRPC): Triton's word in messages
        self.rules = rules or {}

    def __bool__(self) -> bool:
        return bool(self.rules)

    def rule(self, category: str) -> tuple[str, str] | None:
        return self.rules.get(category)

    def refusal(self, category: str) -> str:
        noun = "API" if self.kind == "api" else self.kind  # Triton's capitals differ from its flag messages
        return f"This {noun} is restricted, expecting header '{self.rules[category][0]}'"

    @classmethod
    def parse(cls, values: Iterable[str], option: str, kind: str, key_prefix: str = "") -> Restrictions:
        """``<category>[,<category>...]:<key>=<value>``, repeatable; a category may be named only once.
        Raises ``ValueError`` with Triton's message (command_line_parser.cc)."""
        rules: dict[str, tuple[str, str]] = {}
        for value in values:
            names, colon, setting = value.partition(":")
            key, equals, expected = setting.partition("=")
            if not (colon and equals and names and key and expected):
                raise ValueError(f"--{option} option format is '<config name>:<setting>=<value>'. Got {value}")
            for name in names.split(","):
                if name not in CATEGORIES:
                    raise ValueError(f"unknown restricted {kind} '{name}'")
                if name in rules:
                    raise ValueError(f"restricted {kind} '{name}' can not be specified in multiple config groups")
                rules[name] = (key_prefix + key, expected)
        return cls(kind, rules)


def help_text(kind: str, example_key: str) -> str:
    """The flag's --help line: its syntax and the categories."""
    return (f"<{kind}s>:<key>=<value>, repeatable: requests in these comma-separated categories must carry "
            f"{example_key} with this value. Categories: {', '.join(CATEGORIES)}")
