"""What a server's process tree holds: processes, memory, file descriptors, shared memory. For leak checks."""

from __future__ import annotations

import os
from dataclasses import dataclass

import psutil

SHM_DIR = "/dev/shm"
ARENA_MEMFD = "/memfd:naiad-py"  # the Python backend's arena segments (where memfd_create exists)


@dataclass
class Snapshot:
    pids: list[int]  # the server first, then its descendants
    rss: int  # bytes, summed over the tree
    fds: int
    threads: int
    shm_maps: int  # distinct shared-memory files (and arena memfds) mapped anywhere in the tree (deleted ones too)
    shm_files: list[str]  # the Python backend's segment files present in /dev/shm (it unlinks them at once)

    def describe(self) -> str:
        return (f"{len(self.pids)} processes, RSS {self.rss / 2**20:.1f} MiB, {self.fds} fds, {self.threads} threads, "
                f"{self.shm_maps} shm mappings, {len(self.shm_files)} shm files")


def descendants(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def snapshot(pid: int) -> Snapshot:
    processes = [psutil.Process(pid), *descendants(pid)]
    rss = fds = threads = 0
    maps: set[str] = set()
    pids = []
    for proc in processes:
        try:
            with proc.oneshot():
                rss += proc.memory_info().rss
                fds += proc.num_fds()
                threads += proc.num_threads()
            maps |= _shm_mappings(proc.pid)
            pids.append(proc.pid)
        except psutil.NoSuchProcess:
            continue
    return Snapshot(pids, rss, fds, threads, len(maps), shm_files())


def _shm_mappings(pid: int) -> set[str]:
    """Each mapped shared-memory file as "inode path": arena memfds all share one name, so the inode tells them
    apart."""
    try:
        with open(f"/proc/{pid}/maps") as f:
            return {" ".join(fields[4:]) for line in f
                    if (f" {SHM_DIR}/" in line or f" {ARENA_MEMFD}" in line) and len(fields := line.split()) > 5}
    except OSError:
        return set()


def shm_files(prefix: str = "naiad-py-") -> list[str]:
    try:
        return sorted(name for name in os.listdir(SHM_DIR) if name.startswith(prefix))
    except OSError:
        return []


def zombies(pid: int) -> list[int]:
    """Children that exited without being waited for."""
    out = []
    for proc in descendants(pid):
        try:
            if proc.status() == psutil.STATUS_ZOMBIE:
                out.append(proc.pid)
        except psutil.NoSuchProcess:
            pass
    return out
