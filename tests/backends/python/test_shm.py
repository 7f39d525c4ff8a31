"""The shared-memory ring when its receiver keeps blocks: a few held blocks are stepped around, a burst in flight
doubles the ring a few times, a receiver that holds everything puts the arena in copy mode with a bounded ring
instead of growing it without end, and a real model that keeps every input array it was given gets them intact
while the server's ring stays bounded.
And its memory (issue 30): segments are sealed memfds outside /dev/shm, costing only the pages the ring reaches;
where they must be /dev/shm files, a full /dev/shm fails the one allocation with a clear error, not a SIGBUS."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from naiad.backends.base import VersionContext
from naiad.backends.python.backend import PythonBackend
from naiad.backends.python.shm import HEADER, RESERVE_STEP, Arena, SegmentMap
from naiad.config.loader import load_config
from naiad.config.normalize import fill_defaults
from naiad.config.render import config_to_dict
from naiad.core.request import InferRequest
from tests.backends.python import models as m
from tests.container.namespace import unavailable
from tests.server import ROOT

KB = 1024
MB = 1024 * KB


def _release(arena: Arena, seg_id: int, offset: int) -> None:
    """What the receiver does when the last view of a block dies."""
    segments = [arena.current, *arena.retired, *arena.one_off]
    next(s for s in segments if s.id == seg_id).mm[offset - HEADER] = 0


def _blocks_overlap(blocks: list[tuple[int, int, int]]) -> bool:
    spans = sorted(blocks)
    return any(a[0] == b[0] and a[1] + a[2] > b[1] for a, b in zip(spans, spans[1:]))


def test_a_few_held_blocks_are_stepped_around_without_growing() -> None:
    arena = Arena(1 * MB, 1 * MB)
    held = []
    try:
        for i in range(2000):  # ~40 laps of the ring
            seg_id, offset, view, copy = arena.alloc(100 * KB)
            view.release()
            assert not copy
            if i % 500 == 7:
                held.append((seg_id, offset, 100 * KB))  # the receiver keeps this one
            else:
                _release(arena, seg_id, offset)
        assert arena.current.size == 1 * MB and not arena.retired and not arena.one_off
        assert len(arena.current.hole_starts) == len(held)
    finally:
        arena.close()


def test_a_receiver_that_keeps_everything_gets_copies_and_the_ring_stays_bounded() -> None:
    arena = Arena(1 * MB, 1 * MB)
    held: list[tuple[int, int, int]] = []
    copies = 0
    try:
        for i in range(400):  # 40 MB sent
            seg_id, offset, view, copy = arena.alloc(100 * KB)
            view[:4] = i.to_bytes(4, "little")
            view.release()
            arena.take_announcements()  # the channel does this on every send
            if copy:
                copies += 1
                _release(arena, seg_id, offset)  # copied out on arrival: the block is free at once
            else:
                held.append((seg_id, offset, 100 * KB))
            assert arena.ring_bytes < 3 * arena.current.size
        assert arena.copying and len(held) == 30 and copies == 370  # held: what fit 1 MB, then 2 MB
        assert arena.current.size == 4 * MB and arena.ring_bytes == 7 * MB  # 1 MB, doubled twice, then frozen
        assert not arena.one_off  # nothing in flight any more
        assert not _blocks_overlap(held)  # no held block was ever handed out again
        # The receiver lets go: the held segments drain, copy mode ends and they are unmapped.
        for seg_id, offset, _ in held:
            _release(arena, seg_id, offset)
        _, dropped = arena.take_announcements()
        assert not arena.copying and not arena.retired and len(dropped) == 2
    finally:
        arena.close()


def test_a_burst_of_big_tensors_in_flight_grows_the_ring_a_few_times() -> None:
    """16 requests of 1 MiB in flight at a time (perf_analyzer at 16 connections): the ring doubles to hold them,
    a few new segments, not one per megabyte (each onto fresh pages, each a chance of copy mode)."""
    arena = Arena(1 * MB, 1 * MB)
    in_flight: list[tuple[int, int]] = []
    opened = copies = 0
    try:
        for _ in range(200):
            seg_id, offset, view, copy = arena.alloc(1 * MB)
            view.release()
            copies += copy
            in_flight.append((seg_id, offset))
            if len(in_flight) == 16:
                _release(arena, *in_flight.pop(0))  # the oldest request answered
            fds, _ = arena.take_announcements()
            opened += len(fds)
            for _, fd in fds:
                os.close(fd)
        # 1, 3, 6, 12 then 24 MiB, and a copy mode's overflow or two (growing by 1 MiB each time opened 25)
        assert opened <= 8 and arena.current.size >= 16 * MB, (opened, arena.current.size)
        assert copies <= 32  # copy mode, if at all, only while the first segments drained
    finally:
        arena.close()


def test_a_block_too_big_for_a_copy_mode_ring_travels_in_a_one_off_segment() -> None:
    arena = Arena(1 * MB, 1 * MB)
    try:
        for _ in range(40):  # hold enough to enter copy mode
            arena.alloc(100 * KB)[2].release()
        assert arena.copying
        seg_id, offset, view, copy = arena.alloc(8 * MB)  # larger than the ring: growing is off while held
        view.release()
        assert copy and [s.id for s in arena.one_off] == [seg_id] and arena.current.size == 4 * MB
        _release(arena, seg_id, offset)
        _, dropped = arena.take_announcements()
        assert seg_id in dropped and not arena.one_off
    finally:
        arena.close()


def test_a_receiver_that_stops_reading_costs_a_few_overflow_segments_not_one_per_block() -> None:
    """A stalled peer: thousands of blocks sent and none freed. Copy mode's overflow segments take many blocks
    each and double in size, so the descriptors stay few (one per block ran a front end out of them under
    nofile 1024), and all go once the blocks are freed."""
    arena = Arena(1 * MB, 1 * MB)
    try:
        blocks = []
        for _ in range(3000):  # 96 MiB of 32 KiB blocks, all held
            seg_id, offset, view, _ = arena.alloc(32 * KB)
            view.release()
            blocks.append((seg_id, offset))
        assert arena.copying
        assert len(arena.one_off) <= 8, [s.size for s in arena.one_off]
        for seg_id, offset in blocks:
            _release(arena, seg_id, offset)
        _, dropped = arena.take_announcements()
        assert not arena.one_off and not arena.retired
    finally:
        arena.close()


KEEPER = """
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        self.kept = []

    def execute(self, requests):
        out = []
        for request in requests:
            data = request.inputs()[0].as_numpy()
            if data.size == 1:  # let go of everything
                self.kept = []
            else:
                self.kept.append(data)  # a reference to the input array, kept across requests
            # Every kept array still holds what it was sent with (each is filled with one value).
            intact = sum(1 for a in self.kept if (a[::4096] == a[0]).all() and a[-1] == a[0])
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("INTACT", np.array([intact], np.int64))]))
        return out
