"""System shared memory regions clients register (Triton's shared-memory extension), and what a request holds of them.

A client creates a POSIX shared memory object, registers a window of it (key, offset, byte_size) under a name,
then names that region on an input (the server reads the tensor from it) or on a requested output (the server
writes the tensor into it instead of the response). Both front ends share one ``SharedMemoryRegistry``.

Regions are read and written through a descriptor kept from registration (``pread``/``pwrite``), never through
a mapping. The client owns the object and may shrink it at any time (``ftruncate``); touching a mapped page past
its new end raises SIGBUS, which would end the whole server, and no check before the access can close that race.
A read past the end just comes back short: the request gets an INVALID_ARG that says so, and the server goes on.
The price is one copy of each input, a memcpy out of the page cache (``benchmarks/shm_read.py`` measures it),
and an ``fstat`` beside each output's ``pwrite``. The copy also means a model never sees the client rewrite its
input mid-request, and no model, in the server or in a worker process, ever holds the client's memory
(the Python backend copies inputs into its own arena).

A region in use by a request can't be unregistered (Triton 2.51's answer); ``SharedMemoryUse`` is that hold and
lets go when the request's last reference goes, however the request ends. A region dropped at shutdown while a
request still holds it keeps its descriptor until that request lets go (a closed descriptor's number could be
reused by another file). Each region holds one descriptor, so the registry caps their number
(``--shared-memory-max-regions``). CUDA shared memory is answered as a Triton without GPUs answers: no regions,
registering fails, unregistering succeeds.
"""

from __future__ import annotations

import errno
import gc
import os
import stat
import threading
from typing import Any

import numpy as np

from naiad.core.datatypes import serialize_bytes
from naiad.core.errors import Code, InferError, internal, invalid, not_found

try:
    from _posixshmem import shm_open  # CPython's binding of shm_open(3), as multiprocessing.shared_memory uses it
except ImportError:  # pragma: no cover - not a POSIX system
    shm_open = None

_SIZE_T = 1 << 64  # Triton reads offsets and sizes as size_t: a negative gRPC int64 wraps around
_OBJECT = np.dtype(np.object_)
_IO_MAX = 0x7FFFF000  # Linux moves at most this much per read(2)/write(2)
_LARGE = 1 << 20  # inputs from this size on are read into a NumPy array rather than a new bytes object
DEFAULT_MAX_REGIONS = 1024
_closing = threading.Lock()  # a descriptor is closed once, whichever thread lets the region go last


class Region:
    """One registered window ``[offset, offset + byte_size)`` of the shared memory object ``key``, by descriptor."""

    __slots__ = ("name", "key", "offset", "byte_size", "fd", "users", "dropped")

    def __init__(self, name: str, key: str, offset: int, byte_size: int, fd: int) -> None:
        self.name = name
        self.key = key
        self.offset = offset
        self.byte_size = byte_size
        self.fd = fd
        self.users = 0  # requests holding the region (SharedMemoryUse)
        self.dropped = False  # out of the registry: the descriptor goes with the last user

    def status(self) -> dict[str, Any]:
        return {"name": self.name, "key": self.key, "offset": self.offset, "byte_size": self.byte_size}

    def read(self, offset: int, byte_size: int) -> bytes | memoryview:
        """``byte_size`` bytes from ``offset`` in the window (bounds already checked), read-only; a short object is
        an error."""
        at = self.offset + offset
        if byte_size < _LARGE:
            data = os.pread(self.fd, byte_size, at)
            if len(data) != byte_size:
                raise self._short(at + byte_size)
            return data
        # Large: into an uninitialized array (NumPy backs big ones with huge pages: fewer faults than bytes would
        # take), in steps of what one read(2) moves.
        try:
            array = np.empty(byte_size, np.uint8)
        except MemoryError:
            raise invalid(f"unable to read {byte_size} bytes from shared memory region '{self.name}': out of "
                          "memory") from None
        view = array.data
        got = 0
        while got < byte_size:
            n = os.preadv(self.fd, [view[got:got + _IO_MAX]], at + got)
            if n <= 0:
                raise self._short(at + byte_size)
            got += n
        array.flags.writeable = False
        return array.data

    def write(self, offset: int, raw: Any) -> None:
        """Put ``raw`` (bytes, or a contiguous uint8 array) at ``offset`` in the window, if the object still
        reaches that far."""
        at = self.offset + offset
        end = at + len(raw)
        # A write past the end would not fault, but it would grow the client's object back: refuse it instead.
        if os.lseek(self.fd, 0, os.SEEK_END) < end:  # (the size, cheaper than fstat)
            raise self._short(end)
        done = os.pwrite(self.fd, raw, at)
        if done < len(raw):  # over 2 GiB: the rest in steps
            view = memoryview(raw).cast("B")
            while done < len(view):
                done += os.pwrite(self.fd, view[done:done + _IO_MAX], at + done)

    def _short(self, needed: int) -> InferError:
        try:
            size = os.fstat(self.fd).st_size
        except OSError:
            size = 0
        return invalid(f"shared memory region '{self.name}' is smaller than its registered offset + byte size: "
                       f"its object '{self.key}' holds {size} bytes, {needed} needed (it was truncated after "
                       "registration)")

    def close(self) -> None:
        """Close the descriptor now, or, while a request still holds the region, when it lets go."""
        with _closing:
            self.dropped = True
            if self.users or self.fd < 0:
                return
            fd, self.fd = self.fd, -1
        os.close(fd)

    def release(self) -> None:
        """One request let go of the region."""
        self.users -= 1
        if self.dropped and self.users <= 0:
            self.close()


