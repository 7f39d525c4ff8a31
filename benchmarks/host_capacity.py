#!/usr/bin/env python3
"""The model host's capacity: its CPU time per small request while it is the bottleneck.

``multicore.py`` measures the host behind real front-end processes and clients; on 2 cores those leave the host
idle most of the time, so each of its wakes carries the cost of waking a halted core and of a cold cache, spread
over the few requests that woke it. A host that front ends on many cores keep busy never halts. This script
measures that host: the real model host (``Service`` behind ``hosting.Link``, on uvloop, in this process) with its
own core, fed over its real channels by driver processes on the other cores. A driver is the cheapest possible
front end: it keeps ``--window`` requests in flight, pre-packed (one item per request), and sends one for each
answer. The host then reads whatever waits on its channels each turn, as it would behind many busy front ends.
Where the tree's front ends check requests against the model's signature (``service/precheck.py``), the driver's
requests come checked too, as theirs do.

It prints requests/s, how busy the host was (its CPU seconds per second: near 1.0 means saturated, so req/s is
its capacity) and the host's CPU µs per request (all its threads, user and system; the Python backend's worker
is another process and not counted, as in multicore.py).

    python benchmarks/host_capacity.py [--models identity,add_sub] [--drivers 2] [--window 64] [--seconds 5]
                                       [--rounds 1] [--root TREE ...] [--warm-host]

With several ``--root`` trees each round measures every tree in turn (A/B on the same noisy box).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

INPUTS = {  # one item per request, as multicore.py sends (add_sub's config has no batch dimension)
    "identity": [("INPUT0", (1, 16))],
    "add_sub": [("INPUT0", (4,)), ("INPUT1", (4,))],
}


def drive(fd: int, model: str, window: int) -> None:
    """A driver: ``window`` requests in flight on the host's channel until the host closes it."""
    import numpy as np

    from naiad.backends.python.shm import Arena
    from naiad.backends.python.transport import Channel
    from naiad.service import wire

    channel = Channel(socket.socket(fileno=fd), Arena(), blocking=True)
    arrays = {name: np.arange(np.prod(shape), dtype=np.float32).reshape(shape) for name, shape in INPUTS[model]}
    records = [channel.pack(name, array) for name, array in arrays.items()]
    next_id = 0
    checked: dict[str, int] = {}
    if "checked" in wire.Request._fields:  # this tree's front ends check requests: as they do, against the view
        from naiad.core.request import InferRequest
        from naiad.service.precheck import Precheck

        channel.send((wire.CALL, 0, "model", (model, "")))
        reply = None
        while reply is None:
            reply = next((m for m in channel.receive(wait=True) if m[0] == wire.REPLY), None)
        _, number, config = reply[3]
        request = InferRequest(model, "", "", dict(arrays))
        checked = {"checked": Precheck(number, config).run(request), "batch_size": request.batch_size}
        assert checked["checked"], "the driver's requests fail the model's signature"

    def requests(count: int) -> list[tuple]:
        nonlocal next_id
        out = []
        for _ in range(count):
            next_id += 1
            out.append(tuple(wire.Request(kind=wire.INFER, id=next_id, model_name=model, model_version="",
                                          request_id="", inputs=records, requested_outputs=None, parameters={},
                                          correlation_id=0, flags=0, priority=0, timeout_us=0, raw_input=None,
                                          **checked)))
        return out

    try:
        for start in range(0, window, 8):
            channel.send_many(requests(min(8, window - start)))
        while True:
            answered = 0
            for message in channel.receive(wait=True):
                if message[0] == wire.RESULT:
                    if message[7] is not None:
                        raise SystemExit(f"the host refused a request: {message[7]}")
                    answered += 1
            if answered:
                channel.send_many(requests(answered))
    except (EOFError, OSError):
        return


