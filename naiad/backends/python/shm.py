"""Shared-memory arenas that carry tensors between the server and a model's worker process.

Each direction of a worker's channel has its own arena, and only the sending side allocates in it, so no
cross-process lock is needed. A block starts with a one-byte in-use flag: the sender sets it when it
allocates, the receiver clears it when the last NumPy view of the block is garbage collected. Segments
are memfds (anonymous shared memory, not in /dev/shm, so Docker's 64 MiB /dev/shm doesn't bound them;
where memfd_create is missing or refused, files in /dev/shm unlinked as soon as they are opened) and
travel as file descriptors, so a crash leaves nothing behind.

Memory. A segment is sparse: its size is a ceiling, not a reservation. The ring uses the segment's first
``limit`` bytes and reaches further (reserving the new pages with fallocate) only when a block doesn't
fit below it, so an idle or lightly used arena costs a few pages, whatever shm-default-byte-size says.

The ring. The sender allocates in ring order in its current segment and reclaims freed blocks in the same
order. A block the receiver keeps (a model that stores its input arrays, a server that caches outputs)
doesn't stop the ring: when the ring is full, blocks still in use at its tail are set aside as holes that
allocation steps around until they are freed. When a block doesn't fit at all, the arena grows: a segment twice
as large (at least shm-growth-byte-size larger) becomes current and the old one retires, unmapped once drained.
Doubling, not adding the growth each time: a burst of big tensors in flight (16 requests of 1 MiB) grows the ring
a few times rather than once per megabyte, each time onto fresh pages and each a chance to enter copy mode below;
the size is a ceiling, not memory.

The bound. A receiver that holds blocks indefinitely would otherwise make every retired segment stay
mapped and the arena grow without end. So the ring grows freely only while no retired segment is still
mapped. Growing while one is (blocks are being held) puts the arena in *copy mode*: every tensor it sends
from then on is copied out by the receiver on arrival and its block freed at once, so no new block can be
held; the ring then grows no further until the held segments drain (copy mode ends there). A block that
doesn't fit a copy-mode ring goes into an overflow segment, freed by the same copy; overflow segments are
unmapped once drained, and each new one is twice the last, so a receiver that stops reading for a while (a
stalled peer, thousands of blocks) costs a few descriptors, not one per block. Hence at any time: **ring bytes (current + retired segments) < 3 x the current segment's size,
and the current segment doesn't grow while held blocks keep a retired segment mapped**; one-off segments
hold only data in flight. What a receiver keeps after copy mode began is its own private memory.
"""

from __future__ import annotations

import bisect
import ctypes
import errno
import fcntl
import logging
import mmap
import os
import tempfile
import weakref
from collections import deque
from typing import Any

import numpy as np

from naiad.core.errors import Code, InferError

log = logging.getLogger("naiad.python")
SHM_DIR = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()
ALIGN = 64
HEADER = ALIGN  # the flag byte, padded so tensor data stays 64-byte aligned
DEFAULT_SIZE = 1 << 20  # Triton's shm-default-byte-size
DEFAULT_GROWTH = 1 << 20  # Triton's shm-growth-byte-size
# How far a ring reaches into its segment at a time (at least one block). Small, so light traffic costs
# little memory; large enough that a busy ring reserves rarely (one fallocate per step, ever).
RESERVE_STEP = 256 << 10
SMALL_DEV_SHM = 1 << 30  # below this, a /dev/shm that naiad's segments must live in is worth a word at start
_SEALS = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL if hasattr(fcntl, "F_ADD_SEALS") else 0
_memfd = hasattr(os, "memfd_create")  # cleared for the process once memfd_create is refused (e.g. seccomp)


def shm_error(size: int, exc: OSError, memfd: bool) -> InferError:
    """The error for ``size`` bytes that could not be had, naming what ran out: memory for a memfd (no file
    system bounds it: the host's memory or the container's limit does), space in /dev/shm for a file there."""
    if memfd:
        reason = "out of memory" if exc.errno in (errno.ENOMEM, errno.ENOSPC) else (exc.strerror or str(exc))
        return InferError(
            f"failed to allocate {size} bytes of shared memory (memfd: {reason}); free memory, raise the "
            "container's memory limit or lower --backend-config=python,shm-default-byte-size / shm-growth-byte-size",
            Code.UNAVAILABLE)
    reason = "no space left" if exc.errno == errno.ENOSPC else (exc.strerror or str(exc))
    return InferError(
        f"failed to allocate {size} bytes of shared memory in {SHM_DIR} ({reason}); free space there or lower "
        "--backend-config=python,shm-default-byte-size / shm-growth-byte-size", Code.UNAVAILABLE)


