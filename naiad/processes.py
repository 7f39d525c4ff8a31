"""``naiad serve --frontend-processes N``: this process is the model host (repository, schedulers, backends,
statistics, the metrics port) and N front-end processes serve the HTTP, gRPC and SageMaker ports, calling the
host through ``service.remote`` over a shared-memory channel (``service.hosting`` is the host's end). The host
binds each port once, before any front end starts (Triton's line when one is taken), and the front ends accept
from the listening sockets they inherit; grpcio's front ends bind the gRPC port themselves with SO_REUSEPORT, the
host holding it with a guard (naiad/frontends/ports.py).

Faults: a front end that dies (kill -9) loses its own connections; what it had in flight at the host is
cancelled (its calls, a load, run on) and it is started again; front ends that die together start together. A front
end beats every ``BEAT_SECONDS``: one heard from by nothing for ``STOPPED_SECONDS`` (stopped, its loop stuck) is
killed and started again. A host that dies takes the front ends with it (their channel closes; the first
says so). SIGTERM drains every process: the front ends stop accepting and finish what they have in flight while
the host still serves, then the host drains and finalizes as one process would.

Run as ``python -m naiad.processes INDEX FD COUNTS_FD`` by the host: the options, and which inherited descriptors
are which port's listening sockets, come pickled on stdin.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import os
import pickle
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import naiad
from naiad.frontends import ports, serving
from naiad.frontends.shared_counts import Counts, SharedGate, entries_for
from naiad.server import Process, Server, ServerOptions, run_process
from naiad.service import wire
from naiad.service.hosting import Link
from naiad.service.remote import RemoteService, lost_host

log = logging.getLogger("naiad")

WATCH_SECONDS = 0.2  # how often the host looks at its front ends (exits, silences)
# A front end heard from by nothing for this long (it beats every 0.25 s) is stopped or stuck: killed and restarted.
# Long enough for a front end's loop held by one large request's decoding or encoding.
STOPPED_SECONDS = 4.0
START_SECONDS = 60.0  # ... or, before it says it listens, for this long


def host(options: ServerOptions, count: int) -> Server:
    """The model host: a server whose ports ``count`` front-end processes serve."""
    return Server(options, lambda server: FrontendProcesses(server, count))


class FrontendProcesses:
    """The model host's front ends (a ``server.Frontends`` part): it binds the ports, starts the processes that
    serve them, restarts one that exits, and stops them with the server."""

    def __init__(self, server: Server, count: int) -> None:
        self.server = server
        self.options = server.options
        self.service = server.service
        self.repository = server.repository
        self.count = count
        self.links: list[Link | None] = [None] * count
        self.procs: list[subprocess.Popen | None] = [None] * count
        self._stopping = False
        self._watcher: asyncio.Task | None = None
        self._restarts: dict[int, asyncio.Task] = {}  # front ends being started again, by index
        self._views: tuple = ()
        self._change_due = False  # a repository event's push to the front ends is on its way
        self._announced = False
        self.counts: Counts | None = None
        self.ports: dict[str, ports.Port] = {}  # bound here, served by the front ends

    async def open(self) -> None:
        # Each port's connections counted across the front ends, its caps as one process would set them.
        self.counts = Counts.create(self.count, {name: entries_for(gate)
                                                 for name, gate in serving.admission(self.options).items()})
        # Every port bound here first, in one process's order: a taken one ends the start with Triton's line
        # before any front end starts.
        self.ports = serving.bind(self.options, self.count)
        await self.server.open_metrics()  # the host's own port, open before any front end answers ready
        if self.service.failure is None:
            # Accepting before the front ends listen (the first may take requests before the last starts); live,
            # and so ready, once they all do.
            self.service.accepting = True
        await asyncio.gather(*(self._spawn(index) for index in range(self.count)))
        log.info("%d front-end processes: %s", self.count, " ".join(str(p.pid) for p in self.procs if p))
        loop = asyncio.get_running_loop()
        self._views = self._view_ids()
        self.repository.events.listen(lambda kind, name: self._repository_changed(loop))
        self._watcher = loop.create_task(self._watch())

    async def _spawn(self, index: int) -> None:
        loop = asyncio.get_running_loop()
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        env = dict(os.environ)
        root = str(Path(naiad.__file__).parent.parent)
        env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        assert self.counts is not None
        fds = [child.fileno(), self.counts.fd]
        # The listening sockets it serves from (a guard is the host's alone).
        served = {name: [sock.fileno() for sock in port.sockets] for name, port in self.ports.items() if not port.guard}
        proc = subprocess.Popen([sys.executable, "-m", "naiad.processes", str(index), *map(str, fds)],
                                pass_fds=fds + [fd for listed in served.values() for fd in listed],
                                stdin=subprocess.PIPE, env=env)
        child.close()
        assert proc.stdin is not None
        # The options as the front end needs them: its logging is its own (a LogSettings holds open handlers).
        proc.stdin.write(pickle.dumps((dataclasses.replace(self.options, log_settings=None),
                                       self.service.log_settings.as_dict(), served)))
        proc.stdin.close()
        link = Link(self.service, parent, self._lost, self._changed, self._unregistered, self._live_links)
        link.on_ready = self._announce
        link.attach(loop)
        self.links[index], self.procs[index] = link, proc
        while not link.ready.is_set():
            if proc.poll() is not None:
                link.close()
                raise SystemExit(f"error: front-end process {index} failed to start (exit code {proc.returncode})")
            self._judge(index, proc, loop.time(), False)  # (one stopped while it starts would be waited for forever)
            try:
                await asyncio.wait_for(link.ready.wait(), WATCH_SECONDS)
            except asyncio.TimeoutError:
                pass

    def _announce(self) -> None:
        """Once, as the first front end says it listens: before any request it took is read here."""
        if self._announced:
            return
        self._announced = True
        serving.announce(self.options)

    def _lost(self, link: Link) -> None:
        """A front end's channel closed: the watcher restarts the process once it has exited."""
        for index, known in enumerate(self.links):
            proc = self.procs[index]
            # (A front end that fails to start closes its channel before it says why: let it.)
            if known is link and link.ready.is_set() and proc is not None and proc.poll() is None \
                    and not self._stopping:
                proc.kill()  # a front end without its channel can serve nothing

    def _changed(self) -> None:
        self._views = self._view_ids()
        for link in self.links:
            if link is not None:
                link.invalidate()

    def _live_links(self) -> list[Link]:
        return [link for link in self.links if link is not None and not link.closed]

    def _unregistered(self, names: list[str] | None) -> None:
        for link in self.links:
            if link is not None:
                link.send((wire.SHM, names))

    def _view_ids(self) -> tuple:
        """Which view each loaded version has: a new one means the front ends' kept views are stale."""
        return tuple((name, version, id(model.view)) for name, entry in self.repository.models.items()
                     for version, model in entry.versions.items())

    def _repository_changed(self, loop: asyncio.AbstractEventLoop) -> None:
        """A repository event (on a load thread, maybe): the front ends hear of it once the loop's turn comes, one
        push for a burst of events."""
        if self._change_due:
            return
        self._change_due = True
        try:
            loop.call_soon_threadsafe(self._push_views)
        except RuntimeError:  # the loop has closed: nothing to tell
            self._change_due = False

    def _push_views(self) -> None:
        self._change_due = False
        if self._stopping:
            return  # (the models are finalized as the front ends exit: nothing to tell them)
        if self._view_ids() != self._views:  # (a load's answer may have told them already)
            self._changed()

    async def _watch(self) -> None:
        loop = asyncio.get_running_loop()
        last = loop.time()
        while not self._stopping:
            await asyncio.sleep(WATCH_SECONDS)
            # A host held past its round (a stall, SIGSTOP) heard nothing meanwhile either: no front end is judged
            # by a silence that was the host's.
            now = loop.time()
            held, last = now - last > WATCH_SECONDS + 1.0, now
            for index, proc in enumerate(self.procs):
                if proc is None or self._stopping or index in self._restarts:
                    continue
                if proc.poll() is None:
                    self._judge(index, proc, now, held)
                    continue
                code = proc.returncode
                log.warning("front-end process %d (pid %d) exited (%s); starting it again", index, proc.pid,
                            f"signal {-code}" if code < 0 else f"exit code {code}")
                link = self.links[index]
                if link is not None:
                    link.lost()
                self.procs[index] = None
                if self.counts is not None:
                    self.counts.clear(index)  # the connections it held closed with it
                # Each in its own task: front ends that died together start together, and this round goes on.
                self._restarts[index] = loop.create_task(self._restart(index))

    def _judge(self, index: int, proc: subprocess.Popen, now: float, held: bool) -> None:
        """A running front end that has said nothing for ``STOPPED_SECONDS`` (it beats every ``BEAT_SECONDS``) is
        stopped or stuck: it serves nobody, and a stopped one's share of gRPC's connections (SO_REUSEPORT) waits for
        it. Killed, it is started again like any that exits. One starting has ``START_SECONDS`` (its imports, and
        its ports' opening, may hold its loop for seconds on a busy host)."""
        link = self.links[index]
        if link is None or link.closed:
            return
        if held:
            link.heard = now
            return
        silent = now - link.heard
        if silent > (STOPPED_SECONDS if link.ready.is_set() else START_SECONDS):
            log.warning("front-end process %d (pid %d) has not been heard from for %.1f s (stopped or stuck%s); "
                        "killing it", index, proc.pid, silent, "" if link.ready.is_set() else ", starting")
            proc.kill()

    async def _restart(self, index: int) -> None:
        try:
            await self._spawn(index)
            proc = self.procs[index]
            log.info("front-end process %d (pid %d) started again", index, proc.pid if proc else 0)
        except SystemExit as exc:
            log.error("%s", exc.code)
            await asyncio.sleep(1.0)  # and the next round tries again (it finds the process exited)
        finally:
            del self._restarts[index]

    async def quiesce(self, drain: bool, until: float | None) -> None:
        """The front ends drain as one process would: they stop taking requests and finish what they have in
        flight, which the host still serves (it keeps accepting from them until they have exited, so nothing a
        front end took before its SIGTERM is refused here); what is left at the drain's end is cut by the host
        and comes back to them as UNAVAILABLE. The models are finalized within the exit timeout's last tenth,
        as with one process, while the front ends write what was cut and exit."""
        self._stopping = True
        if self._watcher is not None:
            self._watcher.cancel()
        for task in list(self._restarts.values()):
            task.cancel()
        for proc in self.procs:
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGTERM if drain else signal.SIGKILL)
        # The ports close once the front ends close their copies too (they accept until their drain ends, as one
        # process does); nothing restarts one now.
        for port in self.ports.values():
            port.close()
        if until is not None:
            await self.drain_frontends(until)

    def _running(self) -> bool:
        return any(p is not None and p.poll() is None for p in self.procs)

    async def drain_frontends(self, until: float) -> None:
        while self._running() and time.monotonic() < until:
            await asyncio.sleep(0.02)

    async def close(self, deadline: float | None, cut: int) -> None:
        pass  # (they close their own ports; waiting for them here would eat finalize()'s share of the timeout)

    async def end(self, deadline: float | None) -> None:
        procs = [p for p in self.procs if p is not None]
        # They wrote what was cut when the drain ended (the timeout's last tenth before the deadline), and exit
        # as soon as they have; one still running at the deadline is killed there.
        end = deadline if deadline is not None else time.monotonic() + 5.0
        while any(p.poll() is None for p in procs) and time.monotonic() < end:
            await asyncio.sleep(0.02)
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        for link in self.links:
            if link is not None:
                link.close()


