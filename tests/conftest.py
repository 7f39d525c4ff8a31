from __future__ import annotations

from collections.abc import Iterator

import pytest
import tritonclient.http as httpclient

from tests.server import EXAMPLES, RunningServer


@pytest.fixture
def client(server: RunningServer) -> Iterator[httpclient.InferenceServerClient]:
    """An HTTP client of the module's own ``server`` fixture (each live-server module defines one)."""
    with httpclient.InferenceServerClient(server.url) as c:
        yield c


@pytest.fixture(scope="session")
def examples_server() -> Iterator[RunningServer]:
    """The bundled example repository, served once for the whole session."""
    server = RunningServer([EXAMPLES])
    yield server
    server.stop()


from tests.s3 import S3Server  # noqa: E402 - appended with its fixture; imports no AWS library itself


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    """An S3-compatible store on loopback (moto's server mode), one for the session: use your own buckets."""
    server = S3Server()
    yield server
    server.stop()
