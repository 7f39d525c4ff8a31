"""``naiad ray serve``: start (or join) Ray, deploy the application, serve until SIGTERM / SIGINT."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading

from naiad.core.free_ports import free_port
from naiad.ray import options as ray_options

log = logging.getLogger("naiad.ray")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    commands = parser.add_subparsers(dest="ray_command", required=True)
    serve = commands.add_parser("serve", help="serve a model repository on Ray Serve: replicas of naiad behind "
                                              "Ray's proxy, each request routed to a replica holding its model",
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ray_options.add_arguments(serve)


def _has_direct_ingress() -> bool:
    try:
        from ray.serve._private import constants
    except ImportError:
        return False
    return hasattr(constants, "RAY_SERVE_DIRECT_INGRESS_MIN_HTTP_PORT")


def run(args: argparse.Namespace) -> int:
    try:
        options = ray_options.from_args(args)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    logging.basicConfig(level=logging.DEBUG if options.log_verbose else logging.INFO,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        import ray
        from ray import serve
    except ImportError:
        print("error: naiad ray serve needs Ray Serve: pip install 'naiad[ray]'", file=sys.stderr)
        return 1
    from naiad.ray.application import build
    from naiad.ray.rpc import SERVICER
    from naiad.ray.tuning import ray_environment

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    joined = bool(options.address)
    if joined:
        ray.init(address=options.address, namespace="naiad", log_to_driver=False)
    else:
        if options.direct_ingress and not _has_direct_ingress():
            log.warning("this Ray Serve has no direct ingress: clients go through its proxy")
            options.direct_ingress = False
        # Before Ray starts: its processes (and Serve's constants in each) take this process's environment.
        os.environ.update(ray_environment(options))
        ray.init(include_dashboard=False, namespace="naiad")
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    try:
        http_port, grpc_port = options.http_port, options.grpc_port
        if options.uses_direct_ingress():
            # The ingress takes the clients' ports; Ray's proxy, which Ray starts on the head node anyway, gets
            # others: any free one for HTTP, and for gRPC a free one it binds (Ray serves gRPC in the ingress only
            # where its proxy's gRPC port is set).
            http_port, grpc_port = 0, free_port("") if grpc_port else 0
        grpc = {"port": grpc_port, "grpc_servicer_functions": [SERVICER]} if grpc_port else None
        serve.start(http_options={"host": options.http_host, "port": http_port}, grpc_options=grpc)
        serve.run(build(options), name=options.app_name, route_prefix=options.route_prefix, blocking=False)
        print(f"naiad on Ray Serve: application '{options.app_name}' at http://{options.http_host}:"
              f"{options.http_port}{options.route_prefix.rstrip('/')}/v2"
              + (f" and gRPC port {options.grpc_port}" if options.grpc_port else "")
              + (" (direct ingress" + (f", {options.ingress_replicas} ingress replicas on as many ports from each"
                                       if options.ingress_replicas > 1 else "") + ")"
                 if options.uses_direct_ingress() else ""), flush=True)
        stop.wait()
    finally:
        # Joined to a cluster: take our application down and leave Serve to others; else stop it all.
        try:
            if joined:
                serve.delete(options.app_name)
            else:
                serve.shutdown()
        finally:
            ray.shutdown()
    return 0