class Frontend(Process):
    """One front-end process: the ports, over the host's face."""

    def __init__(self, options: ServerOptions, index: int, sock: socket.socket,
                 logs: dict[str, Any], counts: Counts, served: dict[str, ports.Port]) -> None:
        options.grpc.reuse_port = True  # grpcio binds the port itself, beside its siblings and the host's guard
        self.options = options
        self.served = served  # the host's listening sockets, inherited
        self.index = index
        self.remote = RemoteService(sock, lost_host(index))
        self.ports = serving.Ports(options, self.remote)
        self._stopping = asyncio.Event()
        self.logs = logs
        self.counts = counts

    async def start(self) -> None:
        self.remote.attach(asyncio.get_running_loop())
        gates = {name: SharedGate(gate, self.counts, name, self.index)
                 for name, gate in serving.admission(self.options).items()}
        await self.ports.open(self.served, gates)
        # Logging as the host's from now on (its start-up lines are the host's to write).
        logs = self.logs
        self.remote.log_settings.configure(logs["log_info"], logs["log_warning"], logs["log_error"],
                                           logs["log_verbose_level"], logs["log_format"], logs["log_file"])
        self.remote.send((wire.READY,))

    async def stop(self, drain: bool = True) -> None:
        if drain:
            await self.remote.drain(self.options.exit_timeout_secs)
        await asyncio.sleep(0.05)  # the answers that ended the drain are written before the connections close
        await self.ports.close(time.monotonic() + serving.STOP_GRACE)  # (gRPC calls still open: that long to end)
        await asyncio.sleep(0.05)  # and what the connections hold before the process exits
        self.remote.close()


def main(argv: list[str]) -> int:
    index, fd, counts = int(argv[0]), int(argv[1]), int(argv[2])
    options, logs, served = pickle.load(sys.stdin.buffer)
    logging.basicConfig(level=logging.WARNING, format=f"front end {index}: %(message)s")
    sock = socket.socket(fileno=fd)
    shared = Counts(counts)
    # The host's listening sockets, each accepted from by every front end; one ahead of its share of a port's
    # connections leaves the next to the others a moment (naiad/frontends/acceptor.py).
    ports_served = {name: ports.Port([socket.socket(fileno=listening) for listening in fds], shared=True,
                                     ahead=functools.partial(shared.ahead, name, index))
                    for name, fds in served.items()}
    return run_process(lambda: Frontend(options, index, sock, logs, shared, ports_served).run())


if __name__ == "__main__":
    code = main(sys.argv[1:])
    # A front end holds nothing the interpreter's teardown would release (the kernel closes its descriptors and
    # memfds): it exits as soon as it has stopped, as multiprocessing's children do, not ~1 s later.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
