"""Shared-memory arenas that carry tensors between the server and a model's worker process.

Each direction of a worker's channel has its own arena, and only the sending side allocates in it, so no
cross-process lock is needed. A block starts with a one-byte in-use flag: the sender sets it when it
allocates, the receiver clears it when the last NumPy view of the block is garbage collected. The sender
reclaims freed blocks in ring order; when the ring is full it opens a larger segment (the old one retires
once drained). Segment files are unlinked as soon as they are opened and travel as file descriptors, so a
crash leaves nothing behind in /dev/shm.
"""

from __future__ import annotations

import ctypes
import errno
import mmap
import os
import tempfile
import weakref
from collections import deque
from typing import Any

import numpy as np

from naiad.core.errors import Code, InferError

SHM_DIR = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()
ALIGN = 64
HEADER = ALIGN  # the flag byte, padded so tensor data stays 64-byte aligned
DEFAULT_SIZE = 1 << 20  # Triton's shm-default-byte-size
DEFAULT_GROWTH = 1 << 20  # Triton's shm-growth-byte-size


def shm_error(size: int, exc: OSError) -> InferError:
    reason = "no space left" if exc.errno == errno.ENOSPC else (exc.strerror or str(exc))
    return InferError(
        f"failed to allocate {size} bytes of shared memory in {SHM_DIR} ({reason}); free space there or lower "
        "--backend-config=python,shm-default-byte-size / shm-growth-byte-size", Code.UNAVAILABLE)


def open_segment(size: int) -> tuple[int, mmap.mmap]:
    """A new shared-memory file of ``size`` bytes, reserved up front so a full /dev/shm fails here, with a
    clear error, rather than as a SIGBUS on first write."""
    fd, path = tempfile.mkstemp(prefix="naiad-py-", dir=SHM_DIR)
    os.unlink(path)
    try:
        os.posix_fallocate(fd, 0, size)
        return fd, mmap.mmap(fd, size)
    except OSError as exc:
        os.close(fd)
        raise shm_error(size, exc) from None


class _Segment:
    __slots__ = ("id", "size", "mm", "head", "blocks")

    def __init__(self, seg_id: int, size: int, mm: mmap.mmap) -> None:
        self.id = seg_id
        self.size = size
        self.mm = mm
        self.head = 0
        self.blocks: deque[int] = deque()  # offsets of live blocks, oldest first

    def reclaim(self) -> None:
        blocks, mm = self.blocks, self.mm
        while blocks and mm[blocks[0]] == 0:
            blocks.popleft()
        if not blocks:
            self.head = 0

    def alloc(self, need: int) -> int:
        """Offset of a block of ``need`` bytes (header included), or -1 when the ring has no room."""
        self.reclaim()
        head, blocks = self.head, self.blocks
        if not blocks:
            at = 0 if need <= self.size else -1
        else:
            tail = blocks[0]
            if head > tail:  # used: [tail, head); free: [head, size) then [0, tail)
                at = head if head + need <= self.size else (0 if need <= tail else -1)
            else:  # wrapped: used [tail, size) and [0, head); free: [head, tail)
                at = head if head + need <= tail else -1
        if at >= 0:
            self.mm[at] = 1
            blocks.append(at)
            self.head = at + need
        return at

    def close(self) -> None:
        try:
            self.mm.close()
        except BufferError:
            pass  # a view is still alive somewhere; the mapping goes when it does


class Arena:
    """The sending side of one direction: allocates blocks for outgoing tensors."""

    def __init__(self, size: int = DEFAULT_SIZE, growth: int = DEFAULT_GROWTH) -> None:
        self.growth = max(growth, ALIGN)
        self._next_id = 0
        self.retired: list[_Segment] = []
        self.new_fds: list[tuple[int, int]] = []  # (segment id, fd) the receiver has not been sent yet
        self.dropped: list[int] = []  # retired segment ids the receiver may forget
        self.current = self._open(max(size, ALIGN * 2))

    def _open(self, size: int) -> _Segment:
        fd, mm = open_segment(size)
        segment = _Segment(self._next_id, size, mm)
        self._next_id += 1
        self.new_fds.append((segment.id, fd))  # the channel sends it, then closes it
        return segment

    def alloc(self, nbytes: int) -> tuple[int, int, memoryview]:
        """A new block for ``nbytes``: (segment id, data offset, writable view of the data)."""
        need = HEADER + ((nbytes + ALIGN - 1) // ALIGN) * ALIGN
        segment = self.current
        at = segment.alloc(need)
        if at < 0:
            segment = self._grow(need)
            at = segment.alloc(need)
        start = at + HEADER
        return segment.id, start, memoryview(segment.mm)[start:start + nbytes]

    def put(self, data: Any, nbytes: int) -> tuple[int, int]:
        """Copy ``data`` (anything exposing the buffer protocol) into a new block: (segment id, data offset)."""
        seg_id, start, view = self.alloc(nbytes)
        if nbytes:
            view[:] = memoryview(data).cast("B")
        view.release()
        return seg_id, start

    def _grow(self, need: int) -> _Segment:
        old = self.current
        size = old.size + self.growth
        # Room for two such blocks: the previous one is often still being released when the next is needed,
        # and a fresh segment costs page faults on every byte.
        if size < 2 * need:
            size += ((2 * need - size + self.growth - 1) // self.growth) * self.growth
        segment = self._open(size)  # raises on a full /dev/shm; the current segment stays usable
        self.retired.append(old)
        self.current = segment
        self._drop_drained()
        return segment

    def _drop_drained(self) -> None:
        for segment in list(self.retired):
            segment.reclaim()
            if not segment.blocks:
                self.retired.remove(segment)
                self.dropped.append(segment.id)
                segment.close()

    def take_announcements(self) -> tuple[list[tuple[int, int]], list[int]]:
        if self.retired:
            self._drop_drained()
        fds, dropped = self.new_fds, self.dropped
        self.new_fds, self.dropped = [], []
        return fds, dropped

    def close(self) -> None:
        for segment in [self.current, *self.retired]:
            segment.close()
        self.retired = []
        for _, fd in self.new_fds:
            os.close(fd)
        self.new_fds = []


def _free(mm: mmap.mmap, offset: int) -> None:
    try:
        mm[offset] = 0
    except ValueError:
        pass  # the mapping was closed at shutdown


class SegmentMap:
    """The receiving side of one direction: maps the sender's segments and views blocks as arrays."""

    def __init__(self) -> None:
        self.maps: dict[int, mmap.mmap] = {}

    def add(self, seg_id: int, fd: int) -> None:
        try:
            self.maps[seg_id] = mmap.mmap(fd, 0)
        finally:
            os.close(fd)

    def drop(self, seg_id: int) -> None:
        self.maps.pop(seg_id, None)  # live views keep their mapping alive

    def view(self, seg_id: int, offset: int, nbytes: int) -> Any:
        """A writable buffer over a block; the block is released when the buffer (and every array over it) dies."""
        mm = self.maps[seg_id]
        buf = (ctypes.c_char * nbytes).from_buffer(mm, offset)
        weakref.finalize(buf, _free, mm, offset - HEADER)
        return buf

    def release(self, seg_id: int, offset: int) -> None:
        """Free a block without viewing it (a message that was read and copied)."""
        _free(self.maps[seg_id], offset - HEADER)

    def array(self, seg_id: int, offset: int, nbytes: int, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
        return np.frombuffer(self.view(seg_id, offset, nbytes), dtype).reshape(shape)

    def close(self) -> None:
        self.maps.clear()
