"""The shared memory registry on its own: registering windows of POSIX shared memory objects, Triton's bounds
checks, what a request holds, writing outputs, and releasing regions (their descriptors, checked in /proc/self/fd;
the registry never maps a client's object, checked in /proc/self/maps)."""

from __future__ import annotations

import gc
import os
from collections.abc import Callable, Iterator

import numpy as np
import pytest
from _posixshmem import shm_open, shm_unlink

from naiad.core.errors import Code, InferError
from naiad.core.shared_memory import SharedMemoryRegistry, SharedMemoryUse

KEY = f"/naiad-unit-{os.getpid()}"


@pytest.fixture
def segment() -> Iterator[Callable[[int, int], bytes]]:
    """A 3-page shared memory object holding bytes 0, 1, 2, ... (mod 256), written and read through descriptors
    open only meanwhile, so that only the registry holds it; yields a reader of its bytes."""
    fd = shm_open(KEY, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    os.pwrite(fd, bytes(i % 256 for i in range(3 * 4096)), 0)
    os.close(fd)

    def read(offset: int, size: int) -> bytes:
        fd = shm_open(KEY, os.O_RDONLY, 0o600)
        try:
            return os.pread(fd, size, offset)
        finally:
            os.close(fd)

    yield read
    shm_unlink(KEY)


@pytest.fixture
def registry() -> Iterator[SharedMemoryRegistry]:
    registry = SharedMemoryRegistry()
    yield registry
    registry.close()


def _mapped() -> bool:
    """Whether this process holds the object: by an open descriptor (the registry's way) or a mapping."""
    gc.collect()  # pytest.raises keeps failed calls' frames (and what they hold) in reference cycles
    with open("/proc/self/maps") as maps:
        assert f"/dev/shm{KEY}" not in maps.read()  # never mapped: a truncated object can't fault the server
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}") == f"/dev/shm{KEY}":
                return True
        except OSError:
            pass
    return False


def _raises(call, code: Code, message: str) -> None:
    with pytest.raises(InferError) as info:
        call()
    assert (info.value.code, info.value.message) == (code, message)


def test_register_status_unregister(registry: SharedMemoryRegistry, segment: object) -> None:
    registry.register("b", KEY, 4096, 100)
    registry.register("a", KEY, 0, 64)  # a second window of the same object
    assert registry.status() == [{"name": "a", "key": KEY, "offset": 0, "byte_size": 64},
                                 {"name": "b", "key": KEY, "offset": 4096, "byte_size": 100}]
    assert registry.status("b") == [{"name": "b", "key": KEY, "offset": 4096, "byte_size": 100}]
    assert _mapped()
    registry.unregister("a")
    registry.unregister("a")  # unknown names are fine
    registry.unregister_all()
    assert registry.status() == [] and not _mapped()
    _raises(lambda: registry.status("a"), Code.NOT_FOUND, "Unable to find system shared memory region: 'a'")


def test_register_errors(registry: SharedMemoryRegistry, segment: object) -> None:
    registry.register("r", KEY, 0, 64)
    _raises(lambda: registry.register("r", KEY, 0, 64), Code.ALREADY_EXISTS,
            "shared memory region 'r' already in manager")
    for key in ("/naiad-unit-absent", "/../etc/passwd", ""):
        _raises(lambda: registry.register("x", key, 0, 64), Code.INTERNAL,
                f"Unable to open shared memory region: '{key}'")
    _raises(lambda: registry.register("x", KEY, 4096, 2 * 4096 + 1), Code.INVALID_ARG,
            "failed to register shared memory region 'x': invalid args")
    _raises(lambda: registry.register("x", KEY, 0, 0), Code.INVALID_ARG,
            "failed to register shared memory region 'x': unable to process address spaceInvalid argument")
    assert [r["name"] for r in registry.status()] == ["r"]


def test_windows_at_any_offset(registry: SharedMemoryRegistry, segment: object) -> None:
    registry.register("w", KEY, 4096 + 10, 20)
    use = SharedMemoryUse()
    view = use.input(registry, "w", 2, 4)
    assert bytes(view) == bytes(i % 256 for i in range(4096 + 12, 4096 + 16))
    assert not np.frombuffer(view, dtype=np.uint8).flags.writeable  # read-only, as every other input source