def uses_memfd() -> bool:
    """Whether segments are memfds (else files in /dev/shm): tried once, with a memfd made and closed."""
    global _memfd
    if _memfd:
        try:
            os.close(os.memfd_create("naiad-probe", os.MFD_CLOEXEC))
        except OSError:
            _memfd = False
    return _memfd


def _new_file() -> tuple[int, bool]:
    """An anonymous shared-memory file: (fd, whether it is a memfd)."""
    global _memfd
    if _memfd:
        try:
            # CLOEXEC: the fd travels to the worker explicitly (SCM_RIGHTS), never by inheritance into
            # whatever a model spawns. Sealing: once sized, neither side can shrink it under the other's
            # mapping (a SIGBUS there) or grow it.
            return os.memfd_create("naiad-py", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING), True
        except OSError:
            _memfd = False  # refused here (an old kernel, a seccomp filter): /dev/shm from now on
    fd, path = tempfile.mkstemp(prefix="naiad-py-", dir=SHM_DIR)
    os.unlink(path)
    return fd, False


def open_segment(size: int) -> tuple[int, mmap.mmap, bool]:
    """A new shared-memory file of ``size`` bytes, mapped: (fd, map, whether it is a memfd).

    Sparse, deliberately: nothing is reserved here; ``_Segment._reach`` reserves pages as the ring first reaches
    them.
    Reserving the whole size up front (as a /dev/shm file once had to be, lest a full /dev/shm SIGBUS the
    first write) would make every idle instance cost 2 x shm-default-byte-size of memory: 32 MiB each under
    SageMaker's default, 1.6 GiB for 50 models, whatever their traffic. Reserving as reached keeps the error
    clear where the kernel can refuse (a full /dev/shm: ENOSPC; strict overcommit: ENOMEM) and costs one
    fallocate per RESERVE_STEP, ever. Under a cgroup memory limit the kernel answers a shortfall with its
    OOM killer rather than an error, here as for any other memory the tensors would need."""
    fd, memfd = _new_file()
    try:
        os.ftruncate(fd, size)
        if memfd and _SEALS:
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, _SEALS)
        return fd, mmap.mmap(fd, size), memfd
    except OSError as exc:
        os.close(fd)
        raise shm_error(size, exc, memfd) from None


def dev_shm_note() -> str | None:
    """What to say at start about /dev/shm's size: nothing when segments are memfds (naiad keeps nothing of
    its own there; regions clients register are theirs), else, where /dev/shm is small, what needs it and how
    to give it more."""
    if uses_memfd():
        return None
    try:
        info = os.statvfs(SHM_DIR)
    except OSError:
        return None
    size = info.f_blocks * info.f_frsize
    if size >= SMALL_DEV_SHM:
        return None
    return (f"memfd_create is not available here, so the Python backend's tensors in flight live in {SHM_DIR}, "
            f"which holds only {size >> 20} MiB: a large request or a busy model may fail with 'failed to allocate "
            "... bytes of shared memory'; give it more room (Docker: docker run --shm-size=1g)")


_noted = False


def note_dev_shm() -> None:
    """Log ``dev_shm_note`` once per process (a debug line when there is nothing to say)."""
    global _noted
    if _noted:
        return
    _noted = True
    note = dev_shm_note()
    if note is not None:
        log.warning("%s", note)
    else:
        log.debug("shared-memory segments are memfds: the size of %s doesn't bound them", SHM_DIR)


