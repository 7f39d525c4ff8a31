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
