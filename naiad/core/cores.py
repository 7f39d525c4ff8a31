"""How many cores this process may use: the CPUs it may run on, capped by its container's CPU quota.

A container limited with ``--cpus`` (cgroup v2 ``cpu.max``, v1 ``cpu.cfs_quota_us``) still sees every CPU of its
host in its affinity mask, so a count from the mask alone would start a front-end process per host CPU where only
a couple of cores' worth of time is granted.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

CGROUP = Path("/sys/fs/cgroup")


def available(cgroup: Path = CGROUP) -> int:
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    quota = cpu_quota(cgroup)
    return max(1, min(cpus, math.ceil(quota))) if quota is not None else cpus


def cpu_quota(cgroup: Path = CGROUP) -> float | None:
    """The CPU time granted per period, in cores; None when unlimited or unknown."""
    try:
        text = (cgroup / "cpu.max").read_text().split()  # v2: "max 100000" or "200000 100000"
        if text and text[0] != "max":
            return int(text[0]) / int(text[1])
        return None
    except (OSError, ValueError, IndexError):
        pass
    try:  # v1
        quota = int((cgroup / "cpu" / "cpu.cfs_quota_us").read_text())
        period = int((cgroup / "cpu" / "cpu.cfs_period_us").read_text())
    except (OSError, ValueError):
        return None
    return quota / period if quota > 0 and period > 0 else None