async def host(tree: Path, model: str, drivers: int, window: int, seconds: float, repo: Path) -> dict[str, float]:
    from naiad.server import Server, ServerOptions
    from naiad.service.hosting import Link

    cpus = sorted(os.sched_getaffinity(0))
    mine, others = {cpus[-1]}, set(cpus[:-1]) or {cpus[-1]}
    server = Server(ServerOptions(model_repositories=[repo], model_control_mode="explicit",
                                  load_models=[model]))
    await server._load_models()
    service = server.service
    service.live = service.accepting = True
    loop = asyncio.get_running_loop()
    links: list[Link] = []
    procs = []
    try:
        import psutil

        me = psutil.Process()
        for child in me.children(recursive=True):  # the Python backend's worker: with the drivers
            os.sched_setaffinity(child.pid, others)
        for thread in me.threads():
            os.sched_setaffinity(thread.id, mine)
        for _ in range(drivers):
            host_end, driver_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            link = Link(service, host_end, lambda _: None, lambda: None, lambda _: None, lambda: links)
            link.attach(loop)
            links.append(link)
            procs.append(subprocess.Popen(  # noqa: ASYNC220 - before any request: nothing waits on the loop
                ["taskset", "-c", ",".join(map(str, sorted(others))), sys.executable, str(Path(__file__).resolve()),
                 "--drive", str(driver_end.fileno()), "--models", model, "--window", str(window), "--root", str(tree)],
                pass_fds=[driver_end.fileno()], env={**os.environ, "PYTHONPATH": str(tree)}))
            driver_end.close()
        version = server.repository.get(model, "")
        await asyncio.sleep(1.5)  # warm-up: drivers started, the instance gone inline

        def sample() -> tuple[int, float, float]:
            usage = resource.getrusage(resource.RUSAGE_SELF)
            return version.stats.success.count, time.monotonic(), usage.ru_utime + usage.ru_stime

        before = sample()
        await asyncio.sleep(seconds)
        after = sample()
        requests = max(after[0] - before[0], 1)
        wall = after[1] - before[1]
        cpu = after[2] - before[2]
        return {"rps": requests / wall, "busy": cpu / wall, "host_us": cpu * 1e6 / requests}
    finally:
        for link in links:
            link.close()
        for proc in procs:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
        server.repository.unload_all()


def measure(tree: Path, model: str, drivers: int, window: int, seconds: float, repo: Path,
            warm: bool = False) -> dict[str, float]:
    """One measurement in a fresh process running ``tree``'s code; ``warm``: with multicore.py's idle-priority
    spinner on the host's core, which keeps that core from halting while the host waits."""
    spinner = None
    if warm:
        spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        os.sched_setaffinity(spinner.pid, {max(os.sched_getaffinity(0))})
        os.sched_setscheduler(spinner.pid, os.SCHED_IDLE, os.sched_param(0))
    try:
        out = subprocess.run(
            [sys.executable, str(Path(__file__).resolve()), "--host", "--models", model, "--drivers", str(drivers),
             "--window", str(window), "--seconds", str(seconds), "--repo", str(repo), "--root", str(tree)],
            check=False, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(tree)}, cwd=tree)
    finally:
        if spinner is not None:
            spinner.kill()
            spinner.wait()
    if out.returncode:
        raise SystemExit(f"the host failed:\n{out.stderr[-3000:]}")
    rps, busy, host_us = map(float, out.stdout.split()[-3:])
    return {"rps": rps, "busy": busy, "host_us": host_us}


def repository(into: Path) -> Path:
    sys.path.insert(0, str(ROOT))
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from multicore import repository as build

    return build(into)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="identity,add_sub")
    parser.add_argument("--drivers", type=int, default=2)
    parser.add_argument("--window", type=int, default=64, help="requests in flight per driver")
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--root", action="append", type=Path, help="a naiad tree to measure (repeatable)")
    parser.add_argument("--warm-host", action="store_true",
                        help="an idle-priority spinner on the host's core (a host that is not saturated, as add_sub's "
                             "on 2 cores, then pays no halted core's wake-ups)")
    parser.add_argument("--repo", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--host", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--drive", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    trees = [t.resolve() for t in args.root] if args.root else [ROOT]
    if args.drive is not None:
        sys.path.insert(0, str(trees[0]))
        drive(args.drive, args.models, args.window)
        return 0
    if args.host:
        sys.path.insert(0, str(trees[0]))
        import uvloop

        row = uvloop.run(host(trees[0], args.models, args.drivers, args.window, args.seconds, args.repo))
        print(f"{row['rps']:.1f} {row['busy']:.3f} {row['host_us']:.2f}")
        return 0
    label = len(trees) > 1
    print(f"{'tree ' * label}{'model':9} {'req/s':>8} {'host busy':>9} {'host µs':>8}   (the host saturated when "
          "busy is near 1.0: req/s is then its capacity)", flush=True)
    with tempfile.TemporaryDirectory(prefix="naiad-capacity-") as tmp:
        repo = repository(Path(tmp))
        for _ in range(args.rounds):
            for model in args.models.split(","):
                for index, tree in enumerate(trees):
                    row = measure(tree, model, args.drivers, args.window, args.seconds, repo, args.warm_host)
                    print(f"{'AB'[index] if index < 2 else index:4} " * label
                          + f"{model:9} {row['rps']:>8,.0f} {row['busy']:>9.2f} {row['host_us']:>8.1f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
