"""Run a command the way a container runs it, without Docker: PID 1 of a new PID namespace, in a mount namespace
whose /dev/shm is Docker's default 64 MiB tmpfs, with folders bind-mounted where SageMaker mounts them.

``unshare`` (util-linux) does it cheaply; it needs root (CI runs as root) and a kernel that allows it, so tests
ask ``unavailable()`` first and skip with its reason.
"""

from __future__ import annotations

import functools
import os
import shlex
import shutil
import subprocess
from pathlib import Path

DOCKER_SHM = "64m"  # docker run's default --shm-size


@functools.cache
def unavailable() -> str | None:
    """Why this machine can't make the namespaces (None when it can)."""
    if shutil.which("unshare") is None:
        return "no unshare (util-linux)"
    if os.geteuid() != 0:
        return "making PID and mount namespaces needs root"
    probe = subprocess.run(
        ["unshare", "--pid", "--fork", "--mount-proc", "--propagation", "private", "sh", "-c",
         f"mount -t tmpfs -o size={DOCKER_SHM} tmpfs /dev/shm && test $$ = 1"],
        capture_output=True, text=True, timeout=30, check=False)
    if probe.returncode != 0:
        return f"unshare can't make the namespaces here: {probe.stderr.strip() or probe.returncode}"
    return None


def as_pid1(argv: list[str], shm_size: str = DOCKER_SHM, binds: dict[Path, str] | None = None) -> list[str]:
    """``argv`` as PID 1 of a new PID namespace (with its own /proc), /dev/shm a tmpfs of ``shm_size``, and each
    host folder in ``binds`` mounted at its path inside (e.g. a model at /opt/ml/model). ``exec`` makes the
    command itself PID 1, not the shell that set the mounts up."""
    steps = [f"mount -t tmpfs -o size={shm_size} tmpfs /dev/shm"]
    for source, target in (binds or {}).items():
        steps.append(f"mkdir -p {shlex.quote(target)} && mount --bind {shlex.quote(str(source))} {shlex.quote(target)}")
    script = " && ".join(steps) + ' && exec "$@"'
    return ["unshare", "--pid", "--fork", "--mount-proc", "--propagation", "private", "--kill-child",
            "sh", "-c", script, "sh", *argv]


def pid1_of(unshare_pid: int, timeout: float = 10.0) -> int:
    """The host's pid of the namespace's PID 1: the child unshare forked (signals go to it, not to unshare)."""
    import time

    deadline = time.monotonic() + timeout
    path = Path(f"/proc/{unshare_pid}/task/{unshare_pid}/children")
    while time.monotonic() < deadline:
        try:
            children = path.read_text().split()
        except OSError:
            children = []
        if children:
            return int(children[0])
        time.sleep(0.01)
    raise RuntimeError(f"unshare (pid {unshare_pid}) started no child")
