"""The shared-memory ring when its receiver keeps blocks: a few held blocks are stepped around, a receiver that
holds everything puts the arena in copy mode with a bounded ring instead of growing it without end, and a
real model that keeps every input array it was given gets them intact while the server's ring stays bounded."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import numpy as np

from naiad.backends.base import VersionContext
from naiad.backends.python.backend import PythonBackend
from naiad.backends.python.shm import HEADER, Arena
from naiad.config.loader import load_config
from naiad.config.normalize import fill_defaults
from naiad.config.render import config_to_dict
from naiad.core.request import InferRequest
from tests.backends.python import models as m

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
        assert arena.current.size == 3 * MB and arena.ring_bytes == 6 * MB  # 1 MB, grown twice, then frozen
        assert not arena.one_off  # nothing in flight any more
        assert not _blocks_overlap(held)  # no held block was ever handed out again
        # The receiver lets go: the held segments drain, copy mode ends and they are unmapped.
        for seg_id, offset, _ in held:
            _release(arena, seg_id, offset)
        _, dropped = arena.take_announcements()
        assert not arena.copying and not arena.retired and len(dropped) == 2
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
        assert copy and [s.id for s in arena.one_off] == [seg_id] and arena.current.size == 3 * MB
        _release(arena, seg_id, offset)
        _, dropped = arena.take_announcements()
        assert seg_id in dropped and not arena.one_off
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
            assert arena.copying and arena.current.size <= 3 * MB and arena.ring_bytes <= 6 * MB
            assert not arena.one_off
            # The model lets go: the next sends find the held segments drained, and copy mode ends.
            for _ in range(2):
                await instance.execute([InferRequest("keeper", inputs={"IN": np.zeros(1, np.uint8)})])
            await instance.execute([InferRequest("keeper", inputs={"IN": np.zeros(200 * KB, np.uint8)})])
            assert not arena.copying and not arena.retired

        asyncio.run(run())
    finally:
        loaded.unload()
