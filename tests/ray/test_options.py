"""``naiad ray serve``'s flags and the ``naiad.ray:app`` builder's arguments (no Ray needed)."""

from __future__ import annotations

import pytest

from naiad.cli import build_parser
from naiad.ray import options as ray_options
from naiad.ray.options import RayServeOptions


def parse(*argv: str) -> RayServeOptions:
    return ray_options.from_args(build_parser().parse_args(["ray", "serve", *argv]))


def test_flags_become_ray_autoscaling_config() -> None:
    options = parse("--model-repository", "s3://bucket/models", "--min-replicas", "1", "--max-replicas", "4",
                    "--target-ongoing-requests", "3", "--upscale-delay-s", "2", "--downscale-delay-s", "5",
                    "--look-back-period-s", "4", "--initial-replicas", "2", "--max-models-per-replica", "2")
    assert options.model_repositories == ["s3://bucket/models"]
    assert options.max_models_per_replica == 2
    assert options.autoscaling_config() == {
        "min_replicas": 1, "max_replicas": 4, "initial_replicas": 2, "target_ongoing_requests": 3.0,
        "upscale_delay_s": 2.0, "downscale_delay_s": 5.0, "look_back_period_s": 4.0}


def test_grpc_is_off_unless_a_port_is_given() -> None:
    assert parse("--model-repository", "repo").grpc_port == 0
    assert parse("--model-repository", "repo", "--grpc-port", "8001").grpc_port == 8001
    assert RayServeOptions.from_dict({"model_repository": "repo", "grpc_port": "9001"}).grpc_port == 9001


def test_num_replicas_fixes_the_count() -> None:
    options = parse("--model-repository", "repo", "--num-replicas", "3")
    assert (options.min_replicas, options.max_replicas) == (3, 3)