@pytest.mark.parametrize(("offset", "size", "message"), [
    (0, 64, None),
    (63, 1, None),
    (60, 8, "Invalid offset + byte size for shared memory region: 'r'"),
    (64, 1, "Invalid offset for shared memory region: 'r'"),
    (0, 0, "Invalid offset + byte size for shared memory region: 'r'"),  # Triton's size_t arithmetic wraps
    (5, 0, None),
    (-1, 4, "Invalid offset for shared memory region: 'r'"),  # a negative gRPC int64 is a huge size_t
    (0, -1, "Invalid offset + byte size for shared memory region: 'r'"),
])
def test_bounds(registry: SharedMemoryRegistry, segment: object, offset: int, size: int, message: str | None) -> None:
    registry.register("r", KEY, 0, 64)
    if message is None:
        assert registry.find("r", offset, size).name == "r"
    else:
        _raises(lambda: registry.find("r", offset, size), Code.INVALID_ARG, message)
    _raises(lambda: registry.find("nope", 0, 4), Code.NOT_FOUND, "Unable to find shared memory region: 'nope'")


def test_in_use_until_the_request_goes(registry: SharedMemoryRegistry, segment: object) -> None:
    registry.register("r", KEY, 0, 64)
    registry.register("s", KEY, 64, 64)
    use = SharedMemoryUse()
    array = np.frombuffer(use.input(registry, "r", 0, 16), dtype=np.int32)
    _raises(lambda: registry.unregister("r"), Code.INTERNAL,
            "Cannot unregister shared memory region 'r', it is currently in use.")
    _raises(registry.unregister_all, Code.INTERNAL,
            "Failed to unregister the following system shared memory regions: r ,")
    assert [r["name"] for r in registry.status()] == ["r"]  # the free one went
    del use
    gc.collect()
    # The model holds a copy of its input, not the region: the name and the descriptor go at once.
    registry.unregister("r")
    registry.unregister("s")
    assert registry.status() == [] and not _mapped()
    assert array.tolist() == np.frombuffer(bytes(range(16)), dtype=np.int32).tolist()


def test_outputs(registry: SharedMemoryRegistry, segment: Callable[[int, int], bytes]) -> None:
    registry.register("r", KEY, 0, 64)
    use = SharedMemoryUse()
    use.output(registry, "A", "r", 0, 16)
    use.output(registry, "B", "r", 16, 40)
    use.write("A", np.array([1, 2, 3, 4], dtype=">i4"))  # big-endian arrays still land little-endian
    use.write("B", np.array([b"ab", b""], dtype=np.object_))
    data = segment(0, 64)
    assert np.frombuffer(data[:16], dtype="<i4").tolist() == [1, 2, 3, 4]
    assert data[16:30] == b"\x02\x00\x00\x00ab\x00\x00\x00\x00" + bytes(range(26, 30))
    _raises(lambda: use.write("A", np.zeros(5, dtype=np.int32)), Code.INTERNAL,
            "shared memory size specified with the request for output 'A' (16 bytes) should be at least 20 bytes to "
            "hold the results")


def test_close_with_a_request_still_holding_a_region(segment: Callable[[int, int], bytes]) -> None:
    """At shutdown every region goes, in use or not; a straggling request still writes safely."""
    registry = SharedMemoryRegistry()
    registry.register("r", KEY, 0, 64)
    use = SharedMemoryUse()
    use.output(registry, "A", "r", 0, 8)
    registry.close()
    assert registry.status() == []
    use.write("A", np.array([7, 8], dtype=np.int32))
    assert segment(0, 8) == np.array([7, 8], dtype=np.int32).tobytes()
    del use
    assert not _mapped()


def test_cuda_answers(registry: SharedMemoryRegistry, segment: object) -> None:
    registry.register("r", KEY, 0, 64)
    assert registry.cuda_status() == []
    _raises(lambda: registry.cuda_status("x"), Code.NOT_FOUND, "Unable to find cuda shared memory region: 'x'")
    _raises(lambda: registry.cuda_status("r"), Code.NOT_FOUND,
            "The region named 'r' is registered as system shared memory, not CUDA shared memory")
    _raises(lambda: registry.cuda_register("x"), Code.INVALID_ARG,
            "failed to register shared memory region: invalid args")
    _raises(lambda: registry.cuda_register("r"), Code.ALREADY_EXISTS, "shared memory region 'r' already in manager")


