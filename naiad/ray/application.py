"""The Serve application: the ingress bound to the model deployment, with the options' scaling."""

from __future__ import annotations

from typing import Any, Mapping

from naiad.ray.options import RayServeOptions

INGRESS = "NaiadIngress"
MODELS = "NaiadModels"
# Serve writes an access-log line per request in every replica by default: a cost on the hot path that naiad's
# own servers don't pay either.
_QUIET = {"enable_access_log": False}


def build(options: RayServeOptions) -> Any:
    """A ``ray.serve.Application`` for ``serve.run``."""
    from ray import serve

    from naiad.ray.ingress import Ingress
    from naiad.ray.replica import ModelReplica
    from naiad.ray.tuning import replica_environment

    scaling: dict[str, Any]
    if options.min_replicas == options.max_replicas:
        scaling = {"num_replicas": options.max_replicas}
    else:
        scaling = {"autoscaling_config": options.autoscaling_config()}
    env = replica_environment(options)
    actor: dict[str, Any] = {"runtime_env": {"env_vars": env}} if env else {}
    models: Any = serve.deployment(ModelReplica, name=MODELS, max_ongoing_requests=options.max_ongoing_requests,
                              ray_actor_options={"num_cpus": options.replica_num_cpus, **actor},
                              # a replica finalizes its models' workers on the way out
                              graceful_shutdown_timeout_s=30, logging_config=_QUIET, **scaling)
    asgi: Any = serve.ingress()(Ingress)  # Ingress with its ASGI app built at replica start
    ingress: Any = serve.deployment(asgi, name=INGRESS, num_replicas=options.ingress_replicas,
                               max_ongoing_requests=max(1000, options.max_ongoing_requests),
                               ray_actor_options={"num_cpus": options.ingress_num_cpus, **actor},
                               logging_config=_QUIET)
    return ingress.bind(models.bind(options), options)


def app(args: Mapping[str, Any]) -> Any:
    """``naiad.ray:app``: Serve's application builder, from a config file's ``args``."""
    return build(RayServeOptions.from_dict(args))