@pytest.mark.parametrize("argv, message", [
    (["--max-models-per-replica", "0"], "--max-models-per-replica must be at least 1"),
    (["--min-replicas", "0", "--max-replicas", "0"], "--max-replicas >= 1"),
    (["--grpc-port", "70000"], "--grpc-port must be a port number"),
])
def test_bad_flags_are_refused(argv: list[str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse("--model-repository", "repo", *argv)


def test_builder_arguments_as_serve_run_passes_them() -> None:
    """``serve run naiad.ray:app model_repository=a,b max_replicas=2``: every value arrives as text."""
    options = RayServeOptions.from_dict({"model_repository": "a,b", "max_replicas": "2", "upscale_delay_s": "1.5",
                                         "initial_replicas": "1", "backend_config": "python,x=1"})
    assert options.model_repositories == ["a", "b"]
    assert (options.max_replicas, options.upscale_delay_s, options.initial_replicas) == (2, 1.5, 1)
    assert options.backend_config == ["python,x=1"]
    # A config file's YAML gives typed values, which are kept.
    assert RayServeOptions.from_dict({"model_repositories": ["s3://m/r"], "min_replicas": 0}).min_replicas == 0


def test_builder_refuses_unknown_arguments() -> None:
    with pytest.raises(ValueError, match="unknown naiad.ray:app argument"):
        RayServeOptions.from_dict({"model_repository": "a", "replicas": 2})
    with pytest.raises(ValueError, match="a model repository is required"):
        RayServeOptions.from_dict({})


def test_app_is_the_builder() -> None:
    import naiad.ray
    from naiad.ray.application import app

    assert naiad.ray.app is app  # what `serve run naiad.ray:app` imports, also once the module is loaded


def test_throughput_settings_and_direct_ingress_are_on_by_default() -> None:
    from naiad.ray.tuning import REPLICA_ENV, ray_environment, replica_environment

    options = parse("--model-repository", "repo", "--http-port", "8000", "--grpc-port", "8001")
    assert options.throughput_optimized and options.direct_ingress and options.uses_direct_ingress()
    assert ray_environment(options) == {
        **REPLICA_ENV, "RAY_SERVE_ENABLE_DIRECT_INGRESS": "1",
        "RAY_SERVE_DIRECT_INGRESS_MIN_HTTP_PORT": "8000", "RAY_SERVE_DIRECT_INGRESS_MAX_HTTP_PORT": "8001",
        "RAY_SERVE_DIRECT_INGRESS_MIN_GRPC_PORT": "8001", "RAY_SERVE_DIRECT_INGRESS_MAX_GRPC_PORT": "8002",
        "RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S": "0"}
    assert replica_environment(options) == REPLICA_ENV
    # Every setting is one Ray Serve reads, with the value its throughput mode gives it.
    assert REPLICA_ENV["RAY_SERVE_RUN_ROUTER_IN_SEPARATE_LOOP"] == "0"
    # Joined to a cluster, direct ingress is the cluster's (set on `ray start`); the replicas' settings still go.
    joined = parse("--model-repository", "repo", "--address", "auto")
    assert joined.direct_ingress and not joined.uses_direct_ingress()


def test_ingress_ports_span_the_ingress_replicas() -> None:
    from naiad.ray.tuning import ray_environment

    options = parse("--model-repository", "repo", "--http-port", "8000", "--ingress-replicas", "3")
    env = ray_environment(options)
    assert (env["RAY_SERVE_DIRECT_INGRESS_MIN_HTTP_PORT"], env["RAY_SERVE_DIRECT_INGRESS_MAX_HTTP_PORT"]) == (
        "8000", "8003")
    assert "RAY_SERVE_DIRECT_INGRESS_MIN_GRPC_PORT" not in env  # no gRPC
    with pytest.raises(ValueError, match="overlap"):
        parse("--model-repository", "repo", "--http-port", "8000", "--grpc-port", "8001", "--ingress-replicas", "2")
    # Through Ray's proxy (or joined) the ingress replicas share the proxy's ports: no overlap to refuse.
    parse("--model-repository", "repo", "--http-port", "8000", "--grpc-port", "8001", "--ingress-replicas", "2",
          "--direct-ingress", "false")


@pytest.mark.parametrize("argv, throughput, direct", [
    (["--direct-ingress", "false"], True, False),
    (["--direct-ingress=0", "--throughput-optimized=no"], False, False),
    (["--throughput-optimized", "false", "--direct-ingress"], False, True),
])
def test_tuning_flags(argv: list[str], throughput: bool, direct: bool) -> None:
    from naiad.ray.tuning import ray_environment, replica_environment

    options = parse("--model-repository", "repo", *argv)
    assert (options.throughput_optimized, options.direct_ingress) == (throughput, direct)
    env = ray_environment(options)
    assert ("RAY_SERVE_ENABLE_DIRECT_INGRESS" in env) == direct
    assert ("RAY_SERVE_RUN_ROUTER_IN_SEPARATE_LOOP" in env) == throughput
    assert bool(replica_environment(options)) == throughput


def test_a_tuning_flag_takes_only_a_truth_value(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse("--model-repository", "repo", "--direct-ingress", "maybe")
    assert "expected true or false, got 'maybe'" in capsys.readouterr().err
    assert RayServeOptions.from_dict({"model_repository": "a", "throughput_optimized": "false"}
                                     ).throughput_optimized is False


def test_replicas_carry_the_settings_in_their_runtime_env() -> None:
    """On any cluster: the deployments' runtime_env holds the replica settings (and, autoscaling, the metrics push
    interval), or nothing with --throughput-optimized false."""
    pytest.importorskip("ray.serve")
    from naiad.ray.application import build
    from naiad.ray.tuning import REPLICA_ENV

    def actor_envs(options: RayServeOptions) -> list[dict]:
        ingress = build(options)._bound_deployment  # Ray's Application and Deployment (no public view)
        models = ingress.init_args[0]._bound_deployment
        return [d.ray_actor_options.get("runtime_env", {}).get("env_vars", {}) for d in (ingress, models)]

    assert actor_envs(RayServeOptions(model_repositories=["r"])) == [REPLICA_ENV, REPLICA_ENV]
    scaled = actor_envs(RayServeOptions(model_repositories=["r"], max_replicas=3, metrics_interval_s=2))
    assert scaled[0]["RAY_SERVE_REPLICA_AUTOSCALING_METRIC_PUSH_INTERVAL_S"] == "2"
    assert actor_envs(RayServeOptions(model_repositories=["r"], throughput_optimized=False)) == [{}, {}]
