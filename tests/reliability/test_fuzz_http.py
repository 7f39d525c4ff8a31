"""Seeded HTTP fuzzing (cases: fuzz_http, oracle: http_oracle): a few hundred malformed requests. Every one gets
a clean answer in time, with no 5xx beyond the ones Triton itself gives for the same fault, and the server stays
live, ready and correct. ``NAIAD_FUZZ_SEED`` / ``NAIAD_FUZZ_CASES`` change the run; benchmarks/reliability/fuzz.py
runs thousands."""

from __future__ import annotations

import collections
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.reliability import fuzz_http, http_oracle
from tests.reliability.repo import FUZZ_SERVER_FLAGS, write_fuzz_models
from tests.server import RunningServer

SEED = int(os.environ.get("NAIAD_FUZZ_SEED", "20261125"))
CASES = int(os.environ.get("NAIAD_FUZZ_CASES", "500"))


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    repo = tmp_path_factory.mktemp("fuzz_models")
    write_fuzz_models(Path(repo))
    running = RunningServer([repo], *FUZZ_SERVER_FLAGS)
    with http_oracle.registered_region("127.0.0.1", running.http_port):
        yield running
    running.stop()


def test_http_fuzz_answers_every_case_cleanly(server: RunningServer) -> None:
    cases = fuzz_http.generate(SEED, CASES)
    outcomes, health = http_oracle.run("127.0.0.1", server.http_port, cases,
                                     alive=lambda: server.proc.poll() is None)
    problems = [f"{o.problem}\n    {o.case.describe()}" for o in outcomes if o.problem]
    assert not health, "\n".join(health) + "\n" + server.log()[-3000:]
    assert not problems, f"{len(problems)} of {len(outcomes)} cases (seed {SEED}):\n" + "\n".join(problems[:15])
    # The mix really exercises refusals and successes both, and every mutation ran.
    statuses = collections.Counter(o.status for o in outcomes)
    assert statuses[200] and statuses[400] and statuses[404], statuses
    assert {o.case.kind.split("-")[0] for o in outcomes} >= {"json", "shape", "datatype", "binary", "bytes", "raw"}


def test_fuzz_cases_are_reproducible() -> None:
    first = [c.describe() for c in fuzz_http.generate(7, 50)]
    assert first == [c.describe() for c in fuzz_http.generate(7, 50)]
    assert first != [c.describe() for c in fuzz_http.generate(8, 50)]


def test_oracle_flags_unexplained_server_errors() -> None:
    case = http_oracle.HttpCase("x", "POST", "/v2/models/echo/infer")
    assert http_oracle.judge(case, 500, b'{"error":"internal server error"}', 0.1, 10).problem
    assert http_oracle.judge(case, 400, b"oops", 0.1, 10).problem  # no JSON error
    assert http_oracle.judge(case, None, b"", 10, 10).problem
    triton_parse_error = b'{"error":"Unable to parse \'data\': attempt to access JSON non-number as double"}'
    assert http_oracle.judge(case, 500, triton_parse_error, 0.1, 10).problem is None
    assert http_oracle.judge(case, 400, b'{"error":"bad"}', 0.1, 10).problem is None
