from __future__ import annotations

import os
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


# The heaviest tests, marked `slow` here (one place, by path) rather than in each file: `python -m pytest -m "not
# slow"` leaves them out. Measured on a shared 2-core machine: tests/ray ~150 s in all (each starts Ray Serve),
# recommend's live sweep ~27 s, the trace-memory soak ~20 s, the load/unload cycles ~12 s, the browser test ~12 s.
SLOW = ("tests/ray/", "tests/recommend/test_recommend_live.py", "tests/reliability/test_trace_memory.py",
        "tests/reliability/test_load_cycles.py", "tests/frontends/dashboard/test_browser.py")


def pytest_runtest_logstart(nodeid: str, location: tuple) -> None:
    """Where NAIAD_TEST_PROGRESS names a file, it holds the test now running: a run that ends without pytest's
    summary (a library's hard exit in this process) still says where (.ci/run prints it)."""
    path = os.environ.get("NAIAD_TEST_PROGRESS")
    if path:
        with open(path, "w") as f:
            f.write(nodeid + "\n")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    session.config._naiad_exitstatus = int(exitstatus)  # type: ignore[attr-defined]


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    """Ray left running by tests/ray (its conftest says why) would end this process with status 1 when shut down:
    once pytest has said everything, the process ends here with pytest's own status instead."""
    from tests.ray.conftest import RAY_LEFT_RUNNING

    if RAY_LEFT_RUNNING:
        import signal
        import sys

        import psutil

        sys.stdout.flush()
        sys.stderr.flush()
        for child in psutil.Process().children(recursive=True):  # Ray's processes (its agents outlive the raylet)
            try:
                child.send_signal(signal.SIGKILL)
            except psutil.Error:
                pass
        os._exit(getattr(config, "_naiad_exitstatus", 1))


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "slow: one of the heaviest tests (tests/conftest.py's SLOW); -m 'not slow' "
                                       "leaves them out")


# With NAIAD_TEST_FRONTEND_PROCESSES > 1 (every live server with front-end processes): what is not the same yet
# (docs/frontends.md, "Failures and shutdown"), or what a test reads of the server's process tree, which front ends join.
NOT_WITH_FRONTEND_PROCESSES = {
    "tests/reliability/test_load_cycles.py": "counts the server's child processes",
    "tests/reliability/test_load_pool.py": "counts the server's child processes",
}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    processes = int(os.environ.get("NAIAD_TEST_FRONTEND_PROCESSES") or 1)
    for item in items:
        if item.nodeid.startswith(SLOW):
            item.add_marker(pytest.mark.slow)
        if processes > 1:
            for prefix, reason in NOT_WITH_FRONTEND_PROCESSES.items():
                if item.nodeid.startswith(prefix):
                    item.add_marker(pytest.mark.skip(reason=f"--frontend-processes {processes}: {reason}"))
