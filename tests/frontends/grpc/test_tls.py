"""gRPC over TLS (``--grpc-use-ssl``) and mutual TLS (``--grpc-use-ssl-mutual``) on both engines, with certificates
made for the test: tritonclient connects with the CA; mutual TLS turns away a client without a certificate the
CA signed."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.frontends.echo_parameters import NAME, write_echo_parameters
from tests.frontends.grpc.certs import Certs, make_certs
from tests.server import RunningServer


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return make_certs(tmp_path_factory.mktemp("certs"))


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("tls_models")
    write_echo_parameters(path)
    return path


def _serve(repo: Path, certs: Certs, engine: str, mode: str) -> RunningServer:
    return RunningServer([repo], "--grpc-engine", engine, f"{mode}=true", "--grpc-server-cert", str(certs.server_cert),
                         "--grpc-server-key", str(certs.server_key), "--grpc-root-cert", str(certs.ca))


@pytest.fixture(scope="module", params=("grpcio", "lean"))
def tls_server(request: pytest.FixtureRequest, repo: Path, certs: Certs) -> Iterator[RunningServer]:
    running = _serve(repo, certs, request.param, "--grpc-use-ssl")
    yield running
    running.stop()


@pytest.fixture(scope="module", params=("grpcio", "lean"))
def mutual_server(request: pytest.FixtureRequest, repo: Path, certs: Certs) -> Iterator[RunningServer]:
    running = _serve(repo, certs, request.param, "--grpc-use-ssl-mutual")
    yield running
    running.stop()


def _infer(server: RunningServer, **tls: object) -> None:
    """A ModelInfer and a stream over a fresh channel to ``localhost`` (the name the certificate carries)."""
    client = grpcclient.InferenceServerClient(f"localhost:{server.grpc_port}", **tls)  # type: ignore[arg-type]
    try:
        inputs = [grpcclient.InferInput("INPUT0", [1], "FP32")]
        inputs[0].set_data_from_numpy(np.ones(1, np.float32))
        assert client.infer(NAME, inputs, client_timeout=10).as_numpy("PARAMETERS")[0] == b"{}"
        assert client.is_model_ready(NAME, client_timeout=10)
    finally:
        client.close()


def _refused(server: RunningServer, **tls: object) -> None:
    with pytest.raises(InferenceServerException) as caught:
        _infer(server, **tls)
    assert "UNAVAILABLE" in str(caught.value)


def test_tls_serves_a_client_that_trusts_the_ca(tls_server: RunningServer, certs: Certs) -> None:
    _infer(tls_server, ssl=True, root_certificates=str(certs.ca))
    # No client certificate is asked for, so one the server can't verify does no harm (as in Triton).
    _infer(tls_server, ssl=True, root_certificates=str(certs.ca), private_key=str(certs.stranger_key),
           certificate_chain=str(certs.stranger_cert))


def test_tls_refuses_plaintext(tls_server: RunningServer) -> None:
    _refused(tls_server)


def test_mutual_tls_serves_a_client_with_a_certificate_the_ca_signed(mutual_server: RunningServer,
                                                                     certs: Certs) -> None:
    _infer(mutual_server, ssl=True, root_certificates=str(certs.ca), private_key=str(certs.client_key),
           certificate_chain=str(certs.client_cert))


def test_mutual_tls_refuses_other_clients(mutual_server: RunningServer, certs: Certs) -> None:
    _refused(mutual_server, ssl=True, root_certificates=str(certs.ca))
    _refused(mutual_server, ssl=True, root_certificates=str(certs.ca), private_key=str(certs.stranger_key),
             certificate_chain=str(certs.stranger_cert))
    _refused(mutual_server)


@pytest.mark.parametrize("engine", ["grpcio", "lean"])
def test_a_missing_certificate_stops_start_up(repo: Path, tmp_path: Path, engine: str) -> None:
    with pytest.raises(RuntimeError) as caught:
        RunningServer([repo], "--grpc-engine", engine, "--grpc-use-ssl", "--grpc-server-cert",
                      str(tmp_path / "nothing.pem"), "--grpc-server-key", str(tmp_path / "nothing.key"))
    assert "failed to start GRPC service: Unavailable - cannot read --grpc-server-cert" in str(caught.value)
