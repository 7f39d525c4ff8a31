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


MAX_FRONTENDS = 16  # --frontend-processes auto's cap


def _cpus() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def available(cgroup: Path = CGROUP) -> int:
    cpus = _cpus()
    quota = cpu_quota(cgroup)
    return max(1, min(cpus, math.ceil(quota))) if quota is not None else cpus


def auto_frontends(cgroup: Path = CGROUP) -> tuple[int, str]:
    """``--frontend-processes auto``: 1 where 2 cores or fewer are available (one process is faster there,
    benchmarks/multicore.py), else one per core but one (the host keeps a core), at most 16; with the line that
    says so at start, and why (the cores seen, a quota that capped them, the cap)."""
    cpus, quota = _cpus(), cpu_quota(cgroup)
    cores = available(cgroup)
    count = 1 if cores <= 2 else min(cores - 1, MAX_FRONTENDS)
    why = f"{cores} core{'s' * (cores != 1)} available"
    if cores < cpus:
        why += f": {cpus} CPUs, cgroup CPU quota {quota:g}"
    if count == 1:
        return count, (f"--frontend-processes auto: one process, no front-end processes ({why}; on 2 or fewer, one "
                       "process is faster)")
    why += f"; at most {MAX_FRONTENDS}" if cores - 1 > MAX_FRONTENDS else "; one kept for the model host"
    return count, f"--frontend-processes auto: {count} front-end processes ({why})"


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
