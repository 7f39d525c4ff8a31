"""The ports one process serves over a face: HTTP (KServe v2 and the dashboard), SageMaker's and gRPC. A part
that a server is composed of: in one process it serves over the in-process face, from ports it binds itself
(``bind``); in a front-end process over the model host's face, from the ports the host bound and passed on.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from naiad.frontends import poll, ports
from naiad.frontends.connections import Gate, gates, raise_nofile
from naiad.frontends.http.limits import Listener
from naiad.frontends.http.protocol import HttpProtocol
from naiad.frontends.http.routes import Router
from naiad.service import Face

if TYPE_CHECKING:
    from naiad.server import ServerOptions

log = logging.getLogger("naiad")
STOP_GRACE = 0.5  # seconds a stopping gRPC port gives calls still open to end (within the exit timeout)


def admission(options: ServerOptions) -> dict[str, Gate]:
    """Each served port's admission, its cap lowered to fit the open file limit (raised to the hard one)."""
    limits, grpc = options.http.limits, options.grpc
    caps = {}
    if options.allow_http:
        caps["HTTP"] = (limits.max_connections, limits.max_connections_per_address)
    if options.sagemaker.enabled:
        caps["Sagemaker"] = (limits.max_connections, limits.max_connections_per_address)
    if grpc.enabled:
        caps["GRPC"] = (grpc.max_connections, grpc.max_connections_per_address)
    return gates(caps, raise_nofile())


def bind(options: ServerOptions, processes: int = 1) -> dict[str, ports.Port]:
    """The HTTP, SageMaker and gRPC ports, each bound once (in the order they have always opened in), before
    anything serves them: Triton's line (``SystemExit``) for one that is taken, with what was bound closed. The
    lean gRPC engine serves from its sockets as HTTP does; grpcio binds its own (it can't adopt a socket), so
    with front-end ``processes`` its port gets the host's guard (naiad/frontends/ports.py), and with one
    process nothing here."""
    bound = dict[str, ports.Port]()
    grpc = options.grpc
    try:
        if options.allow_http:
            bound["HTTP"] = ports.listen("HTTP", options.http_address, options.http_port, options.reuse_http_port)
        if options.sagemaker.enabled:
            bound["Sagemaker"] = ports.listen("Sagemaker", options.sagemaker.address, options.sagemaker.port)
        if grpc.enabled and grpc.chosen_engine() == "lean":
            bound["GRPC"] = ports.listen("GRPC", grpc.address, grpc.port, grpc.reuse_port)
        elif grpc.enabled and processes > 1:
            bound["GRPC"] = ports.guard("GRPC", grpc.address, grpc.port, grpc.reuse_port)
    except SystemExit:
        for port in bound.values():
            port.close()
        raise
    return bound


def dashboard_url(address: str, port: int) -> str:
    """Where a browser on this machine opens the dashboard (a wildcard address listens on loopback too)."""
    host = "localhost" if address in ("", "0.0.0.0", "::") else f"[{address}]" if ":" in address else address
    return f"http://{host}:{port}/dashboard"


def _started_http(options: ServerOptions) -> None:
    log.info("Started HTTPService at %s:%d", options.http_address, options.http_port)
    if options.http.dashboard:
        log.info("Dashboard at %s", dashboard_url(options.http_address, options.http_port))


def _started_sagemaker(options: ServerOptions) -> None:
    log.info("Started Sagemaker HTTPService at %s:%d", options.sagemaker.address, options.sagemaker.port)
    if not options.allow_http and options.http.dashboard:
        log.info("Dashboard at %s", dashboard_url(options.sagemaker.address, options.sagemaker.port))


def announce(options: ServerOptions) -> None:
    """The lines Triton writes as its ports open, for ports served by other processes."""
    if options.allow_http:
        _started_http(options)
    if options.sagemaker.enabled:
        _started_sagemaker(options)
    if options.grpc.enabled:
        log.info("Started GRPCInferenceService at %s:%d", options.grpc.address, options.grpc.port)


class Ports:
    """The ports served here, over ``service``."""

    def __init__(self, options: ServerOptions, service: Face) -> None:
        self.options = options
        self.service = service
        self.servers: list[Any] = []  # each port's asyncio servers (or acceptors: ports.Port.serve)
        self.grpc: Any = None  # grpc.aio.Server, or the lean engine's server

    async def open(self, served: dict[str, ports.Port], gate: Mapping[str, Gate]) -> None:
        """Serve ``served`` (bound already), each port admitting connections through its ``gate``."""
        options, service = self.options, self.service
        poll.POLL.configure(options.idle_poll_us)
        poll.POLL.watch(lambda: service.in_flight)
        if options.allow_http:
            router = Router(service, options.http, options.http_max_input_size)
            protocol = HttpProtocol
            if options.http.header_forward is not None:
                from naiad.frontends.http.forwarding import NamedHeadersProtocol as protocol  # type: ignore[assignment]
            await self._listen(served["HTTP"], router, protocol, gate["HTTP"])
            _started_http(options)
        if options.sagemaker.enabled:
            from naiad.frontends.sagemaker.routes import SageMakerRouter

            # The dashboard is served here when HTTP is off.
            sagemaker_router = SageMakerRouter(service, options.sagemaker,
                                               None if options.allow_http else options.http,
                                               options.http.allowed_hosts)
            await self._listen(served["Sagemaker"], sagemaker_router, gate=gate["Sagemaker"])
            _started_sagemaker(options)
        if options.grpc.enabled:
            from naiad.frontends.grpc import (
                server as grpc_server,  # grpc loads only when it is served
            )

            self.grpc = await grpc_server.start(service, options.grpc, gate["GRPC"], served.get("GRPC"))

    async def _listen(self, port: ports.Port, router: object, protocol: type[HttpProtocol] = HttpProtocol,
                      gate: Gate | None = None) -> None:
        max_body = self.options.http_max_input_size
        listener = Listener(self.options.http.limits, gate)  # this port's own connection count
        self.servers += await port.serve(lambda: protocol(router, max_body, listener))  # type: ignore[arg-type]

    async def close(self, deadline: float | None = None) -> None:
        """Stop listening and close the connections (after the drain: their answers are written)."""
        for server in self.servers:
            server.close()
        if self.grpc is not None:
            # Either engine cuts what is still running at once, unless a grace lets it send the answers that are
            # still being written: a stream's last ones, the drain's own, or those just cut.
            await self.grpc.stop(grace=min(STOP_GRACE, max(0.0, deadline - time.monotonic())) if deadline else None)
