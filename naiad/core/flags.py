"""Triton's boolean command-line values (``--strict-readiness=false``, ``--exit-on-error 1``, a bare
``--allow-http``), for ``naiad serve``'s and ``naiad ray serve``'s parsers alike."""

from __future__ import annotations

import argparse


def parse_bool(value: str | bool) -> bool:
    if isinstance(value, bool):
        return value
    lowered = value.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got '{value}'")


def add_flag(parser: argparse._ActionsContainer, name: str, default: bool, help: str) -> None:
    """``name`` as a flag that takes true/false (or nothing: true)."""
    parser.add_argument(name, type=parse_bool, nargs="?", const=True, default=default, metavar="BOOL", help=help)
