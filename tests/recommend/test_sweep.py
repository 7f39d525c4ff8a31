"""What the sweep does when a variant cannot be measured: record why and go on."""

from __future__ import annotations

import shlex
import sys
import time
from pathlib import Path

import pytest

from naiad.recommend.sweep import SweepOptions, _deadline, sweep
from naiad.recommend.variants import plan
from tests.server import EXAMPLES


def test_a_server_that_fails_fails_its_variant_only(tmp_path: Path) -> None:
    failing = f"{shlex.quote(sys.executable)} -c \"print('cannot serve {{repo}}'); raise SystemExit(1)\""
    options = SweepOptions(traffic={"TrafficType": "STAIRS", "Stairs": {"DurationInSeconds": 1, "NumberOfSteps": 1,
                                                                        "UsersPerStep": 1}},
                           command=failing, ready_timeout_s=20)
    lines: list[str] = []
    results = sweep(plan(EXAMPLES / "add_sub", available=None), tmp_path, options, lines.append)
    assert [m.variant.kind for m in results] == ["base", "instance group x2"]
    for m in results:
        assert not m.ok and m.traffic is None
        assert m.error.startswith("the server exited with code 1 before 'add_sub' was ready: cannot serve ")
        assert str(tmp_path / "variants" / m.variant.slug) in m.error   # {repo} was the variant's repository
    assert lines[1].startswith("[1/2] base: failed: the server exited with code 1")
    assert (tmp_path / "logs" / "python-base.log").is_file()


def test_a_load_test_that_hangs_is_given_up() -> None:
    began = time.monotonic()
    with pytest.raises(TimeoutError, match="did not end within 0 s"):
        with _deadline(0.2):
            time.sleep(5)
    assert time.monotonic() - began < 2
    with _deadline(None):   # no limit
        time.sleep(0.01)
