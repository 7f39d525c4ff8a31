"""A client registers a system shared memory region, then truncates its /dev/shm object (issue 19, item 3). A server
that maps regions takes SIGBUS on its next access and dies with every client's requests; naiad reads and writes
regions through a descriptor, so the request that names the short region fails with a 400 / INVALID_ARGUMENT that
says why, and the server keeps serving. Driven by tritonclient (HTTP and gRPC) and tritonclient.utils.shared_memory,
the way its shm examples drive Triton. Also: a region larger than its object is refused at registration, and the
number of regions is capped (--shared-memory-max-regions)."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import psutil
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from _posixshmem import shm_open
from tritonclient.utils import InferenceServerException

from tests.frontends.shared_memory_models import key, write_shm_models
from tests.server import RunningServer

MAX_REGIONS = 6
SIZE = 64  # one [1, 16] INT32 tensor
SHORT = "is smaller than its registered offset + byte size"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    repo = tmp_path_factory.mktemp("shm_truncate")
    write_shm_models(repo)  # "simple": a Python model in its own worker process, sum and difference
    running = RunningServer([repo], f"--shared-memory-max-regions={MAX_REGIONS}")
    yield running
    running.stop()


@pytest.fixture(params=("http", "grpc"))
def protocol(request: pytest.FixtureRequest, server: RunningServer) -> Iterator[tuple[ModuleType, Any]]:
    module: ModuleType = httpclient if request.param == "http" else grpcclient
    client = module.InferenceServerClient(server.url if module is httpclient else server.grpc_url)
    yield module, client
    client.unregister_system_shared_memory()
    client.close()


@pytest.fixture
def regions(protocol: tuple[ModuleType, Any]) -> Iterator[dict[str, Any]]:
    """"in" holds INPUT0 (0..15) and INPUT1 (ones), "out" has room for both outputs; both registered."""
    _, client = protocol
    handles = {"in": shm.create_shared_memory_region("in", key("in"), 2 * SIZE),
               "out": shm.create_shared_memory_region("out", key("out"), 2 * SIZE)}
    try:
        _fill(handles["in"])
        for name in handles:
            client.register_system_shared_memory(name, key(name), 2 * SIZE)
        yield handles
    finally:
        for handle in handles.values():
            shm.destroy_shared_memory_region(handle)


def _fill(handle: Any) -> None:
    shm.set_shared_memory_region(handle, [np.arange(16, dtype=np.int32), np.ones(16, dtype=np.int32)])


def _truncate(name: str, size: int) -> None:
    """What the attacker does: shrink (or grow back) the object behind a registered region."""
    fd = shm_open(key(name), os.O_RDWR, 0o600)
    try:
        os.ftruncate(fd, size)
    finally:
        os.close(fd)


def _infer_shm(module: ModuleType, client: Any, outputs_too: bool = True) -> Any:
    inputs = [module.InferInput("INPUT0", [1, 16], "INT32"), module.InferInput("INPUT1", [1, 16], "INT32")]
    inputs[0].set_shared_memory("in", SIZE)
    inputs[1].set_shared_memory("in", SIZE, offset=SIZE)
    outputs = [module.InferRequestedOutput("OUTPUT0"), module.InferRequestedOutput("OUTPUT1")]
    if outputs_too:
        outputs[0].set_shared_memory("out", SIZE)
        outputs[1].set_shared_memory("out", SIZE, offset=SIZE)
    return client.infer("simple", inputs, outputs=outputs)


def _infer_plain(module: ModuleType, client: Any) -> None:
    """A request without shared memory: the server still answers it, right."""
    a, b = np.arange(16, dtype=np.int32).reshape(1, 16), np.full((1, 16), 2, dtype=np.int32)
    inputs = [module.InferInput("INPUT0", [1, 16], "INT32"), module.InferInput("INPUT1", [1, 16], "INT32")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    result = client.infer("simple", inputs)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)


def _refused(call: Any, module: ModuleType) -> str:
    with pytest.raises(InferenceServerException) as info:
        call()
    assert info.value.status() == ("400" if module is httpclient else "StatusCode.INVALID_ARGUMENT"), info.value
    return info.value.message()


def _alive(server: RunningServer) -> None:
    assert server.proc.poll() is None, f"the server died ({server.proc.returncode}):\n{server.log()[-3000:]}"


@pytest.mark.parametrize("size", [0, SIZE + 10])  # gone, or cut inside INPUT1
def test_truncated_input_region_fails_only_that_request(server: RunningServer, protocol: tuple[ModuleType, Any],
                                                        regions: dict[str, Any], size: int) -> None:
    module, client = protocol
    _infer_shm(module, client)  # it works before
    _truncate("in", size)
    message = _refused(lambda: _infer_shm(module, client), module)
    needed = SIZE if size < SIZE else 2 * SIZE  # the first input that no longer fits
    assert message == (f"shared memory region 'in' {SHORT}: its object '{key('in')}' holds {size} bytes, "
                       f"{needed} needed (it was truncated after registration)")
    time.sleep(0.2)  # a SIGBUS would have ended the process by now
    _alive(server)
    _infer_plain(module, client)
    _truncate("in", 2 * SIZE)  # the owner grows it back and fills it: the same registration serves again
    _fill(regions["in"])
    _infer_shm(module, client)
    got = shm.get_contents_as_numpy(regions["out"], np.int32, [1, 16])
    np.testing.assert_array_equal(got[0], np.arange(16) + 1)


def test_truncated_output_region_fails_only_that_request(server: RunningServer, protocol: tuple[ModuleType, Any],
                                                         regions: dict[str, Any]) -> None:
    module, client = protocol
    _truncate("out", SIZE + 4)  # OUTPUT0 still fits, OUTPUT1 no longer does
    message = _refused(lambda: _infer_shm(module, client), module)
    assert message == (f"shared memory region 'out' {SHORT}: its object '{key('out')}' holds {SIZE + 4} bytes, "
                       f"{2 * SIZE} needed (it was truncated after registration)")
    assert os.stat(f"/dev/shm{key('out')}").st_size == SIZE + 4  # not grown back behind its owner's back
    _alive(server)
    result = _infer_shm(module, client, outputs_too=False)  # the inputs' region is whole
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1")[0], np.arange(16) - 1)
    _infer_plain(module, client)


def test_a_region_larger_than_its_object_is_refused(server: RunningServer, protocol: tuple[ModuleType, Any]) -> None:
    module, client = protocol
    handle = shm.create_shared_memory_region("small", key("small"), SIZE)
    try:
        message = _refused(lambda: client.register_system_shared_memory("big", key("small"), SIZE, offset=8),
                           module)
        assert message == "failed to register shared memory region 'big': invalid args"
        status = client.get_system_shared_memory_status()
        assert not (status if module is httpclient else status.regions), status
    finally:
        shm.destroy_shared_memory_region(handle)
    _alive(server)


def test_registrations_are_capped(server: RunningServer, protocol: tuple[ModuleType, Any]) -> None:
    module, client = protocol
    handle = shm.create_shared_memory_region("many", key("many"), SIZE)
    try:
        for i in range(MAX_REGIONS):
            client.register_system_shared_memory(f"r{i}", key("many"), SIZE)
        message = _refused(lambda: client.register_system_shared_memory("one-more", key("many"), SIZE), module)
        assert message == (f"failed to register shared memory region 'one-more': the server already holds "
                           f"{MAX_REGIONS} regions, its limit (--shared-memory-max-regions); unregister regions no "
                           "longer used")
        client.unregister_system_shared_memory("r0")
        client.register_system_shared_memory("one-more", key("many"), SIZE)  # room again
    finally:
        client.unregister_system_shared_memory()
        shm.destroy_shared_memory_region(handle)
    held = sum(1 for fd in Path(f"/proc/{server.proc.pid}/fd").iterdir() if _target(fd).startswith("/dev/shm/naiad-test"))
    assert held == 0, "unregistered regions still hold descriptors"


def _target(fd: Path) -> str:
    try:
        return os.readlink(fd)
    except OSError:
        return ""


def test_truncation_racing_requests(server: RunningServer, regions: dict[str, Any],
                                    protocol: tuple[ModuleType, Any]) -> None:
    """The size flips between empty and whole while requests read and write the regions (the race a size check
    before a mapped access would lose): every answer is the right result or the clear refusal."""
    module, client = protocol
    stop = threading.Event()

    def flip() -> None:
        while not stop.is_set():
            for name in ("in", "out"):
                _truncate(name, 0)
            for name in ("in", "out"):
                _truncate(name, 2 * SIZE)
            _fill(regions["in"])

    flipper = threading.Thread(target=flip)
    flipper.start()
    outcomes = {"ok": 0, "refused": 0}
    rss = psutil.Process(server.proc.pid).memory_info().rss
    try:
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:
            try:
                _infer_shm(module, client)
                outcomes["ok"] += 1
            except InferenceServerException as exc:
                assert exc.status() in ("400", "StatusCode.INVALID_ARGUMENT") and SHORT in exc.message(), exc
                outcomes["refused"] += 1
    finally:
        stop.set()
        flipper.join()
    _alive(server)
    assert outcomes["refused"], outcomes  # the race was run
    _infer_plain(module, client)
    # Nothing piles up per refused request (generous: allocator noise only).
    assert psutil.Process(server.proc.pid).memory_info().rss - rss < 32 << 20