"""


def _load(tmp_path: Path):
    m.write(tmp_path, "keeper", m.io_config("keeper", [("IN", "TYPE_UINT8", "[ -1 ]")],
                                            [("INTACT", "TYPE_INT64", "[ 1 ]")]), KEEPER)
    folder = tmp_path / "keeper"
    config, _ = load_config(folder, "")
    fill_defaults(config, "keeper")
    options = {"shm-default-byte-size": str(1 * MB), "shm-growth-byte-size": str(1 * MB)}
    ctx = VersionContext("keeper", 1, config, json.dumps(config_to_dict(config)), folder, folder / "1", options)
    return PythonBackend().load(ctx)


def test_a_model_that_keeps_all_its_inputs_leaves_the_ring_bounded(tmp_path: Path) -> None:
    loaded = _load(tmp_path)
    try:
        async def run() -> None:
            instance, arena = loaded.instances[0], loaded.processes[0].ch.arena
            count = 150  # 200 kB each: 30 MB kept by the model
            for i in range(count):
                data = np.full(200 * KB, i % 251, np.uint8)
                execution = await instance.execute([InferRequest("keeper", inputs={"IN": data})])
                assert int(execution.responses[0].outputs["INTACT"][0]) == i + 1
                assert arena.ring_bytes < 3 * arena.current.size
            assert arena.copying and arena.current.size <= 4 * MB and arena.ring_bytes <= 7 * MB
            assert not arena.one_off
            # The model lets go: the next sends find the held segments drained, and copy mode ends.
            for _ in range(2):
                await instance.execute([InferRequest("keeper", inputs={"IN": np.zeros(1, np.uint8)})])
            await instance.execute([InferRequest("keeper", inputs={"IN": np.zeros(200 * KB, np.uint8)})])
            assert not arena.copying and not arena.retired

        asyncio.run(run())
    finally:
        loaded.unload()


def _reserved(arena: Arena) -> int:
    """Bytes of memory the current segment holds (pages reserved or touched), as the kernel counts them."""
    return os.fstat(arena.current.fd).st_blocks * 512


def test_segments_are_sealed_memfds_outside_dev_shm() -> None:
    arena = Arena(16 * MB, 1 * MB)
    receiver = SegmentMap()
    try:
        (seg_id, fd), = arena.take_announcements()[0]
        assert os.readlink(f"/proc/self/fd/{fd}").startswith("/memfd:naiad-py")
        # The receiver (a model's process) can neither shrink a segment under the sender's mapping nor grow it.
        for size in (0, 32 * MB):
            with pytest.raises(PermissionError):
                os.ftruncate(fd, size)
        receiver.add(seg_id, fd)
        seg, offset, view, _ = arena.alloc(100 * KB)
        view[:3] = b"abc"
        view.release()
        assert bytes(receiver.view(seg, offset, 3)) == b"abc"
    finally:
        receiver.close()
        arena.close()


def test_an_arena_costs_the_pages_its_ring_reaches_not_its_size() -> None:
    arena = Arena(16 * MB, 1 * MB)  # SageMaker's default size
    try:
        assert _reserved(arena) == 0  # an idle instance costs nothing
        in_flight: list[tuple[int, int]] = []
        for _ in range(2000):  # ~400 MB through a pipeline that keeps three 200 kB blocks in flight
            seg_id, offset, view, _ = arena.alloc(200 * KB)
            view[:] = b"x" * len(view)  # every page of the block written
            view.release()
            in_flight.append((seg_id, offset))
            if len(in_flight) == 3:
                _release(arena, *in_flight.pop(0))
        # The ring cycles through what the pipeline needs, not through the whole 16 MiB segment.
        assert arena.current.size == 16 * MB and not arena.retired
        assert arena.current.limit <= 3 * 200 * KB + 2 * RESERVE_STEP
        assert _reserved(arena) == arena.current.limit
        seg_id, offset, view, _ = arena.alloc(10 * MB)  # a large tensor reaches further, once
        view.release()
        assert _reserved(arena) >= 10 * MB and arena.current.size == 16 * MB
    finally:
        arena.close()


# Run in a mount namespace whose /dev/shm holds 1 MiB, with memfds refused: segments are /dev/shm files there.
FULL_DEV_SHM = """
import os
from naiad.backends.python import shm
from naiad.core.errors import InferError

