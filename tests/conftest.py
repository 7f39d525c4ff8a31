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