class SharedMemoryRegistry:
    def __init__(self, max_regions: int = DEFAULT_MAX_REGIONS) -> None:
        self.regions: dict[str, Region] = {}
        self.max_regions = max_regions  # each region keeps a descriptor open

    # --- system shared memory ---------------------------------------------------------------------------------

    def register(self, name: str, key: str, offset: int, byte_size: int) -> None:
        """Open ``key`` and keep its descriptor for ``byte_size`` bytes from ``offset``; Triton's checks in
        Triton's order and words, then the object's size (it must hold the whole window now) and the cap."""
        if name in self.regions:
            raise InferError(f"shared memory region '{name}' already in manager", Code.ALREADY_EXISTS)
        if len(self.regions) >= self.max_regions:
            raise invalid(f"failed to register shared memory region '{name}': the server already holds "
                          f"{len(self.regions)} regions, its limit (--shared-memory-max-regions); unregister "
                          "regions no longer used")
        try:
            if shm_open is None:
                raise OSError(errno.ENOSYS, os.strerror(errno.ENOSYS))
            fd = shm_open(key, os.O_RDWR, 0o600)  # glibc adds O_NOFOLLOW and O_CLOEXEC
        except (OSError, ValueError):
            raise internal(f"Unable to open shared memory region: '{key}'") from None
        try:
            try:
                info = os.fstat(fd)
            except OSError:
                raise internal(f"Invalid shared memory region: '{key}'") from None
            if not stat.S_ISREG(info.st_mode):  # e.g. a FIFO someone put in /dev/shm: reads would block
                raise internal(f"Invalid shared memory region: '{key}'")
            if offset + byte_size > info.st_size:
                raise invalid(f"failed to register shared memory region '{name}': invalid args")
            if byte_size == 0:  # Triton's mmap(2) refuses an empty window: so does this registry, in its words
                raise invalid(f"failed to register shared memory region '{name}': unable to process address space"
                              f"{os.strerror(errno.EINVAL)}")
        except BaseException:
            os.close(fd)
            raise
        self.regions[name] = Region(name, key, offset, byte_size, fd)

    def unregister(self, name: str) -> None:
        """Unknown names are fine, as in Triton; a region some request still uses is not released."""
        region = self.regions.get(name)
        if region is None:
            return
        if region.users:
            gc.collect()  # a finished request's hold may wait in cyclic garbage: collect it before refusing
            if region.users:
                raise internal(f"Cannot unregister shared memory region '{name}', it is currently in use.")
        del self.regions[name]
        region.close()

    def unregister_all(self) -> None:
        failed = []
        for name in sorted(self.regions):
            try:
                self.unregister(name)
            except InferError:
                failed.append(name)
        if failed:
            raise internal("Failed to unregister the following system shared memory regions: "
                           + "".join(f"{name} ," for name in failed))

    def status(self, name: str = "") -> list[dict[str, Any]]:
        """Every region (by name, as Triton lists them), or the one named."""
        if not name:
            return [self.regions[n].status() for n in sorted(self.regions)]
        region = self.regions.get(name)
        if region is None:
            raise not_found(f"Unable to find system shared memory region: '{name}'")
        return [region.status()]

    def close(self) -> None:
        """At shutdown: drop every region, in use or not (one in use keeps its descriptor until its request ends)."""
        regions, self.regions = self.regions, {}
        for region in regions.values():
            region.close()

    def find(self, name: str, offset: int, byte_size: int) -> Region:
        """The region a tensor names, with Triton 2.51's bounds checks (its size_t arithmetic included: a
        zero ``byte_size`` at offset 0 wraps around and is refused)."""
        region = self.regions.get(name)
        if region is None:
            raise not_found(f"Unable to find shared memory region: '{name}'")
        end = region.byte_size - 1 if region.byte_size > 0 else 0
        offset %= _SIZE_T
        if offset > end:
            raise invalid(f"Invalid offset for shared memory region: '{name}'")
        if (offset + byte_size - 1) % _SIZE_T > end:
            raise invalid(f"Invalid offset + byte size for shared memory region: '{name}'")
        return region

    # --- CUDA shared memory: as Triton answers on a host without a GPU -----------------------------------------

    def cuda_status(self, name: str = "") -> list[dict[str, Any]]:
        if not name:
            return []
        if name in self.regions:
            raise not_found(f"The region named '{name}' is registered as system shared memory, not CUDA shared "
                            "memory")
        raise not_found(f"Unable to find cuda shared memory region: '{name}'")

    def cuda_register(self, name: str) -> None:
        """Triton's GPU build on a host without one: the CUDA IPC handle can't be opened (clients and Triton's
        QA tests match these words)."""
        if name in self.regions:
            raise InferError(f"shared memory region '{name}' already in manager", Code.ALREADY_EXISTS)
        raise invalid("failed to register shared memory region: invalid args")


