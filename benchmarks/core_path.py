"""The model host's CPU time per small request, in process: no front end, no server, no other process.

A ``Service`` on an ONNX FP32 [-1,16] identity (onnxruntime, run inline on the loop) answers requests that come
through the host's own ``hosting.Link`` over a socketpair, 8 per datagram, as a front-end process sends them. The
front end's side (packing, sending, reading the answers) runs in this thread too; its CPU time is measured
apart and taken out, so the figure is what the host spends: decoding, ``Service.infer``, scheduling, the model's
run, statistics, answering.

    python benchmarks/core_path.py [--requests 20000] [--rounds 5] [--profile out.prof] [--prechecked]

``--prechecked``: requests come checked against the model's signature, as front-end processes send them (the
host skips its own check).

Use it to compare one tree against another (run it in each); ``multicore.py`` measures the same thing with real
front-end processes and clients.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import pstats
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from naiad.backends.python.shm import Arena  # noqa: E402
from naiad.backends.python.transport import Channel  # noqa: E402
from naiad.server import Server, ServerOptions  # noqa: E402
from naiad.service import wire  # noqa: E402
from naiad.service.hosting import Link  # noqa: E402
from tests.onnx_graphs import identity  # noqa: E402

from multicore import IDENTITY_CONFIG as CONFIG  # noqa: E402 - a sibling script: the same model


PER_DATAGRAM = 8


async def measure(service: object, count: int, profile: cProfile.Profile | None, prechecked: bool = False) -> float:
    """Host CPU µs per request over ``count`` requests."""
    host_end, front_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    link = Link(service, host_end, lambda _: None, lambda: None, lambda _: None, lambda: [link])  # type: ignore[arg-type]
    loop = asyncio.get_running_loop()
    link.attach(loop)
    front = Channel(front_end, Arena())
    readable = asyncio.Event()
    loop.add_reader(front_end.fileno(), readable.set)
    record = front.pack("INPUT0", np.arange(16, dtype=np.float32).reshape(1, 16))
    checked = batch_size = 0
    if prechecked:  # the number the host gives the version with its view, as a front end asks for it
        front.send((wire.CALL, 1, "model", ("identity", "")))
        while not checked:
            await readable.wait()
            readable.clear()
            checked = next((m[3][1] for m in front.receive() if m[0] == wire.REPLY), 0)
        batch_size = 1
    front_ns = 0
    answered = 0
    next_id = 0
    started = time.thread_time_ns()
    if profile is not None:
        profile.enable()
    while answered < count:
        t0 = time.thread_time_ns()
        batch = []
        for _ in range(PER_DATAGRAM):
            next_id += 1
            batch.append((wire.INFER, next_id, "identity", "", "", [record], None, {}, 0, 0, 0, 0, None,
                          checked, batch_size))
        front.send_many(batch)
        front_ns += time.thread_time_ns() - t0
        got = 0
        while got < PER_DATAGRAM:
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


async def main_async(args: argparse.Namespace) -> None:
    import onnx

    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp)
        (repo / "identity" / "1").mkdir(parents=True)
        (repo / "identity" / "config.pbtxt").write_text(CONFIG)
        onnx.save(identity("TYPE_FP32", ["batch", 16]), str(repo / "identity" / "1" / "model.onnx"))
        server = Server(ServerOptions(model_repositories=[repo]))
        await server._load_models()
        service = server.service
        service.live = service.accepting = True
        try:
            await measure(service, 2000, None, args.prechecked)  # warm-up: the instance goes inline
            results = []
            for _ in range(args.rounds):
                results.append(await measure(service, args.requests, None, args.prechecked))
            print("host CPU µs per request: " + " ".join(f"{r:.2f}" for r in results)
                  + f"  median {statistics.median(results):.2f}")
            if args.profile:
                profile = cProfile.Profile()
                await measure(service, args.requests, profile, args.prechecked)
                profile.dump_stats(args.profile)
                # Deterministic where the µs are noisy: Python calls per request (this file's own included).
                print(f"Python calls per request: {pstats.Stats(profile).total_calls / args.requests:.1f}")
        finally:
            server.repository.unload_all()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--profile", help="write a cProfile of one more round here")
    parser.add_argument("--prechecked", action="store_true", help="requests checked by their front end")
    args = parser.parse_args()
    import uvloop

    uvloop.run(main_async(args))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
