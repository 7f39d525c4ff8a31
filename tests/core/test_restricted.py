"""``--http-restricted-api`` / ``--grpc-restricted-protocol`` parsing with Triton's rules and messages, and the
header-forwarding match rule both protocols share."""

from __future__ import annotations

from pathlib import Path

import pytest

from naiad.cli import build_parser, main
from naiad.core.forwarding import HeaderForward
from naiad.core.restricted import CATEGORIES, Restrictions
from naiad.frontends.grpc import options as grpc_options
from naiad.frontends.http import options as http_options


def test_groups_of_categories_each_with_their_key() -> None:
    parsed = Restrictions.parse(["health,metadata:Admin-Key=secret", "inference:k=v=w"], "http-restricted-api", "api")
    assert parsed.rules == {"health": ("Admin-Key", "secret"), "metadata": ("Admin-Key", "secret"),
                            "inference": ("k", "v=w")}  # the value is everything after the first '='
    assert parsed.rule("statistics") is None
    assert parsed.refusal("health") == "This API is restricted, expecting header 'Admin-Key'"


def test_grpc_keys_take_tritons_metadata_prefix_and_wording() -> None:
    parsed = Restrictions.parse(["model-config:K=v"], "grpc-restricted-protocol", "protocol", "triton-grpc-protocol-")
    assert parsed.rule("model-config") == ("triton-grpc-protocol-K", "v")
    assert parsed.refusal("model-config") == "This protocol is restricted, expecting header 'triton-grpc-protocol-K'"


def test_nothing_restricted_is_falsy() -> None:
    assert not Restrictions.parse([], "http-restricted-api", "api")
    assert Restrictions.parse(["trace:k=v"], "http-restricted-api", "api")


def test_every_triton_category_is_accepted() -> None:
    assert CATEGORIES == ("health", "metadata", "inference", "shared-memory", "model-config", "model-repository",
                          "statistics", "trace", "logging")
    assert set(Restrictions.parse([",".join(CATEGORIES) + ":k=v"], "x", "api").rules) == set(CATEGORIES)


@pytest.mark.parametrize(("values", "message"), [
    (["health:k=v", "health:k2=v2"], "restricted api 'health' can not be specified in multiple config groups"),
    (["health,health:k=v"], "restricted api 'health' can not be specified in multiple config groups"),
    (["helth:k=v"], "unknown restricted api 'helth'"),
    (["health,:k=v"], "unknown restricted api ''"),
    (["Health:k=v"], "unknown restricted api 'Health'"),
    (["health,k=v"], "--http-restricted-api option format is '<config name>:<setting>=<value>'. Got health,k=v"),
    (["health:k="], "--http-restricted-api option format is '<config name>:<setting>=<value>'. Got health:k="),
    (["health:=v"], "--http-restricted-api option format is '<config name>:<setting>=<value>'. Got health:=v"),
    ([":k=v"], "--http-restricted-api option format is '<config name>:<setting>=<value>'. Got :k=v"),
])
def test_tritons_errors(values: list[str], message: str) -> None:
    with pytest.raises(ValueError) as caught:
        Restrictions.parse(values, "http-restricted-api", "api")
    assert str(caught.value) == message


def test_forwarding_searches_the_name_anywhere_ignoring_case() -> None:
    forward = HeaderForward("x-fw")
    pairs = [("X-FW-One", "1"), ("pre-x-fw", "2"), ("x-other", "3"), ("x-fw-one", "4")]
    assert forward.select(pairs) == {"X-FW-One": "1", "pre-x-fw": "2", "x-fw-one": "4"}
    assert HeaderForward("^x-fw$").select(pairs) == {}
    assert HeaderForward("^X-").select([("x-a", "1"), ("ax-b", "2")]) == {"x-a": "1"}
    assert HeaderForward("dup").select([("dup", "1"), ("dup", "2")]) == {"dup": "2"}  # the last one, as Triton


def test_a_bad_pattern_is_a_start_up_error() -> None:
    with pytest.raises(ValueError, match="invalid header forward pattern"):
        HeaderForward("(")


@pytest.mark.parametrize(("flags", "message"), [
    (["--http-restricted-api=health:k=v", "--http-restricted-api=health:k2=v2"],
     "error: restricted api 'health' can not be specified in multiple config groups"),
    (["--grpc-restricted-protocol=helth:k=v"], "error: unknown restricted protocol 'helth'"),
    (["--grpc-infer-response-compression-level=max"],
     "error: invalid argument for --grpc_infer_response_compression_level"),
    (["--http-header-forward-pattern=("], "error: invalid header forward pattern '('"),
])
def test_the_cli_exits_1_with_tritons_message(flags: list[str], message: str, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "--model-repository", str(tmp_path), *flags]) == 1
    assert capsys.readouterr().err.startswith(message)


def test_the_cli_builds_both_protocols_settings(tmp_path: Path) -> None:
    args = build_parser().parse_args([
        "serve", "--model-repository", str(tmp_path), "--http-restricted-api=health:a=b",
        "--grpc-restricted-protocol=inference,trace:c=d", "--grpc-header-forward-pattern=x",
        "--grpc-use-ssl-mutual", "--grpc-infer-response-compression-level=Medium"])
    http, grpc = http_options.from_args(args), grpc_options.from_args(args)
    assert http.restricted.rules == {"health": ("a", "b")} and http.header_forward is None
    assert grpc.restricted.rules == {"inference": ("triton-grpc-protocol-c", "d"),
                                     "trace": ("triton-grpc-protocol-c", "d")}
    assert grpc.header_forward is not None and grpc.header_forward.pattern == "x"
    assert grpc.use_ssl and grpc.use_ssl_mutual and grpc.infer_compression_level == "medium"
