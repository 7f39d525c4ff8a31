"""The HTTP front end's access settings and their ``tritonserver`` flag names: restricted APIs and header
forwarding. No server import here: the CLI reads these before starting anything."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass, field

from naiad.core.forwarding import HeaderForward
from naiad.core.restricted import Restrictions, help_text


@dataclass
class HttpOptions:
    restricted: Restrictions = field(default_factory=lambda: Restrictions("api"))
    header_forward: HeaderForward | None = None  # None: no header reaches the model


def add_arguments(parser: argparse.ArgumentParser, flag: Callable[..., None]) -> None:
    parser.add_argument("--http-restricted-api", action="append", default=[], metavar="<apis>:<key>=<value>",
                        help=help_text("api", "the header <key>") + "; refused with 403")
    parser.add_argument("--http-header-forward-pattern", default="", metavar="REGEX",
                        help="infer requests' headers whose name this regular expression matches (anywhere in the "
                             "name, ignoring case) reach the model as string parameters; empty: none")


def from_args(args: argparse.Namespace) -> HttpOptions:
    """Raises ``ValueError`` with Triton's message for a malformed flag."""
    return HttpOptions(
        restricted=Restrictions.parse(args.http_restricted_api, "http-restricted-api", "api"),
        header_forward=HeaderForward(args.http_header_forward_pattern) if args.http_header_forward_pattern else None,
    )
