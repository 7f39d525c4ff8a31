"""Ray Serve's settings that cut the CPU a request costs in naiad's processes (benchmarks/ray_hop_cpu.py; README,
"Scale out on Ray Serve"), as environment variables.

Ray reads each where Ray Serve is imported: ``REPLICA_ENV`` in each replica's own process (so a deployment's
``runtime_env`` carries it to any cluster), ``ray_environment`` in every process of a Ray instance (so it is set
before the instance starts: by ``naiad ray serve`` for the Ray it starts, on ``ray start`` for a cluster's).
Kept free of Ray imports.
"""

from __future__ import annotations

from naiad.ray.options import RayServeOptions

# What Ray's RAY_SERVE_THROUGHPUT_OPTIMIZED turns on inside a replica, without its direct ingress (which needs the
# whole cluster's consent): the ingress's handle routes on the replica's own loop, user code runs there too (no
# thread hop each way), a handle call goes to the replica over gRPC rather than as an actor task, request-path log
# lines are buffered, and the objects alive at start are frozen out of the garbage collector's scans.
REPLICA_ENV = {
    "RAY_SERVE_RUN_ROUTER_IN_SEPARATE_LOOP": "0",
    "RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD": "0",
    "RAY_SERVE_USE_GRPC_BY_DEFAULT": "1",
    "RAY_SERVE_REQUEST_PATH_LOG_BUFFER_SIZE": "1000",
    "RAY_SERVE_FREEZE_GC_ON_STARTUP": "1",
}


def direct_ingress_env(http_port: int, grpc_port: int, replicas: int) -> dict[str, str]:
    """Ray's direct ingress: the ingress replicas serve clients themselves, each on a port of its node's range, here
    the ``replicas`` ports from ``http_port`` (and from ``grpc_port``: gRPC, when not 0). Ray still starts its proxy
    on the head node; naiad gives it ports of its own (see ``naiad.ray.cli``)."""
    env = {"RAY_SERVE_ENABLE_DIRECT_INGRESS": "1",
           "RAY_SERVE_DIRECT_INGRESS_MIN_HTTP_PORT": str(http_port),
           "RAY_SERVE_DIRECT_INGRESS_MAX_HTTP_PORT": str(http_port + replicas),  # exclusive
           # Ray waits this long (default 30 s) before an ingress replica stops, for a load balancer in front to
           # stop sending it requests; naiad's clients have none to tell.
           "RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S": "0"}
    if grpc_port:
        env["RAY_SERVE_DIRECT_INGRESS_MIN_GRPC_PORT"] = str(grpc_port)
        env["RAY_SERVE_DIRECT_INGRESS_MAX_GRPC_PORT"] = str(grpc_port + replicas)
    return env


def ray_environment(options: RayServeOptions) -> dict[str, str]:
    """The environment of a Ray instance started for ``options`` (``naiad ray serve`` without ``--address``)."""
    env: dict[str, str] = {}
    if options.throughput_optimized:
        env.update(REPLICA_ENV)
    if options.direct_ingress:
        env.update(direct_ingress_env(options.http_port, options.grpc_port, options.ingress_replicas))
    return env


def replica_environment(options: RayServeOptions) -> dict[str, str]:
    """Environment variables for the deployments' ``runtime_env``: on any cluster."""
    env = dict(REPLICA_ENV) if options.throughput_optimized else {}
    if options.min_replicas != options.max_replicas:
        env.update(options.metrics_push_env())
    return env
