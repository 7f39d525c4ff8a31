"""How much memory a loaded model holds, and the sizes users write on the command line.

A model's memory is what its worker processes hold (proportional set size, so pages shared between workers
count once in a sum) plus, for models that run inside the server (onnxruntime, torch, in-process Python),
the growth of the server's own resident set while the model loaded.
"""

from __future__ import annotations

import re

import psutil

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]i?b?|b)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_size(text: str) -> int:
    """``--model-memory-limit``: bytes, with K/M/G/T suffixes (powers of 1024), or a percentage of RAM."""
    value = text.strip()
    if value.endswith("%"):
        try:
            percent = float(value[:-1])
        except ValueError:
            raise ValueError(f"invalid memory size '{text}'") from None
        if not 0 < percent <= 100:
            raise ValueError(f"memory percentage must be in (0, 100], got '{text}'")
        return int(psutil.virtual_memory().total * percent / 100)
    match = _SIZE.match(value)
    if match is None:
        raise ValueError(f"invalid memory size '{text}' (bytes, with an optional K, M, G or T suffix, or N%)")
    number, unit = match.groups()
    return int(float(number) * _UNITS[(unit or "")[:1].lower()])


def format_size(size: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size >= scale:
            return f"{size / scale:.1f} {unit}"
    return f"{size} B"


def process_memory(pid: int) -> int:
    """PSS of one process where the kernel reports it, else RSS; 0 for a process that is gone."""
    try:
        process = psutil.Process(pid)
        try:
            return int(process.memory_full_info().pss)
        except (AttributeError, psutil.AccessDenied):
            return int(process.memory_info().rss)
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return 0


def processes_memory(pids: list[int]) -> int:
    return sum(process_memory(pid) for pid in pids)


def own_rss() -> int:
    return int(psutil.Process().memory_info().rss)
