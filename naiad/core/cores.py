"""How many cores this process may use: the CPUs it may run on, capped by its container's CPU quota.

A container limited with ``--cpus`` (cgroup v2 ``cpu.max``, v1 ``cpu.cfs_quota_us``) still sees every CPU of its
host in its affinity mask, so a count from the mask alone would start a front-end process per host CPU where only
a couple of cores' worth of time is granted. The quota is the one of the process's own cgroup, from
``/proc/self/cgroup`` (a systemd service's ``CPUQuota=``, a cgroup of one's own), else the root's as a container
with its own cgroup namespace sees it.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

CGROUP = Path("/sys/fs/cgroup")
PROC_CGROUP = Path("/proc/self/cgroup")


MAX_FRONTENDS = 16  # --frontend-processes auto's cap


def _cpus() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def available(cgroup: Path = CGROUP, proc: Path = PROC_CGROUP) -> int:
    return _available(_cpus(), cpu_quota(cgroup, proc))


def _available(cpus: int, quota: float | None) -> int:
    return max(1, min(cpus, math.ceil(quota))) if quota is not None else cpus


def auto_frontends(cgroup: Path = CGROUP, proc: Path = PROC_CGROUP) -> tuple[int, str]:
    """``--frontend-processes auto``: 1 where 2 cores or fewer are available (one process is faster there,
    benchmarks/multicore.py), else one per core but one (the host keeps a core), at most 16; with the line that
    says so at start, and why (the cores seen, a quota that capped them, the cap)."""
    cpus, quota = _cpus(), cpu_quota(cgroup, proc)
    cores = _available(cpus, quota)
    count = 1 if cores <= 2 else min(cores - 1, MAX_FRONTENDS)
    why = f"{cores} core{'s' * (cores != 1)} available"
    if cores < cpus:
        why += f": {cpus} CPUs, cgroup CPU quota {quota:g}"
    if count == 1:
        return count, (f"--frontend-processes auto: one process, no front-end processes ({why}; on 2 or fewer, one "
                       "process is faster)")
    why += f"; at most {MAX_FRONTENDS}" if cores - 1 > MAX_FRONTENDS else "; one kept for the model host"
    return count, f"--frontend-processes auto: {count} front-end processes ({why})"


def cpu_quota(cgroup: Path = CGROUP, proc: Path = PROC_CGROUP) -> float | None:
    """The CPU time granted per period, in cores, to this process's cgroup (``quota_cgroup``); None when
    unlimited or unknown."""
    found = _find_quota(proc, cgroup)
    return found[1] if found is not None else None


def quota_at(directory: Path) -> float | None:
    """The quota of the cgroup in ``directory`` (v2 ``cpu.max``, or v1 ``cpu.cfs_quota_us``), in cores."""
    try:
        text = (directory / "cpu.max").read_text().split()  # v2: "max 100000" or "200000 100000"
        if text and text[0] != "max":
            return int(text[0]) / int(text[1])
        return None
    except (OSError, ValueError, IndexError):
        pass
    try:  # v1
        quota = int((directory / "cpu.cfs_quota_us").read_text())
        period = int((directory / "cpu.cfs_period_us").read_text())
    except (OSError, ValueError):
        return None
    return quota / period if quota > 0 and period > 0 else None


def quota_cgroup(proc: Path = PROC_CGROUP, root: Path = CGROUP) -> Path | None:
    """The directory of the cgroup that holds this process to a CPU quota: its own (``/proc/self/cgroup``, v2's
    ``0::/path`` or v1's cpu controller line), else the root as a container sees it; None where no quota applies."""
    found = _find_quota(proc, root)
    return found[0] if found is not None else None


def _find_quota(proc: Path, root: Path) -> tuple[Path, float] | None:
    """``quota_cgroup``'s directory and its quota, read once."""
    candidates = []
    try:
        lines = proc.read_text().splitlines()
    except OSError:
        lines = []
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        controllers, path = parts[1], parts[2].lstrip("/")
        if not controllers:
            candidates.append(root / path)
        elif "cpu" in controllers.split(","):
            candidates.append(root / controllers / path)
            if controllers != "cpu":  # (v1's hierarchy is often also mounted as plain cpu)
                candidates.append(root / "cpu" / path)
    for directory in [*candidates, root, root / "cpu"]:
        quota = quota_at(directory)
        if quota is not None:
            return directory, quota
    return None


def throttled(directory: Path) -> int | None:
    """How many periods the cgroup in ``directory`` ran out of its quota (``cpu.stat``'s nr_throttled)."""
    try:
        for line in (directory / "cpu.stat").read_text().splitlines():
            if line.startswith("nr_throttled "):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None
