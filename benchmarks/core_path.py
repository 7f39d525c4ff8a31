"""The model host's CPU time per small request, in process: no front end, no server, no front-end process.

A ``Service`` answers requests that come through the host's own ``hosting.Link`` over a socketpair, 8 per datagram
(``--per-datagram``), as a front-end process sends them, for one of two models (``--model``):

- ``identity`` (default): an ONNX FP32 [-1,16] identity, run by onnxruntime inline on the loop;
- ``add_sub``: the bundled Python-backend example (examples/model_repository/add_sub), run by its own worker
  process. The worker's CPU is not this thread's, so the figure is the host's side of the Python backend: the
  router sending executions over the channel, reading the worker's answers and completing the executions,
  and the waits for the worker (wakes, system calls). The worker's own µs per request are printed beside it.

The front end's side (packing, sending, reading the answers) runs in this thread too; its CPU time is measured
apart and taken out, so the figure is what the host spends: decoding, ``Service.infer``, scheduling, the model's
run (or the trip to its worker), statistics, answering.

    python benchmarks/core_path.py [--model identity|add_sub] [--requests 20000] [--rounds 5]
                                   [--per-datagram 8] [--profile out.prof] [--root TREE] [--prechecked]

``--prechecked``: requests come checked against the model's signature, as front-end processes send them (the
host skips its own check).

``--profile`` also prints the Python calls per request (this file's own included): deterministic where the µs
are noisy. ``--root``: the naiad checkout to import (default: the one holding this script), so that a copy of
this script can measure another tree A/B. ``multicore.py`` measures the same thing with real front-end
processes and clients.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import os
import pstats
import shutil
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=("identity", "add_sub"), default="identity")
    parser.add_argument("--requests", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--per-datagram", type=int, default=8,
                        help="requests sent together (in one datagram) and answered before the next are sent")
    parser.add_argument("--profile", help="write a cProfile of one more round here")
    parser.add_argument("--prechecked", action="store_true", help="requests checked by their front end")
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parent.parent,
                        help="the naiad tree to measure (default: this script's)")
    return parser.parse_args()


ARGS = arguments() if __name__ == "__main__" else None
ROOT = (ARGS.root if ARGS is not None else Path(__file__).resolve().parent.parent).resolve()
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))  # (the tree's own: a copy of this script may run elsewhere)

import psutil

from naiad.backends.python.shm import Arena
from naiad.backends.python.transport import Channel
from naiad.server import Server, ServerOptions
from naiad.service import wire
from naiad.service.hosting import Link
from tests.onnx_graphs import identity
from tests.server import EXAMPLES

from multicore import IDENTITY_CONFIG  # a sibling script: the same model


def repository(into: Path, model: str) -> None:
    if model == "add_sub":
        shutil.copytree(EXAMPLES / "add_sub", into / "add_sub")
        return
    import onnx

    (into / "identity" / "1").mkdir(parents=True)
    (into / "identity" / "config.pbtxt").write_text(IDENTITY_CONFIG)
    onnx.save(identity("TYPE_FP32", ["batch", 16]), str(into / "identity" / "1" / "model.onnx"))


def inputs(front: Channel, model: str) -> list:
    if model == "add_sub":
        return [front.pack("INPUT0", np.arange(4, dtype=np.float32)),
                front.pack("INPUT1", np.ones(4, dtype=np.float32))]
    return [front.pack("INPUT0", np.arange(16, dtype=np.float32).reshape(1, 16))]


async def measure(service: object, model: str, count: int, per_datagram: int,
                  profile: cProfile.Profile | None, prechecked: bool = False) -> float:
    """Host CPU µs per request over ``count`` requests."""
    host_end, front_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    link = Link(service, host_end, lambda _: None, lambda: None, lambda _: None, lambda: [link])  # type: ignore[arg-type]
    loop = asyncio.get_running_loop()
    link.attach(loop)
    front = Channel(front_end, Arena())
    readable = asyncio.Event()
    loop.add_reader(front_end.fileno(), readable.set)
    records = inputs(front, model)
    checked = batch_size = 0
    if prechecked:  # the number the host gives the version with its view, as a front end asks for it
        front.send((wire.CALL, 1, "model", (model, "")))
        while not checked:
            await readable.wait()
            readable.clear()
            checked = next((m[3][1] for m in front.receive() if m[0] == wire.REPLY), 0)
        batch_size = 0 if model == "add_sub" else 1  # (add_sub has no batch dimension)
    front_ns = 0
    answered = 0
    next_id = 0
    started = time.thread_time_ns()
    if profile is not None:
        profile.enable()
    while answered < count:
        t0 = time.thread_time_ns()
        batch = []
        for _ in range(per_datagram):
            next_id += 1
            batch.append(tuple(wire.Request(wire.INFER, next_id, model, "", "", records, None, {}, 0, 0, 0, 0, None,
                                            checked=checked, batch_size=batch_size)))
        front.send_many(batch)
        front_ns += time.thread_time_ns() - t0
        got = 0
        while got < per_datagram:
            await readable.wait()
            readable.clear()
            t0 = time.thread_time_ns()
            for message in front.receive():
                if message[0] == wire.RESULT:
                    assert message[7] is None, message[7]
                    got += 1
            front_ns += time.thread_time_ns() - t0
        answered += got
    if profile is not None:
        profile.disable()
    total = time.thread_time_ns() - started
    loop.remove_reader(front_end.fileno())
    link.close()
    front.close()
    return (total - front_ns) / answered / 1000


def _workers_cpu() -> float:
    """CPU seconds of this process's children (the Python backend's workers)."""
    total = 0.0
    for child in psutil.Process().children(recursive=True):
        try:
            times = child.cpu_times()
            total += times.user + times.system
        except psutil.NoSuchProcess:
            pass
    return total


async def main_async(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp)
        repository(repo, args.model)
        server = Server(ServerOptions(model_repositories=[repo]))
        await server._load_models()
        service = server.service
        service.live = service.accepting = True
        try:
            await measure(service, args.model, 2000, args.per_datagram, None, args.prechecked)  # warm-up (identity: goes inline)
            results, workers = [], []
            for _ in range(args.rounds):
                before = _workers_cpu()
                results.append(await measure(service, args.model, args.requests, args.per_datagram, None,
                                                   args.prechecked))
                workers.append((_workers_cpu() - before) * 1e6 / args.requests)
            print("host CPU µs per request: " + " ".join(f"{r:.2f}" for r in results)
                  + f"  median {statistics.median(results):.2f}")
            if args.model == "add_sub":
                print("worker CPU µs per request: " + " ".join(f"{w:.2f}" for w in workers)
                      + f"  median {statistics.median(workers):.2f}")
            if args.profile:
                profile = cProfile.Profile()
                await measure(service, args.model, args.requests, args.per_datagram, profile, args.prechecked)
                profile.dump_stats(args.profile)
                # Deterministic where the µs are noisy: Python calls per request (this file's own included).
                print(f"Python calls per request: {pstats.Stats(profile).total_calls / args.requests:.1f}")
        finally:
            server.repository.unload_all()


def main() -> int:
    assert ARGS is not None
    print(f"{ARGS.model}, {ARGS.per_datagram} per datagram, tree {ROOT} (pid {os.getpid()})", flush=True)
    import uvloop

    uvloop.run(main_async(ARGS))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
