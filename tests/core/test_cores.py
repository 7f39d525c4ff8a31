"""The cores ``--frontend-processes auto`` counts: the affinity mask, capped by a container's CPU quota."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from naiad.cli import frontend_processes
from naiad.core import cores


def _v2(root: Path, text: str) -> Path:
    root.mkdir(exist_ok=True)
    (root / "cpu.max").write_text(text)
    return root


def _v1(root: Path, quota: int, period: int) -> Path:
    (root / "cpu").mkdir(parents=True)
    (root / "cpu" / "cpu.cfs_quota_us").write_text(f"{quota}\n")
    (root / "cpu" / "cpu.cfs_period_us").write_text(f"{period}\n")
    return root


def test_quota_read_from_cgroup_v2_and_v1(tmp_path: Path) -> None:
    assert cores.cpu_quota(_v2(tmp_path / "a", "250000 100000\n")) == 2.5
    assert cores.cpu_quota(_v2(tmp_path / "b", "max 100000\n")) is None
    assert cores.cpu_quota(_v1(tmp_path / "c", 150000, 100000)) == 1.5
    assert cores.cpu_quota(_v1(tmp_path / "d", -1, 100000)) is None
    assert cores.cpu_quota(tmp_path / "none") is None


def test_a_quota_caps_the_cpus_the_mask_shows(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda _: set(range(64)))
    assert cores.available(tmp_path) == 64  # no quota
    assert cores.available(_v2(tmp_path, "150000 100000")) == 2  # 1.5 cores' time: two cores to run on
    monkeypatch.setattr(os, "sched_getaffinity", lambda _: {0})
    assert cores.available(tmp_path) == 1  # a quota never raises the count


@pytest.mark.parametrize(("available", "processes"), [(1, 1), (2, 1), (3, 2), (4, 3), (16, 15), (64, 16)])
def test_auto_is_one_up_to_two_cores_then_one_per_core_but_one(available: int, processes: int, tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda _: set(range(available)))
    assert cores.auto_frontends(tmp_path)[0] == processes


def test_auto_says_what_it_chose_and_why(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda _: set(range(4)))
    assert cores.auto_frontends(tmp_path)[1] == \
        "--frontend-processes auto: 3 front-end processes (4 cores available; one kept for the model host)"
    assert cores.auto_frontends(_v2(tmp_path / "q", "250000 100000"))[1] == (
        "--frontend-processes auto: 2 front-end processes (3 cores available: 4 CPUs, cgroup CPU quota 2.5; one kept "
        "for the model host)")
    monkeypatch.setattr(os, "sched_getaffinity", lambda _: set(range(2)))
    assert cores.auto_frontends(tmp_path)[1] == ("--frontend-processes auto: one process, no front-end processes "
                                                 "(2 cores available; on 2 or fewer, one process is faster)")
    monkeypatch.setattr(os, "sched_getaffinity", lambda _: set(range(64)))
    assert cores.auto_frontends(tmp_path)[1] == \
        "--frontend-processes auto: 16 front-end processes (64 cores available; at most 16)"


def test_the_flag_logs_autos_choice(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr("naiad.cli.auto_frontends", lambda: (3, "--frontend-processes auto: 3 front-end processes"))
    with caplog.at_level("INFO", logger="naiad"):
        assert frontend_processes("auto") == 3
    assert caplog.messages == ["--frontend-processes auto: 3 front-end processes"]
    assert frontend_processes("3") == 3
    with pytest.raises(ValueError, match="positive number or auto"):
        frontend_processes("0")


def test_auto_is_the_default() -> None:
    from naiad.cli import build_parser

    assert build_parser().parse_args(["serve", "--model-repository", "/m"]).frontend_processes == "auto"


def test_the_cgroup_of_the_quota_is_found_from_proc_self_cgroup(tmp_path: Path) -> None:
    proc = tmp_path / "cgroup"
    root = tmp_path / "fs"
    # cgroup v2, as a host or a Kubernetes pod without a cgroup namespace shows it
    proc.write_text("0::/kubepods/pod1/c1\n")
    assert cores.quota_cgroup(proc, root) is None  # no quota anywhere
    (root / "kubepods" / "pod1").mkdir(parents=True)
    _v2(root / "kubepods" / "pod1" / "c1", "50000 100000\n")
    assert cores.quota_cgroup(proc, root) == root / "kubepods" / "pod1" / "c1"
    # cgroup v1: the cpu controller's line (its hierarchy mounted as cpu,cpuacct, with cpu beside it)
    proc.write_text("4:memory:/x\n3:cpu,cpuacct:/docker/abc\n0::/\n")
    quota = root / "cpu,cpuacct" / "docker" / "abc"
    quota.mkdir(parents=True)
    (quota / "cpu.cfs_quota_us").write_text("150000\n")
    (quota / "cpu.cfs_period_us").write_text("100000\n")
    assert cores.quota_cgroup(proc, root) == quota
    # a container with its own cgroup namespace: its cgroup is the root it sees
    proc.write_text("0::/\n")
    other = tmp_path / "container"
    assert cores.quota_cgroup(proc, _v2(other, "200000 100000\n")) == other
    assert cores.quota_cgroup(tmp_path / "missing", tmp_path / "nothing") is None


def test_throttled_periods_read_from_cpu_stat(tmp_path: Path) -> None:
    (tmp_path / "cpu.stat").write_text("usage_usec 100\nnr_periods 12\nnr_throttled 5\nthrottled_usec 900\n")  # v2
    assert cores.throttled(tmp_path) == 5
    (tmp_path / "cpu.stat").write_text("nr_periods 1526\nnr_throttled 920\nthrottled_time 38620147207\n")  # v1
    assert cores.throttled(tmp_path) == 920
    assert cores.throttled(tmp_path / "none") is None


def test_auto_counts_the_quota_of_the_process_s_own_cgroup(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A quota set on the process's own cgroup (a systemd service's CPUQuota=, a cgroup without a namespace of its
    own) caps ``auto`` as a container's does, though the root the process sees has none."""
    monkeypatch.setattr(os, "sched_getaffinity", lambda _: set(range(32)))
    proc = tmp_path / "cgroup"
    proc.write_text("0::/system.slice/naiad.service\n")
    root = tmp_path / "fs"
    (root / "system.slice").mkdir(parents=True)
    assert cores.auto_frontends(root, proc)[0] == 16
    _v2(root / "system.slice" / "naiad.service", "200000 100000\n")
    count, why = cores.auto_frontends(root, proc)
    assert count == 1 and "cgroup CPU quota 2" in why
