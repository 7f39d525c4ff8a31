"""Header forwarding (``--http-header-forward-pattern``, ``--grpc-header-forward-pattern``): request headers or
metadata whose name the pattern matches become the request's string parameters, as in Triton: the pattern is
searched anywhere in the name (RE2::PartialMatch), ignoring case (Triton prefixes ``(?i)``), and the parameter
takes the name as the client sent it. A forwarded header replaces a parameter of the same name from the body.
"""

from __future__ import annotations

import re
from collections.abc import Iterable


class HeaderForward:
    __slots__ = ("pattern", "search")

    def __init__(self, pattern: str) -> None:
        try:
            self.search = re.compile(pattern, re.IGNORECASE).search
        except re.error as exc:
            raise ValueError(f"invalid header forward pattern '{pattern}': {exc}") from None
        self.pattern = pattern

    def select(self, pairs: Iterable[tuple[str, str]]) -> dict[str, str]:
        """The forwarded parameters among ``(name, value)`` pairs; a repeated name keeps its last value."""
        search = self.search
        return {name: value for name, value in pairs if search(name)}