class SharedMemoryUse:
    """One request's hold on the regions its tensors use, and where its shared-memory outputs go. The regions
    count as in use for as long as this object lives: front ends keep it with the request's output options."""

    __slots__ = ("regions", "outputs")

    def __init__(self) -> None:
        self.regions: list[Region] = []
        self.outputs: dict[str, tuple[Region, int, int]] = {}  # tensor -> (region, offset, byte_size)

    def _hold(self, registry: SharedMemoryRegistry | None, name: str, offset: int, byte_size: int) -> Region:
        if registry is None:
            raise not_found(f"Unable to find shared memory region: '{name}'")
        region = registry.find(name, offset, byte_size)
        region.users += 1
        self.regions.append(region)
        return region

    def input(self, registry: SharedMemoryRegistry | None, name: str, offset: int,
              byte_size: int) -> bytes | memoryview:
        """A copy of an input's bytes, read-only as the other sources of input bytes are."""
        return self._hold(registry, name, offset, byte_size).read(offset % _SIZE_T, byte_size)

    def output(self, registry: SharedMemoryRegistry | None, tensor: str, name: str, offset: int,
               byte_size: int) -> None:
        self.outputs[tensor] = (self._hold(registry, name, offset, byte_size), offset % _SIZE_T, byte_size)

    def write(self, tensor: str, array: np.ndarray) -> None:
        """Put an output where the request asked for it (BYTES serialized, numbers little-endian)."""
        region, offset, byte_size = self.outputs[tensor]
        if array.dtype == _OBJECT:
            raw: Any = serialize_bytes(array)
        else:
            flat = np.ascontiguousarray(array).reshape(-1)
            if flat.dtype.byteorder == ">":
                flat = flat.astype(flat.dtype.newbyteorder("<"))
            raw = flat.view(np.uint8)
        if len(raw) > byte_size:
            raise internal(f"shared memory size specified with the request for output '{tensor}' ({byte_size} "
                           f"bytes) should be at least {len(raw)} bytes to hold the results")
        region.write(offset, raw)  # the hold keeps the descriptor open, even past a shutdown's close()

    def __del__(self) -> None:
        for region in self.regions:
            region.release()
