"""The HTTP front end's access settings and their ``tritonserver`` flag names: restricted APIs and header
forwarding; and naiad's own connection limits (``limits.py``: Triton has none). No server import here: the CLI
reads these before starting anything."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass, field

from naiad.core.forwarding import HeaderForward
from naiad.core.restricted import Restrictions, help_text
from naiad.frontends.http.limits import FLAGS, HttpLimits


@dataclass
class HttpOptions:
    restricted: Restrictions = field(default_factory=lambda: Restrictions("api"))
    header_forward: HeaderForward | None = None  # None: no header reaches the model
    limits: HttpLimits = field(default_factory=HttpLimits)  # per connection and per port (HTTP and SageMaker)
    dashboard: bool = True  # --allow-dashboard: GET /dashboard (naiad/frontends/dashboard)
    allowed_hosts: list[str] = field(default_factory=list)  # --http-allowed-hosts (browsers.py), HTTP and SageMaker


def add_arguments(parser: argparse.ArgumentParser, flag: Callable[..., None]) -> None:
    parser.add_argument("--http-restricted-api", action="append", default=[], metavar="<apis>:<key>=<value>",
                        help=help_text("api", "the header <key>") + "; refused with 403")
    parser.add_argument("--http-header-forward-pattern", default="", metavar="REGEX",
                        help="infer requests' headers whose name this regular expression matches (anywhere in the "
                             "name, ignoring case) reach the model as string parameters; empty: none")
    flag(parser, "--allow-dashboard", True, "serve the live dashboard at /dashboard (the SageMaker port's when HTTP is "
                                            "off); its feed needs the header of each category it shows (health, "
                                            "metadata, model-config, model-repository, statistics) that "
                                            "--http-restricted-api restricts")
    parser.add_argument("--http-allowed-hosts", action="append", default=[], metavar="NAME",
                        help="a Host name requests that change the server's state (load, unload, shared memory, log "
                             "and trace settings) may use, on the HTTP and SageMaker ports (repeatable; '*': any). "
                             "IP addresses, localhost and this machine's names always may; others are refused with "
                             "403 against DNS rebinding")
    d = HttpLimits()
    limit = parser.add_argument
    limit("--http-max-pipelined-requests", type=int, default=d.max_pipelined, metavar="N",
          help="requests one connection may have in flight (HTTP/1.1 pipelining); past it naiad stops reading "
               "that connection until answers go out")
    limit("--http-write-buffer-size", type=int, default=d.write_buffer, metavar="BYTES",
          help="answers queued for a client that reads slowly before naiad stops reading its requests")
    limit("--http-keepalive-timeout", type=float, default=d.keepalive_timeout, metavar="SECONDS",
          help="an idle keep-alive connection is closed after this long; 0: never (as Triton)")
    limit("--http-header-timeout", type=float, default=d.header_timeout, metavar="SECONDS",
          help="a request whose headers take longer than this to arrive is dropped and the connection closed; 0: "
               "never")
    limit("--http-body-timeout", type=float, default=d.body_timeout, metavar="SECONDS",
          help="a request body that stalls this long between two reads is answered 408 and the connection "
               "closed; 0: never")
    limit("--http-send-timeout", type=float, default=d.send_timeout, metavar="SECONDS",
          help="a client that reads none of its answers for this long is disconnected; 0: never")
    limit("--http-max-url-size", type=int, default=d.max_url_size, metavar="BYTES",
          help="longest request URL; longer ones are answered 414")
    limit("--http-max-header-size", type=int, default=d.max_header_size, metavar="BYTES",
          help="largest total size of a request's header names and values; larger heads are answered 431")
    limit("--http-max-header-count", type=int, default=d.max_header_count, metavar="N",
          help="most header fields in one request; more are answered 431")
    limit("--http-max-connections", type=int, default=d.max_connections, metavar="N",
          help="connections served at once per port (HTTP, and SageMaker's); one more is answered 503 and "
               "closed; 0: no limit but the open file limit's, which lowers every port's cap to fit (its soft limit "
               "is raised to the hard one at start)")
    limit("--http-max-connections-per-address", type=int, default=d.max_connections_per_address, metavar="N",
          help="connections one client address may hold at once per port; one more is answered 503 and closed; 0: "
               "no limit")
    limit("--http-first-request-timeout", type=float, default=d.first_request_timeout, metavar="SECONDS",
          help="a new connection that sends no complete request head within this long is closed (idle sockets "
               "holding slots); 0: only the keep-alive and header timeouts apply")


def from_args(args: argparse.Namespace) -> HttpOptions:
    """Raises ``ValueError`` with Triton's message for a malformed flag."""
    return HttpOptions(
        restricted=Restrictions.parse(args.http_restricted_api, "http-restricted-api", "api"),
        header_forward=HeaderForward(args.http_header_forward_pattern) if args.http_header_forward_pattern else None,
        limits=HttpLimits(**{name: getattr(args, "http_" + flag.replace("-", "_")) for name, flag in FLAGS.items()}),
        dashboard=args.allow_dashboard,
        allowed_hosts=args.http_allowed_hosts,
    )
