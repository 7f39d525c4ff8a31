"""Execution environments (``parameters { key: "EXECUTION_ENV_PATH" ... }``): filled in below."""

from __future__ import annotations

from typing import Any

from naiad.backends.base import VersionContext


def resolve_environment(ctx: VersionContext) -> Any:
    return None