def test_no_registry_means_no_region() -> None:
    _raises(lambda: SharedMemoryUse().input(None, "r", 0, 4), Code.NOT_FOUND,
            "Unable to find shared memory region: 'r'")


def _truncate(size: int) -> None:
    fd = shm_open(KEY, os.O_RDWR, 0o600)
    try:
        os.ftruncate(fd, size)
    finally:
        os.close(fd)


def test_a_truncated_object_fails_the_access_not_the_process(registry: SharedMemoryRegistry,
                                                             segment: Callable[[int, int], bytes]) -> None:
    """The client shrinks its object after registering: reads and writes past the new end are errors (a mapping
    would take SIGBUS here, and pytest with it); a write never grows the object back."""
    registry.register("r", KEY, 4096, 2 * 4096)
    use = SharedMemoryUse()
    use.output(registry, "A", "r", 4096, 16)
    _truncate(4096 + 100)
    assert bytes(use.input(registry, "r", 0, 100)) == segment(4096, 100)  # what is still there reads fine
    _raises(lambda: use.input(registry, "r", 0, 101), Code.INVALID_ARG,
            f"shared memory region 'r' is smaller than its registered offset + byte size: its object '{KEY}' holds "
            f"4196 bytes, 4197 needed (it was truncated after registration)")
    _truncate(0)
    _raises(lambda: use.write("A", np.arange(4, dtype=np.int32)), Code.INVALID_ARG,
            f"shared memory region 'r' is smaller than its registered offset + byte size: its object '{KEY}' holds "
            f"0 bytes, 8208 needed (it was truncated after registration)")
    assert segment(0, 1) == b""  # still empty
    _truncate(3 * 4096)  # grown back by its owner: the region serves again
    use.write("A", np.arange(4, dtype=np.int32))
    assert segment(2 * 4096, 16) == np.arange(4, dtype=np.int32).tobytes()


def test_registrations_are_capped(segment: object) -> None:
    registry = SharedMemoryRegistry(max_regions=3)
    try:
        for name in "abc":
            registry.register(name, KEY, 0, 64)
        _raises(lambda: registry.register("d", KEY, 0, 64), Code.INVALID_ARG,
                "failed to register shared memory region 'd': the server already holds 3 regions, its limit "
                "(--shared-memory-max-regions); unregister regions no longer used")
        registry.unregister("a")
        registry.register("d", KEY, 0, 64)  # room again
        assert [r["name"] for r in registry.status()] == ["b", "c", "d"]
    finally:
        registry.close()
    assert not _mapped()


def test_a_fifo_is_not_a_region(registry: SharedMemoryRegistry) -> None:
    """Someone's FIFO in /dev/shm: refused at registration, never read (a read would block the server)."""
    path = f"/dev/shm{KEY}-fifo"
    os.mkfifo(path, 0o600)
    try:
        _raises(lambda: registry.register("f", f"{KEY}-fifo", 0, 0), Code.INTERNAL,
                f"Invalid shared memory region: '{KEY}-fifo'")
    finally:
        os.unlink(path)


def test_large_inputs_read_whole_or_refused(registry: SharedMemoryRegistry) -> None:
    """From 1 MiB on an input is read into an array of its own: the same bytes, read-only, and the same refusal
    when the object has shrunk under it."""
    size = 3 << 20
    fd = shm_open(KEY, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    try:
        os.pwrite(fd, np.arange(size // 4, dtype=np.int32).tobytes(), 0)
        registry.register("big", KEY, 0, size)
        use = SharedMemoryUse()
        array = np.frombuffer(use.input(registry, "big", 4, size - 8), dtype=np.int32)
        assert array.tolist() == list(range(1, size // 4 - 1)) and not array.flags.writeable
        os.ftruncate(fd, size // 2)
        _raises(lambda: use.input(registry, "big", 0, size), Code.INVALID_ARG,
                f"shared memory region 'big' is smaller than its registered offset + byte size: its object '{KEY}' "
                f"holds {size // 2} bytes, {size} needed (it was truncated after registration)")
    finally:
        os.close(fd)
        shm_unlink(KEY)
