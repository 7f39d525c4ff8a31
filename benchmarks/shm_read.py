#!/usr/bin/env python3
"""What a shared-memory request costs the registry (naiad/core/shared_memory.py), in-process: no server, no network.

- add_sub: two 64-byte inputs read and two 64-byte outputs written per request, as tritonclient's
  simple_*_shm_client does it (the hot path of a shared-memory client);
- large: one input of --mb MiB read as a NumPy array, alone and followed by the copy the Python backend makes
  into its worker's arena.

Run it against another checkout to compare (e.g. one from before regions were read through a descriptor, when
they were mapped and read in place): ``python benchmarks/shm_read.py --naiad /path/to/that/checkout``.

Usage: python benchmarks/shm_read.py [--mb 64] [--seconds 1] [--naiad ROOT]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
from _posixshmem import shm_open, shm_unlink


def per_call(fn: Callable[[], object], seconds: float) -> float:
    """Median seconds per call over 5 rounds."""
    fn()
    n = 1
    while True:
        t = time.perf_counter()
        for _ in range(n):
            fn()
        if time.perf_counter() - t > seconds / 5:
            break
        n *= 2
    rounds = []
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(n):
            fn()
        rounds.append((time.perf_counter() - t) / n)
    return sorted(rounds)[2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mb", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=1.0)
    parser.add_argument("--naiad", default=str(Path(__file__).resolve().parent.parent),
                        help="the checkout whose naiad package to measure")
    args = parser.parse_args()
    sys.path.insert(0, args.naiad)
    from naiad.core.shared_memory import SharedMemoryRegistry, SharedMemoryUse

    key = f"/naiad-bench-{os.getpid()}"
    size = max(args.mb << 20, 256)
    fd = shm_open(key, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    try:
        os.ftruncate(fd, size)
        os.pwrite(fd, np.arange(size // 4, dtype=np.int32).tobytes(), 0)
        registry: Any = SharedMemoryRegistry()
        registry.register("small", key, 0, 256)
        registry.register("large", key, 0, size)
        out = np.arange(16, dtype=np.int32)

        def add_sub() -> None:
            use = SharedMemoryUse()
            np.frombuffer(use.input(registry, "small", 0, 64), np.int32)
            np.frombuffer(use.input(registry, "small", 64, 64), np.int32)
            use.output(registry, "OUTPUT0", "small", 128, 64)
            use.output(registry, "OUTPUT1", "small", 192, 64)
            use.write("OUTPUT0", out)
            use.write("OUTPUT1", out)

        def large() -> np.ndarray:
            return np.frombuffer(SharedMemoryUse().input(registry, "large", 0, size), np.uint8)

        arena = np.empty(size, np.uint8)
        arena[:] = 1  # its pages exist, as a worker's arena's do

        def large_to_arena() -> None:
            arena[:] = large()

        print(f"naiad from {args.naiad}")
        for name, fn in (("add_sub request (2 x 64 B in, 2 x 64 B out)", add_sub),
                         (f"{args.mb} MiB input", large), (f"{args.mb} MiB input + arena copy", large_to_arena)):
            seconds = per_call(fn, args.seconds)
            rate = f"  ({size / seconds / 1e9:.1f} GB/s)" if "MiB" in name and seconds > 1e-4 else ""
            print(f"{name:45s} {seconds * 1e6:10.1f} us{rate}")
        registry.close()
    finally:
        os.close(fd)
        shm_unlink(key)


if __name__ == "__main__":
    main()
