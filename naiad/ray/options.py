"""``naiad ray serve``'s flags and the same settings as a Serve config file's ``args`` (``naiad.ray:app``).

Kept free of Ray imports: the command line's parser is built whether or not Ray is installed.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Mapping

from naiad.core.flags import add_flag


@dataclass
class RayServeOptions:
    model_repositories: list[str] = field(default_factory=list)  # folders or s3://..., as naiad serve takes them
    app_name: str = "naiad"
    route_prefix: str = "/"
    http_host: str = "127.0.0.1"
    http_port: int = 8000
    # KServe v2 gRPC through Ray's gRPC proxy (naiad.ray.rpc); 0: none. Ray binds it on every interface.
    grpc_port: int = 0
    address: str = ""  # a running Ray cluster ("auto", "ray://host:10001"); empty: start one in this process
    # Model-aware routing: each replica keeps at most this many models, least recently used evicted first.
    max_models_per_replica: int = 3
    # A model stays loaded at least this long before it may be unloaded for another: a replica asked for more
    # models than it may hold (a peer died, and its models land here) loads at most one per period instead of
    # one per request; requests for the others wait (bounded by it) rather than evict a model in use.
    min_model_residency_s: float = 2.0
    # Ray's autoscaling_config: min_replicas == max_replicas means a fixed number of replicas.
    min_replicas: int = 1
    max_replicas: int = 1
    initial_replicas: int | None = None
    target_ongoing_requests: float = 2.0
    upscale_delay_s: float = 30.0
    downscale_delay_s: float = 600.0
    metrics_interval_s: float = 10.0
    look_back_period_s: float = 30.0
    max_ongoing_requests: int = 64  # per replica, Serve's back-pressure
    replica_num_cpus: float = 1.0
    ingress_num_cpus: float = 0.0  # the ingress only forwards; it shares a core
    ingress_replicas: int = 1
    # Ray Serve's throughput settings inside naiad's replicas (naiad.ray.tuning.REPLICA_ENV), on any cluster.
    throughput_optimized: bool = True
    # The ingress serves clients on --http-port / --grpc-port itself (Ray's direct ingress), Ray's proxy out of the
    # request's path. Only for the Ray instance `naiad ray serve` starts; a cluster's is set on `ray start`.
    direct_ingress: bool = True
    # SageMaker: boto3's invoke_endpoint names the model with TargetModel (a multi-model endpoint); without it,
    # /invocations and the runtime door serve the default model.
    default_model: str = ""
    backend_config: list[str] = field(default_factory=list)
    log_verbose: int = 0

    def uses_direct_ingress(self) -> bool:
        """Whether the Ray this command starts serves through the ingress's own ports (not with --address)."""
        return self.direct_ingress and not self.address

    def autoscaling_config(self) -> dict[str, Any]:
        config: dict[str, Any] = {
            "min_replicas": self.min_replicas,
            "max_replicas": self.max_replicas,
            "target_ongoing_requests": self.target_ongoing_requests,
            "upscale_delay_s": self.upscale_delay_s,
            "downscale_delay_s": self.downscale_delay_s,
            "look_back_period_s": self.look_back_period_s,
        }
        if self.initial_replicas is not None:
            config["initial_replicas"] = self.initial_replicas
        return config

    def metrics_push_env(self) -> dict[str, str]:
        """How often replicas and handles report load to the autoscaler: environment variables in Ray 2.5x
        (autoscaling_config's metrics_interval_s is deprecated), set in the deployments' runtime_env."""
        interval = f"{self.metrics_interval_s:g}"
        return {"RAY_SERVE_REPLICA_AUTOSCALING_METRIC_PUSH_INTERVAL_S": interval,
                "RAY_SERVE_HANDLE_AUTOSCALING_METRIC_PUSH_INTERVAL_S": interval}

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> "RayServeOptions":
        """A Serve config file's ``args`` (or ``serve run naiad.ray:app key=value``): flag names with
        underscores; values given as text (serve run) are converted to the field's type."""
        known = {f.name: f for f in fields(cls)}
        unknown = sorted(set(values) - set(known) - {"model_repository"})
        if unknown:
            raise ValueError(f"unknown naiad.ray:app argument(s): {', '.join(unknown)}")
        defaults = cls()
        kwargs: dict[str, Any] = {}
        for key, value in values.items():
            if key == "model_repository":  # the flag's singular spelling
                key = "model_repositories"
            default = getattr(defaults, key)
            if isinstance(default, list) and isinstance(value, str):
                # serve run's text: repositories comma-separated; a backend setting has commas of its own
                value = [v for v in value.split(",") if v] if key == "model_repositories" else [value]
            elif isinstance(default, bool):
                value = value if isinstance(value, bool) else str(value).lower() in ("1", "true", "yes", "on")
            elif isinstance(default, int) or key == "initial_replicas":
                value = int(value)
            elif isinstance(default, float):
                value = float(value)
            kwargs[key] = value
        options = cls(**kwargs)
        options.check()
        return options

    def check(self) -> None:
        if not self.model_repositories:
            raise ValueError("a model repository is required (--model-repository)")
        if not 0 <= self.grpc_port < 65536:
            raise ValueError("--grpc-port must be a port number (0: no gRPC)")
        if self.max_models_per_replica < 1:
            raise ValueError("--max-models-per-replica must be at least 1")
        if self.min_model_residency_s < 0:
            raise ValueError("--min-model-residency-s must not be negative")
        if self.ingress_replicas < 1:
            raise ValueError("--ingress-replicas must be at least 1")
        if not 0 < self.http_port < 65536 - self.ingress_replicas:
            raise ValueError("--http-port must be a port number")
        if self.uses_direct_ingress() and self.grpc_port and abs(self.grpc_port - self.http_port) < self.ingress_replicas:
            raise ValueError(f"--direct-ingress: the {self.ingress_replicas} ingress replicas listen on as many ports "
                             f"from --http-port and from --grpc-port, which overlap; set them further apart")
        if not 0 <= self.min_replicas <= self.max_replicas or self.max_replicas < 1:
            raise ValueError("expected 0 <= --min-replicas <= --max-replicas and --max-replicas >= 1")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    d = RayServeOptions()
    parser.add_argument("--model-repository", "--model-store", action="append", required=True,
                        dest="model_repository",
                        help="model repository every replica serves: a folder (reachable on every node) or "
                             "s3://bucket/prefix (repeatable)")
    parser.add_argument("--address", default=d.address,
                        help="Ray cluster to join ('auto', 'ray://head:10001'); empty: start Ray in this process")
    parser.add_argument("--app-name", default=d.app_name, help="the Serve application's name")
    parser.add_argument("--route-prefix", default=d.route_prefix, help="where the application is served")
    parser.add_argument("--http-address", dest="http_host", default=d.http_host,
                        help="address Ray Serve's HTTP proxy binds (the first start of Serve on the cluster)")
    parser.add_argument("--http-port", type=int, default=d.http_port, help="Ray Serve's HTTP proxy port")
    parser.add_argument("--grpc-port", type=int, default=d.grpc_port,
                        help="serve KServe v2 gRPC (inference.GRPCInferenceService) on Ray Serve's gRPC proxy at this "
                             "port, on every interface (Ray has no address setting for it); 0: no gRPC. Like the "
                             "HTTP port, it is set by the first start of Serve on the cluster")
    parser.add_argument("--max-models-per-replica", type=int, default=d.max_models_per_replica,
                        help="models a replica keeps loaded; the least recently used is unloaded beyond it")
    parser.add_argument("--min-model-residency-s", type=float, default=d.min_model_residency_s,
                        help="seconds a loaded model stays before another may unload it: a replica asked for more "
                             "models than it holds (e.g. after a peer died) waits this long rather than reload on "
                             "every request")
    scaling = parser.add_argument_group("autoscaling (Ray Serve's autoscaling_config)")
    scaling.add_argument("--num-replicas", type=int, default=None,
                         help="a fixed number of replicas (sets --min-replicas and --max-replicas)")
    scaling.add_argument("--min-replicas", type=int, default=d.min_replicas)
    scaling.add_argument("--max-replicas", type=int, default=d.max_replicas)
    scaling.add_argument("--initial-replicas", type=int, default=None)
    scaling.add_argument("--target-ongoing-requests", type=float, default=d.target_ongoing_requests,
                         help="requests in flight per replica the autoscaler aims at")
    scaling.add_argument("--upscale-delay-s", type=float, default=d.upscale_delay_s)
    scaling.add_argument("--downscale-delay-s", type=float, default=d.downscale_delay_s)
    scaling.add_argument("--metrics-interval-s", type=float, default=d.metrics_interval_s,
                         help="how often replicas report their load to the autoscaler")
    scaling.add_argument("--look-back-period-s", type=float, default=d.look_back_period_s)
    scaling.add_argument("--max-ongoing-requests", type=int, default=d.max_ongoing_requests,
                         help="requests a replica takes at once; more wait in Serve's queue")
    parser.add_argument("--replica-num-cpus", type=float, default=d.replica_num_cpus,
                        help="CPUs Ray reserves for each model replica")
    parser.add_argument("--ingress-num-cpus", type=float, default=d.ingress_num_cpus,
                        help="CPUs Ray reserves for each ingress replica")
    parser.add_argument("--ingress-replicas", type=int, default=d.ingress_replicas,
                        help="ingress replicas; under direct ingress each listens on its own ports: the N ports "
                             "from --http-port (and from --grpc-port) on one machine")
    tuning = parser.add_argument_group("Ray Serve's per-request cost (naiad.ray.tuning; README, 'Scale out on Ray "
                                       "Serve')")
    add_flag(tuning, "--throughput-optimized", d.throughput_optimized,
             "run naiad's replicas with Ray Serve's throughput settings (router and handler on the replica's own event "
             "loop, gRPC between replicas, buffered request logs, GC frozen at start): the model replica's CPU per "
             "request cut by more than half, the ingress's by a third or more")
    add_flag(tuning, "--direct-ingress", d.direct_ingress,
             "for the Ray this command starts (not with --address): the ingress serves clients on --http-port and "
             "--grpc-port itself, Ray's proxy out of the path (with the setting above, 2.0-2.5 ms of CPU per request "
             "in all instead of 10-14); Ray's proxy still runs, on free ports of its own. false: clients reach the "
             "ingress through Ray's proxy")
    parser.add_argument("--default-model", default=os.environ.get("SAGEMAKER_TRITON_DEFAULT_MODEL_NAME", ""),
                        help="the model SageMaker's /invocations (and boto3 without TargetModel) serves "
                             "(default: $SAGEMAKER_TRITON_DEFAULT_MODEL_NAME)")
    parser.add_argument("--backend-config", action="append", default=[], metavar="BACKEND,KEY=VALUE",
                        help="a backend setting for every replica, as naiad serve takes it (repeatable)")
    parser.add_argument("--log-verbose", type=int, default=0, metavar="LEVEL")


