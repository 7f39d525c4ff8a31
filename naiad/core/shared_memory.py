"""System shared memory regions clients register (Triton's shared-memory extension), and what a request holds of them.

A client creates a POSIX shared memory object, registers a window of it (key, offset, byte_size) under a name,
then names that region on an input (the server reads the tensor from it) or on a requested output (the server
writes the tensor into it instead of the response). Both front ends share one ``SharedMemoryRegistry``.

Inputs are read-only, zero-copy views of the mapping, as Triton hands its backends the mapped address: a model
that executes in the server's process (in-process Python, onnxruntime, torch) reads the client's memory
directly, and a client that writes the region while its request runs changes what the model sees (Triton makes
no promise either). The default Python backend copies inputs into its worker's arena when it sends the request.

A region in use by a request can't be unregistered (Triton 2.51's answer); ``SharedMemoryUse`` is that hold and
lets go when the request's last reference goes, however the request ends. Unregistering unmaps the region at
once, unless a model still holds a view of it; the mapping then goes with the last view. CUDA shared memory is
answered as a Triton without GPUs answers: no regions, registering fails, unregistering succeeds.
"""

from __future__ import annotations

import errno
import gc
import mmap
import os
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


class Region:
    """One registered window ``[offset, offset + byte_size)`` of the shared memory object ``key``, mapped."""

    __slots__ = ("name", "key", "offset", "byte_size", "mapping", "data", "users")

    def __init__(self, name: str, key: str, offset: int, byte_size: int, mapping: mmap.mmap, start: int) -> None:
        self.name = name
        self.key = key
        self.offset = offset
        self.byte_size = byte_size
        self.mapping = mapping
        self.data = memoryview(mapping)[start:start + byte_size]  # mmap maps from a page boundary
        self.users = 0  # requests holding the region (SharedMemoryUse)

    def status(self) -> dict[str, Any]:
        return {"name": self.name, "key": self.key, "offset": self.offset, "byte_size": self.byte_size}

    def close(self) -> None:
        """Unmap now, or, while a model still holds a view of the memory, when that view goes."""
        self.data.release()
        try:
            self.mapping.close()
        except BufferError:
            pass  # views remain: the mapping is released with the last of them (mmap's own finalizer)


class SharedMemoryRegistry:
    def __init__(self) -> None:
        self.regions: dict[str, Region] = {}

    # --- system shared memory ---------------------------------------------------------------------------------

    def register(self, name: str, key: str, offset: int, byte_size: int) -> None:
        """Map ``byte_size`` bytes of ``key`` from ``offset``; Triton's checks in Triton's order and words."""
        if name in self.regions:
            raise InferError(f"shared memory region '{name}' already in manager", Code.ALREADY_EXISTS)
        try:
            if shm_open is None:
                raise OSError(errno.ENOSYS, os.strerror(errno.ENOSYS))
            fd = shm_open(key, os.O_RDWR, 0o600)
        except (OSError, ValueError):
            raise internal(f"Unable to open shared memory region: '{key}'") from None
        try:
            try:
                size = os.fstat(fd).st_size
            except OSError:
                raise internal(f"Invalid shared memory region: '{key}'") from None
            if offset + byte_size > size:
                raise invalid(f"failed to register shared memory region '{name}': invalid args")
            # Any offset works (Triton's mmap wants it page aligned): the mapping starts at the page below it.
            start = offset % mmap.ALLOCATIONGRANULARITY
            try:
                if byte_size == 0:  # mmap(2) refuses an empty mapping (Python's would map the whole object)
                    raise OSError(errno.EINVAL, os.strerror(errno.EINVAL))
                mapping = mmap.mmap(fd, start + byte_size, offset=offset - start)
            except OSError as exc:
                raise invalid(f"failed to register shared memory region '{name}': unable to process address space"
                              f"{exc.strerror}") from None
        finally:
            os.close(fd)  # the mapping keeps the memory; Triton closes the descriptor too
        self.regions[name] = Region(name, key, offset, byte_size, mapping, start)

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
        """At shutdown: release every region, in use or not."""
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
        self.outputs: dict[str, memoryview] = {}

    def _hold(self, registry: SharedMemoryRegistry | None, name: str, offset: int, byte_size: int) -> memoryview:
        if registry is None:
            raise not_found(f"Unable to find shared memory region: '{name}'")
        region = registry.find(name, offset, byte_size)
        region.users += 1
        self.regions.append(region)
        offset %= _SIZE_T
        return region.data[offset:offset + byte_size]

    def input(self, registry: SharedMemoryRegistry | None, name: str, offset: int, byte_size: int) -> memoryview:
        """A read-only view of an input's bytes."""
        return self._hold(registry, name, offset, byte_size).toreadonly()

    def output(self, registry: SharedMemoryRegistry | None, tensor: str, name: str, offset: int,
               byte_size: int) -> None:
        self.outputs[tensor] = self._hold(registry, name, offset, byte_size)

    def write(self, tensor: str, array: np.ndarray) -> None:
        """Put an output where the request asked for it (BYTES serialized, numbers little-endian)."""
        target = self.outputs[tensor]
        if array.dtype == _OBJECT:
            raw: Any = serialize_bytes(array)
        else:
            flat = np.ascontiguousarray(array).reshape(-1)
            if flat.dtype.byteorder == ">":
                flat = flat.astype(flat.dtype.newbyteorder("<"))
            raw = flat.view(np.uint8)
        if len(raw) > len(target):
            raise internal(f"shared memory size specified with the request for output '{tensor}' ({len(target)} "
                           f"bytes) should be at least {len(raw)} bytes to hold the results")
        target[:len(raw)] = memoryview(raw)  # the view keeps the mapping alive, even past a shutdown's close()

    def __del__(self) -> None:
        for region in self.regions:
            region.users -= 1
