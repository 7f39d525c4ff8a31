"""The worker channel's batching, driven directly: several messages in one datagram (and the fallback when
they don't fit), answers held back until the next send, and a worker process that gets a turn's executions
in one datagram — or, when it died before they left, on its replacement."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
from pathlib import Path

import numpy as np
import pytest

from naiad.backends.base import Execution, VersionContext
from naiad.backends.python import messages as M
from naiad.backends.python.backend import PythonBackend
from naiad.backends.python.messages import Kind
from naiad.backends.python.shm import Arena
from naiad.backends.python.transport import MAX_MESSAGE, Channel
from naiad.config.loader import load_config
from naiad.config.normalize import fill_defaults
from naiad.config.render import config_to_dict
from naiad.core.request import InferRequest
from tests.backends.python import models as m


@pytest.fixture()
def pair():
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    sender, receiver = Channel(a, Arena(1 << 16, 1 << 16), blocking=True), Channel(b, Arena(1 << 16, 1 << 16))
    yield sender, receiver
    sender.close()
    receiver.close()


def test_the_last_answer_of_a_peer_that_closed_with_messages_unread_is_read(pair) -> None:
    """A worker that exits right after its last answer (a poisoned device) leaves requests it never read; Linux
    then reports ECONNRESET ahead of that answer. The answer is read, then the end of the channel."""
    sender, receiver = pair
    receiver.send(M.finalize())  # never read by the sender
    sender.send(M.poisoned("device-side assert triggered"))
    sender.sock.close()
    assert [m[0] for m in receiver.receive()] == [Kind.POISONED]
    with pytest.raises(EOFError):
        receiver.receive()


class _CountingSocket:
    """A channel's socket that records each datagram written to it (but shared-memory segment announcements, which
    precede a segment's first use); everything else goes to the socket."""

    def __init__(self, channel: Channel, sent: list[bytes]) -> None:
        self._channel, self._sock, self._sent = channel, channel.sock, sent

    def _record(self, data: bytes) -> None:
        if self._channel.codec.loads(data)[0] not in (Kind.SEGMENT, Kind.DROPPED):
            self._sent.append(bytes(data))

    def send(self, data: bytes, *args: int) -> int:
        self._record(data)
        return self._sock.send(data, *args)

    def sendmsg(self, buffers: list[bytes], *args: object) -> int:
        self._record(b"".join(buffers))
        return self._sock.sendmsg(buffers, *args)  # type: ignore[arg-type]

    def __getattr__(self, name: str) -> object:
        return getattr(self._sock, name)


def _datagrams(channel: Channel) -> list[bytes]:
    """Have the test see each datagram ``channel`` sends, whichever of its paths sends it."""
    sent: list[bytes] = []
    channel.sock = _CountingSocket(channel, sent)  # type: ignore[assignment]
    return sent


def test_send_many_is_one_datagram_in_order(pair: tuple[Channel, Channel]) -> None:
    sender, receiver = pair
    sent = _datagrams(sender)
    sender.send_many([M.execute(i, [b"payload"]) for i in range(5)])
    assert len(sent) == 1
    receiver.wait_readable(5)
    assert [M.Execute.of(m) for m in receiver.receive()] == [(Kind.EXECUTE, i, [b"payload"]) for i in range(5)]


def test_a_batch_too_big_for_one_datagram_goes_one_by_one(pair: tuple[Channel, Channel]) -> None:
    sender, receiver = pair
    sent = _datagrams(sender)
    blobs = [bytes([65 + i]) * (MAX_MESSAGE // 3) for i in range(4)]  # distinct: marshal shares equal objects
    sender.send_many([M.execute(i, blobs[i]) for i in range(4)])  # type: ignore[arg-type]
    assert len(sent) == 4
    got: list[tuple] = []
    while len(got) < 4:
        receiver.wait_readable(5)
        got += [M.Execute.of(m) for m in receiver.receive()]
    assert [g.tag for g in got] == [0, 1, 2, 3] and [g.requests for g in got] == blobs


def test_held_messages_leave_with_the_next_send(pair: tuple[Channel, Channel]) -> None:
    sender, receiver = pair
    sent = _datagrams(sender)
    sender.hold(M.bls_cancel(1))
    sender.hold(M.bls_cancel(2))
    assert sent == [] and not receiver.wait_readable(0)
    sender.send(M.log(0, "log line"))
    assert len(sent) == 1
    receiver.wait_readable(5)
    assert receiver.receive() == [M.bls_cancel(1), M.bls_cancel(2), M.log(0, "log line")]
    sender.hold(M.bls_cancel(3))
    sender.release()
    receiver.wait_readable(5)
    assert receiver.receive() == [M.bls_cancel(3)]


def _load(tmp_path: Path):
    m.write(tmp_path, "add_sub", m.io_config("add_sub", [("INPUT0", "TYPE_FP32", "[ 4 ]"), ("INPUT1", "TYPE_FP32", "[ 4 ]")],
                                            [("OUTPUT0", "TYPE_FP32", "[ 4 ]"), ("OUTPUT1", "TYPE_FP32", "[ 4 ]")]),
            m.ADD_SUB)
    folder = tmp_path / "add_sub"
    config, _ = load_config(folder, "")
    fill_defaults(config, "add_sub")
    ctx = VersionContext("add_sub", 1, config, json.dumps(config_to_dict(config)), folder, folder / "1", {})
    return PythonBackend().load(ctx)


def _request(i: int) -> InferRequest:
    return InferRequest("add_sub", inputs={"INPUT0": np.full(4, i, np.float32), "INPUT1": np.ones(4, np.float32)})


async def _submit_all(slot, count: int) -> list[Execution]:
    loop = asyncio.get_running_loop()
    futures = [loop.create_future() for _ in range(count)]
    for i, future in enumerate(futures):
        slot.submit([_request(i)], future.set_result)
    return await asyncio.wait_for(asyncio.gather(*futures), 30)


def _check(executions: list[Execution]) -> None:
    for i, execution in enumerate(executions):
        assert not execution.failed
        outputs = execution.responses[0].outputs
        np.testing.assert_array_equal(outputs["OUTPUT0"], np.full(4, i + 1, np.float32))
        np.testing.assert_array_equal(outputs["OUTPUT1"], np.full(4, i - 1, np.float32))


def test_one_turn_of_executions_reaches_the_worker_in_one_datagram(tmp_path: Path) -> None:
    loaded = _load(tmp_path)
    try:
        async def run() -> None:
            slot = loaded.instances[0]
            process = loaded.processes[0]
            sent = _datagrams(process.ch)
            _check(await _submit_all(slot, 6))
            assert len(sent) == 1

        asyncio.run(run())
    finally:
        loaded.unload()


def test_executions_submitted_to_a_dead_worker_run_on_its_replacement(tmp_path: Path) -> None:
    loaded = _load(tmp_path)
    try:
        async def run() -> None:
            slot = loaded.instances[0]
            process = loaded.processes[0]
            _check(await _submit_all(slot, 1))  # attached and warm
            old = process.proc
            os.kill(old.pid, signal.SIGKILL)
            old.wait()  # dead, but the loop has not noticed yet: the sends below find the socket closed
            _check(await _submit_all(slot, 3))
            assert process.proc.pid != old.pid and process.restarts == 1

        asyncio.run(run())
    finally:
        loaded.unload()