def from_args(args: argparse.Namespace) -> RayServeOptions:
    minimum, maximum = args.min_replicas, args.max_replicas
    if args.num_replicas is not None:
        minimum = maximum = args.num_replicas
    elif maximum < minimum:
        maximum = minimum
    options = RayServeOptions(
        model_repositories=list(args.model_repository), app_name=args.app_name, route_prefix=args.route_prefix,
        http_host=args.http_host, http_port=args.http_port, grpc_port=args.grpc_port, address=args.address,
        max_models_per_replica=args.max_models_per_replica, min_model_residency_s=args.min_model_residency_s,
        min_replicas=minimum, max_replicas=maximum,
        initial_replicas=args.initial_replicas, target_ongoing_requests=args.target_ongoing_requests,
        upscale_delay_s=args.upscale_delay_s, downscale_delay_s=args.downscale_delay_s,
        metrics_interval_s=args.metrics_interval_s, look_back_period_s=args.look_back_period_s,
        max_ongoing_requests=args.max_ongoing_requests, replica_num_cpus=args.replica_num_cpus,
        ingress_num_cpus=args.ingress_num_cpus, ingress_replicas=args.ingress_replicas,
        throughput_optimized=args.throughput_optimized, direct_ingress=args.direct_ingress,
        default_model=args.default_model, backend_config=list(args.backend_config), log_verbose=args.log_verbose)
    options.check()
    return options