shm._memfd = False  # as where memfd_create is missing or refused
assert "live in /dev/shm, which holds only 1 MiB" in shm.dev_shm_note(), shm.dev_shm_note()
arena = shm.Arena(16 << 20, 1 << 20)  # sparse: opens in a 1 MiB /dev/shm
(_, fd), = arena.take_announcements()[0]
assert os.readlink(f"/proc/self/fd/{fd}").startswith("/dev/shm/naiad-py-")
for _ in range(100):
    seg, offset, view, _ = arena.alloc(100 << 10)
    view[:] = b"x" * len(view)
    view.release()
    arena.current.mm[offset - shm.HEADER] = 0  # freed, as the receiver does
try:
    arena.alloc(4 << 20)  # more than /dev/shm can hold: an error for this block, not a SIGBUS at first write
except InferError as exc:
    print(exc.message)
seg, offset, view, _ = arena.alloc(100 << 10)  # and the arena goes on serving
view[:] = b"y" * len(view)
print("still serving")
"""


@pytest.mark.skipif(unavailable() is not None, reason=str(unavailable()))
def test_a_full_dev_shm_fails_the_allocation_not_the_process() -> None:
    script = "mount -t tmpfs -o size=1m tmpfs /dev/shm && exec \"$@\""
    run = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh", sys.executable,
                          "-c", textwrap.dedent(FULL_DEV_SHM)], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "PYTHONPATH": str(ROOT)}, check=False)
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert lines[0].startswith("failed to allocate ") and lines[0].endswith(
        " bytes of shared memory in /dev/shm (no space left); free space there or lower "
        "--backend-config=python,shm-default-byte-size / shm-growth-byte-size"), lines
    assert lines[1:] == ["still serving"]
