"""NAIAD_PORT_RANGE: every port naiad picks for a server it starts (recommend's variants, Ray's ingress) and the
tests' servers (tests/server.py) comes from the range when it is set; a taken port is passed over."""

from __future__ import annotations

import json
import socket

import pytest

from naiad.core.free_ports import ENV, free_port, port_range


def _span() -> tuple[int, int]:
    """Eight ports in a row, none bound now (found by binding them)."""
    for first in range(20000 + (__import__("os").getpid() % 2000) * 8, 60000, 8):
        socks = []
        try:
            for port in range(first, first + 8):
                sock = socket.socket()
                socks.append(sock)
                sock.bind(("127.0.0.1", port))
            return first, first + 7
        except OSError:
            continue
        finally:
            for sock in socks:
                sock.close()
    raise AssertionError("no eight free ports in a row")


def test_unset_is_the_kernels_choice(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV, raising=False)
    assert port_range() is None
    assert 0 < free_port() < 65536


@pytest.mark.parametrize("text", ["8000", "9000-8000", "80-90", "a-b", "8000-70000"])
def test_a_malformed_range_is_refused_in_words_that_name_it(text: str) -> None:
    with pytest.raises(ValueError, match=f"{ENV} must be LOW-HIGH"):
        port_range(text)


def test_ports_come_from_the_range_and_skip_taken_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    first, last = _span()
    monkeypatch.setenv(ENV, f"{first}-{last}")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", first + 3))
        taken.listen()
        picked = [free_port() for _ in range(7)]
    assert set(picked) == set(range(first, last + 1)) - {first + 3}  # each once, the taken one never


def test_a_full_range_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    first, _ = _span()
    monkeypatch.setenv(ENV, f"{first}-{first}")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", first))
        with pytest.raises(OSError, match=f"no free port in {ENV}={first}-{first}"):
            free_port()


def test_a_test_server_listens_in_the_range(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:  # noqa: ANN001
    from tests.server import RunningServer

    first, last = _span()
    monkeypatch.setenv(ENV, f"{first}-{last}")
    (tmp_path / "repo").mkdir()
    server = RunningServer([tmp_path / "repo"])
    try:
        ports = {server.http_port, server.grpc_port, server.metrics_port, server.sagemaker_port}
        assert all(first <= port <= last for port in ports), ports
        status, _, body = server.request("GET", "/v2")
        assert status == 200 and json.loads(body)["name"] == "triton"
    finally:
        server.stop()