class _Segment:
    __slots__ = ("id", "size", "mm", "fd", "memfd", "limit", "head", "blocks", "ends", "hole_starts", "hole_ends")

    def __init__(self, seg_id: int, size: int, mm: mmap.mmap, fd: int, memfd: bool) -> None:
        self.id = seg_id
        self.size = size
        self.mm = mm
        self.fd = fd  # kept to reserve pages as the ring reaches them
        self.memfd = memfd
        self.limit = 0  # the ring lives in [0, limit): reserved, page-aligned (or the size)
        self.head = 0
        self.blocks: deque[int] = deque()  # offsets of live blocks, oldest first
        self.ends: deque[int] = deque()  # where each of those ends
        # Blocks set aside because the receiver kept them: (start, end) in two sorted lists.
        self.hole_starts: list[int] = []
        self.hole_ends: list[int] = []

    def reclaim(self) -> None:
        blocks, mm = self.blocks, self.mm
        while blocks and mm[blocks[0]] == 0:
            blocks.popleft()
            self.ends.popleft()
        if not blocks:
            self.head = 0

    def alloc(self, need: int) -> int:
        """Offset of a block of ``need`` bytes (header included), or -1 when the segment has no room. Raises
        InferError when the memory for pages the ring reaches for the first time can't be had."""
        self.reclaim()
        at = self._fit(need)
        if at < 0 and self.limit < self.size and not (self.blocks and self.head <= self.blocks[0]):
            at = self._reach(need)  # not wrapped: the block fits past the head once the ring reaches further
        if at < 0 and (self.blocks or self.hole_starts):
            self._set_aside()
            at = self._fit(need)
            if at < 0 and self.limit < self.size:
                at = self._reach(need)
        if at >= 0:
            self.mm[at] = 1
            self.blocks.append(at)
            self.ends.append(at + need)
            self.head = at + need
        return at

    def _reach(self, need: int) -> int:
        """Reserve further into the segment, a step (or a block) at a time, until the block fits: its offset, or
        -1 at the segment's end. Raises InferError when the pages can't be had (the limit stays where it was)."""
        at = -1
        while at < 0 and self.limit < self.size:
            limit = min(self.size, -(-(self.limit + max(RESERVE_STEP, need)) // mmap.PAGESIZE) * mmap.PAGESIZE)
            try:
                os.posix_fallocate(self.fd, self.limit, limit - self.limit)
            except OSError as exc:
                raise shm_error(limit - self.limit, exc, self.memfd) from None
            self.limit = limit
            at = self._fit(need)
        return at

    def _fit(self, need: int) -> int:
        head, blocks, limit = self.head, self.blocks, self.limit
        if not blocks:
            regions: tuple = ((0, limit),)
        elif head > blocks[0]:  # used: [tail, head); free: [head, limit) then [0, tail)
            regions = ((head, limit), (0, blocks[0]))
        else:  # wrapped: used [tail, limit) and [0, head); free: [head, tail)
            regions = ((head, blocks[0]),)
        starts = self.hole_starts
        for at, end in regions:
            if starts:  # step over held blocks in the way
                ends = self.hole_ends
                i = bisect.bisect_right(ends, at)
                while i < len(starts) and starts[i] < at + need:
                    at = ends[i]
                    i += 1
            if at + need <= end:
                return at
        return -1

    def _set_aside(self) -> None:
        """The ring is full: forget holes that were freed, and turn the blocks still in use at its tail into
        holes (a block the receiver holds for long would otherwise stop reclaiming behind it)."""
        mm, starts, ends = self.mm, self.hole_starts, self.hole_ends
        if starts:
            kept = [i for i, at in enumerate(starts) if mm[at]]
            self.hole_starts, self.hole_ends = starts, ends = [starts[i] for i in kept], [ends[i] for i in kept]
        blocks, block_ends = self.blocks, self.ends
        while blocks:
            at, end = blocks.popleft(), block_ends.popleft()
            if mm[at]:
                i = bisect.bisect_left(starts, at)
                starts.insert(i, at)
                ends.insert(i, end)
        self.head = 0

    def drained(self) -> bool:
        self.reclaim()
        if self.hole_starts:
            mm = self.mm
            if any(mm[at] for at in self.hole_starts):
                return False
            self.hole_starts, self.hole_ends = [], []
        return not self.blocks

    def close(self) -> None:
        try:
            self.mm.close()
        except BufferError:
            pass  # a view is still alive somewhere; the mapping goes when it does
        fd, self.fd = self.fd, -1  # (taken before it is closed: never closed twice)
        if fd >= 0:
            os.close(fd)


class Arena:
    """The sending side of one direction: allocates blocks for outgoing tensors (see the module's docstring
    for how it bounds its size)."""

    def __init__(self, size: int = DEFAULT_SIZE, growth: int = DEFAULT_GROWTH) -> None:
        self.growth = max(growth, ALIGN)
        self._next_id = 0
        self.retired: list[_Segment] = []  # former ring segments, mapped until drained
        self.one_off: list[_Segment] = []  # copy mode's overflow segments, mapped until drained
        self.copying = False  # copy mode: receivers copy tensors out on arrival
        self.new_fds: list[tuple[int, int]] = []  # (segment id, fd) the receiver has not been sent yet
        self.dropped: list[int] = []  # segment ids the receiver may forget
        self.current = self._open(max(size, ALIGN * 2))

    @property
    def ring_bytes(self) -> int:
        return self.current.size + sum(s.size for s in self.retired)

    def _open(self, size: int, need: int = 0) -> _Segment:
        """A new segment, with room reserved for a first block of ``need`` bytes: if that memory can't be had,
        the arena is left as it was (the current segment stays usable) and InferError says why."""
        fd, mm, memfd = open_segment(size)
        segment = _Segment(self._next_id, size, mm, fd, memfd)
        try:
            if need:
                segment._reach(need)
            sent = os.dup(fd)  # the channel sends this one, then closes it; the segment keeps its own
        except OSError as exc:
            segment.close()
            raise shm_error(size, exc, memfd) from None
        except InferError:
            segment.close()
            raise
        self._next_id += 1
        self.new_fds.append((segment.id, sent))
        return segment

    def alloc(self, nbytes: int) -> tuple[int, int, memoryview, bool]:
        """A new block for ``nbytes``: (segment id, data offset, writable view of the data, whether the
        receiver must copy the data out at once)."""
        need = HEADER + ((nbytes + ALIGN - 1) // ALIGN) * ALIGN
        segment = self.current
        at = segment.alloc(need)
        if at < 0:
            segment, at = self._make_room(need)
        start = at + HEADER
        return segment.id, start, memoryview(segment.mm)[start:start + nbytes], self.copying

    def put(self, data: Any, nbytes: int) -> tuple[int, int]:
        """Copy ``data`` (anything exposing the buffer protocol) into a new block: (segment id, data offset).
        (Its receiver always copies it out: BYTES tensors and parked messages.)"""
        seg_id, start, view, _ = self.alloc(nbytes)
        if nbytes:
            view[:] = memoryview(data).cast("B")
        view.release()
        return seg_id, start

    def _make_room(self, need: int) -> tuple[_Segment, int]:
        """A segment with a block of ``need`` bytes taken, and the block's offset."""
        self._drop_drained()
        if not self.retired:
            segment = self._grow(need)
        elif not self.copying:
            # A retired segment is still held: the receiver keeps blocks. Copy mode stops that; one more
            # segment gives the ring room free of held blocks.
            segment = self._grow(need)
            self.copying = True
        else:  # the ring stays as it is: the block goes to the overflow
            if self.one_off:
                at = self.one_off[-1].alloc(need)
                if at >= 0:
                    return self.one_off[-1], at
            last = self.one_off[-1].size if self.one_off else self.growth // 2
            segment = self._open(max(2 * need, 2 * last, ALIGN * 2), need)
            self.one_off.append(segment)
        return segment, segment.alloc(need)

    def _grow(self, need: int) -> _Segment:
        old = self.current
        size = max(old.size + self.growth, 2 * old.size)
        # Room for two such blocks: the previous one is often still being released when the next is needed,
        # and a fresh segment costs page faults on every byte.
        if size < 2 * need:
            size += ((2 * need - size + self.growth - 1) // self.growth) * self.growth
        segment = self._open(size, need)  # raises when memory is short; the current segment stays usable
        self.retired.append(old)
        self.current = segment
        self._drop_drained()
        return segment

    def _drop_drained(self) -> None:
        for group in (self.retired, self.one_off):
            for segment in list(group):
                if segment.drained():
                    group.remove(segment)
                    self.dropped.append(segment.id)
                    segment.close()
        if self.copying and not self.retired:
            self.copying = False  # the held blocks are gone

    def take_announcements(self) -> tuple[list[tuple[int, int]], list[int]]:
        if self.retired or self.one_off:
            self._drop_drained()
        fds, dropped = self.new_fds, self.dropped
        self.new_fds, self.dropped = [], []
        return fds, dropped

    def close(self) -> None:
        for segment in [self.current, *self.retired, *self.one_off]:
            segment.close()
        self.retired = []
        self.one_off = []
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

    def take(self, seg_id: int, offset: int, nbytes: int, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
        """A private copy of a block's data, and the block freed at once (copy mode)."""
        mm = self.maps[seg_id]
        if not nbytes:
            out = np.empty(shape, dtype)
        else:
            out = np.frombuffer(mm, dtype, nbytes // dtype.itemsize, offset).reshape(shape).copy()
        _free(mm, offset - HEADER)
        return out

    def array(self, seg_id: int, offset: int, nbytes: int, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
        return np.frombuffer(self.view(seg_id, offset, nbytes), dtype).reshape(shape)

    def close(self) -> None:
        self.maps.clear()
