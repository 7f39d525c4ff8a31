from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.server import EXAMPLES, RunningServer


@pytest.fixture(scope="session")
def examples_server() -> Iterator[RunningServer]:
    """The bundled example repository, served once for the whole session."""
    server = RunningServer([EXAMPLES])
    yield server
    server.stop()
