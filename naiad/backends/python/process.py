"""One model instance's worker process, from the server's side: spawn it, shake hands, wait for its
``initialize``, notice when it dies and start a new one, stop it. What travels over its channel once it
runs is ``router.py``'s business; this module hands the router each new channel.

The worker dies with the server (it sets PR_SET_PDEATHSIG on itself, see worker.py), and its channel
shows a crash at once (the socket closes), so no health polling is needed.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, NoReturn

from naiad.backends import faults
from naiad.backends.base import Core, Execution
from naiad.backends.python import messages as M
from naiad.backends.python.messages import Kind
from naiad.backends.python.router import Done, Router
from naiad.backends.python.shm import Arena
from naiad.backends.python.transport import Channel
from naiad.core import readiness
from naiad.core.errors import Code, InferError, internal, unavailable
from naiad.core.request import InferRequest

log = logging.getLogger("naiad.python")

# The folder that holds the ``naiad`` package: workers import it from there, whatever their interpreter.
NAIAD_ROOT = str(Path(__file__).resolve().parents[3])
# Seconds a worker that found its device poisoned has to exit by itself before it is killed.
_EXIT_GRACE = 2.0


@dataclass
class WorkerSpec:
    """What it takes to start one instance's worker."""

    model_name: str
    model_version: int
    instance_name: str
    model_file: str
    args: dict[str, str]
    decoupled: bool
    output_names: list[str]
    shm_default: int
    shm_growth: int
    restart_wait: float = 5.0  # seconds an execution waits for a restarting worker before it fails
    python: str = sys.executable
    env: dict[str, str] = field(default_factory=dict)  # extra environment (execution environments)
    python_path: list[str] = field(default_factory=lambda: [NAIAD_ROOT])
    load_timeout: float = 0.0  # --model-load-timeout-secs: a restart's initialize() gets as long (0: forever)
    iterative: bool = False  # sequence_batching.iterative_sequence: the worker reports rescheduled requests


def _describe_exit(code: int | None) -> str:
    if code is None:
        return "closed its channel"
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


class WorkerProcess:
    """One model instance in its own process. ``execute`` returns a future of the ``Execution``."""

    def __init__(self, spec: WorkerSpec, core: Core | None) -> None:
        self.spec = spec
        self.name = spec.instance_name
        self.decoupled = spec.decoupled
        self.is_async = False
        self.closing = False
        self.proc: subprocess.Popen | None = None
        self.ch: Channel | None = None
        self.codec = M.MARSHAL  # what the channel speaks once the worker said hello
        self.router = Router(spec.instance_name, spec.model_name, spec.model_version, spec.decoupled, core,
                             self._died, self._submit_when_ready)
        self.router.poisoned = self._poisoned
        self._restarted: asyncio.Future | None = None
        self._restarting = False
        self.restarts = 0
        self.sticky_restarts = 0  # restarts after a sticky device error (faults.py), of ``restarts``
        self._cause: str | None = None  # the sticky error of a worker that is exiting because of it
        self._finalize_sent: bool | None = None  # None: finalize not asked for yet
        self._progress = -1  # a memfd holding the tag of the last execution the worker began (see worker.py)

    @property
    def loop(self) -> asyncio.AbstractEventLoop | None:
        return self.router.loop

    @property
    def ready(self) -> bool:
        """The worker has initialized and takes executions (the router holds the flag: it checks it per submit)."""
        return self.router.ready

    @ready.setter
    def ready(self, value: bool) -> None:
        if value != self.router.ready:
            self.router.ready = value
            readiness.changed()

    # --- start -------------------------------------------------------------------------------------------------

    def start(self) -> None:
        """Spawn the process and send its setup; ``wait_ready`` finishes the handshake."""
        spec = self.spec
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        env = {**os.environ, **spec.env}
        env["PYTHONPATH"] = os.pathsep.join(spec.python_path + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
        self._close_progress()
        self._progress = _progress_word()
        try:
            self.proc = subprocess.Popen(
                [spec.python, "-m", "naiad.backends.python.worker", str(child.fileno()), str(os.getpid())],
                pass_fds=(child.fileno(),) + ((self._progress,) if self._progress >= 0 else ()), env=env,
                cwd=str(Path(spec.model_file).parent),
                # Its own session: Ctrl-C in the terminal and a signal to the server's process group reach the
                # server only, which drives the worker's end (finalize, then exit); PR_SET_PDEATHSIG (worker.py)
                # ends it if the server dies.
                start_new_session=True,
            )
        except OSError as exc:
            parent.close()
            raise internal(f"failed to start the worker process for '{self.name}' with {spec.python}: {exc}") from None
        finally:
            child.close()
        setup = {
            "model_name": spec.model_name, "model_version": spec.model_version, "instance_name": spec.instance_name,
            "model_file": spec.model_file, "args": spec.args, "decoupled": spec.decoupled,
            "output_names": spec.output_names, "shm_default": spec.shm_default, "shm_growth": spec.shm_growth,
            "iterative": spec.iterative,
        }
        if self._progress >= 0:
            setup["progress_fd"] = self._progress  # (pass_fds keeps the number)
        # The setup goes first, on the bare socket and in JSON: any interpreter reads it, and the worker builds
        # its channel from it.
        parent.send(M.encode_init(setup, M.local_versions()))
        try:
            self.ch = Channel(parent, Arena(spec.shm_default, spec.shm_growth), self.router.on_blocked)
        except InferError:
            parent.close()
            self._kill()
            raise
        self.router.bind(self.ch)

    def wait_ready(self, deadline: float | None = None) -> None:
        """Block until the worker has run ``initialize``; raises its failure (or a failed handshake). Past
        ``deadline`` (time.monotonic()) the worker is killed and the load fails."""
        ch, proc = self.ch, self.proc
        assert ch is not None and proc is not None
        self._handshake(ch, deadline)
        while True:
            if not ch.wait_readable(_until(deadline, 0.5)) and _passed(deadline):
                self._timed_out("its initialize() did not return")
            try:
                messages = ch.receive()
            except EOFError:
                self._lost("during initialization")
            for message in messages:
                kind = message[0]
                if kind == Kind.READY:
                    self.is_async = bool(M.Ready.of(message).is_async)  # type: ignore[attr-defined]
                    self.ready = True
                    return
                if kind == Kind.FAIL:
                    fail = M.Fail.of(message)  # type: ignore[attr-defined]
                    proc.wait()
                    ch.close()
                    raise InferError(fail.message, Code[fail.code])
                self.router.handle(message)  # log lines and metric registrations from initialize()

    def _handshake(self, ch: Channel, deadline: float | None) -> None:
        """Read the worker's HELLO and switch the channel to the codec both ends then use."""
        while not ch.wait_readable(_until(deadline, None)):
            if _passed(deadline):
                self._timed_out("it did not start")
        data = ch.receive_raw()
        if not data:
            self._lost("before its handshake")
        server = M.local_versions()
        try:
            hello = M.decode_hello(data)
            codec = M.choose_codec(server, hello.versions)
        except M.ProtocolMismatch as exc:
            self._kill()
            ch.close()
            raise internal(f"Received unexpected response from Python backend stub: {self.name} ({exc}; the worker "
                           f"must run the server's own naiad package)") from None
        if codec.name != hello.codec:
            self._kill()
            ch.close()
            raise internal(f"Received unexpected response from Python backend stub: {self.name} (it chose the "
                           f"{hello.codec} encoding, the server {codec.name})")
        if codec is not M.MARSHAL:
            log.info("model instance '%s' runs on %s, the server on %s: its channel uses %s instead of marshal",
                     self.name, M.describe(hello.versions), M.describe(server), codec.name.replace("-", " protocol "))
        self.codec = codec
        ch.use(codec)

    def _lost(self, when: str) -> NoReturn:
        """The worker went away before it was ready: raise why."""
        assert self.proc is not None and self.ch is not None
        code = self.proc.wait()
        self.ch.close()
        raise internal(f"the worker process of '{self.name}' {_describe_exit(code)} {when}")

    def _timed_out(self, what: str) -> NoReturn:
        assert self.proc is not None and self.ch is not None
        pid = self.proc.pid
        self.ready = False
        self._kill()
        self.ch.close()
        raise internal(f"model instance '{self.name}' did not become ready within {self.spec.load_timeout:g} s "
                       f"(--model-load-timeout-secs): {what}; its worker process (pid {pid}) was killed")

    def abort(self) -> None:
        """End a worker that never became ready: no finalize() to wait for, since initialize() never returned."""
        self.closing = True
        self.ready = False
        self._kill()
        if self.ch is not None:
            self.ch.close()

    def _kill(self) -> None:
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.kill()
            self.proc.wait()

    def attach(self, loop: asyncio.AbstractEventLoop) -> None:
        self.router.attach(loop)

    # --- executions --------------------------------------------------------------------------------------------

    def execute(self, requests: list[InferRequest]) -> Any:
        """A future of the ``Execution`` (for callers outside a scheduler; schedulers use ``submit``)."""
        future = asyncio.get_running_loop().create_future()
        self.submit(requests, partial(_settle, future))
        return future

    def submit(self, requests: list[InferRequest], done: Done) -> None:
        """Run ``requests`` and call ``done(Execution)`` once, from the event loop (until the worker is ready,
        or while it restarts, they wait for it). Schedulers may call ``router.submit`` directly: the same."""
        self.router.submit(requests, done)

    def cancel(self, request: InferRequest) -> bool:
        return self.router.cancel(request)

    def _submit_when_ready(self, requests: list[InferRequest], done: Done) -> None:
        task = asyncio.ensure_future(self._execute_when_ready(requests))

        def finished(task: asyncio.Future) -> None:
            if task.cancelled() or task.exception() is not None:
                why = "was cancelled" if task.cancelled() else f"failed: {task.exception()!r}"
                error = internal(f"execution on instance '{self.name}' {why}")
                done(Execution([self.router.error(r, error) for r in requests], failed=True))
            else:
                done(task.result())

        task.add_done_callback(finished)

    async def _execute_when_ready(self, requests: list[InferRequest]) -> Execution:
        """The worker is restarting: wait for it (at most ``restart_wait`` seconds, or the requests' own
        timeout if that is sooner), then run."""
        if self.closing:
            error = internal(f"model instance '{self.name}' is unloading")
            return Execution([self.router.error(r, error) for r in requests], failed=True)
        if self._restarted is None or self._restarted.done():
            self._restarted = asyncio.get_running_loop().create_future()
            if not self._restarting and self._cause is None:  # (a poisoned worker is restarted once it has exited)
                self._restart()
        wait = _wait_bound(requests, self.spec.restart_wait)
        try:
            ok = await asyncio.wait_for(asyncio.shield(self._restarted), wait)
        except asyncio.TimeoutError:
            error = unavailable(f"Failed to process the request(s) for model instance '{self.name}', message: Stub "
                                f"process '{self.name}' is not healthy and was not restarted within {wait:.3g} s.")
            return Execution([self.router.error(r, error) for r in requests], failed=True)
        if all(r.cancelled for r in requests):  # their clients went away while they waited: nothing to run
            cancelled = InferError("Request was cancelled", Code.CANCELLED)
            return Execution([self.router.error(r, cancelled) for r in requests], failed="CANCELED")
        if not ok or not self.ready:
            error = internal(f"Failed to process the request(s) for model instance '{self.name}', message: Stub "
                             f"process '{self.name}' is not healthy and could not be restarted.")
            return Execution([self.router.error(r, error) for r in requests], failed=True)
        future = asyncio.get_running_loop().create_future()
        self.submit(requests, partial(_settle, future))
        return await future

    # --- stop --------------------------------------------------------------------------------------------------

    def finalize(self) -> bool:
        """Ask the worker, once, to run the model's ``finalize()`` and exit (``stop`` waits for it); False if it
        can't be asked. Sent to every worker before any is waited for, they finalize side by side."""
        if self._finalize_sent is None:
            self.closing = True
            self.ready = False
            ch = self.ch
            if ch is None or self.proc is None:
                return False
            if self._restarting:
                # A replacement still starting: its channel is the starter's until it is ready, and its
                # initialize() hasn't returned, so there is no finalize() to run; stop() kills it.
                self._finalize_sent = False
                return False
            self.router.detach()
            self.router.flush()
            try:
                ch.send(M.finalize())
                self._finalize_sent = True
            except EOFError:
                self._finalize_sent = False
        return self._finalize_sent

    def stop(self, deadline: float | None = None) -> None:
        """``finalize()``, then wait for the process to exit until ``deadline`` (``time.monotonic()``; default 10 s
        from now), and kill it if it has not: a worker still busy in ``execute`` at shutdown's deadline."""
        sent = self.finalize()
        ch, proc = self.ch, self.proc
        if ch is None or proc is None:
            return
        if deadline is None:
            deadline = time.monotonic() + 10.0
        try:
            while sent and proc.poll() is None and (left := deadline - time.monotonic()) > 0:
                if ch.wait_readable(min(0.05, left)):
                    for message in ch.receive():
                        kind = message[0]
                        if kind == Kind.FINALIZED:
                            error = M.Finalized.of(message).error  # type: ignore[attr-defined]
                            if error:
                                log.error("finalize() of '%s' failed: %s", self.name, error)
                        elif kind == Kind.LOG or kind == Kind.METRIC:
                            self.router.handle(message)
        except EOFError:
            pass
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        self.router.fail_pending(f"model instance '{self.name}' was unloaded")
        self._close_progress()
        ch.close()

    # --- crashes -----------------------------------------------------------------------------------------------

    def _died(self) -> None:
        """The worker is gone (crash, kill, os._exit): fail what it held, then start a new one."""
        ch, proc, router = self.ch, self.proc, self.router
        self.ready = False
        # Executions still in the outbox never reached the dead worker: they wait for its replacement.
        unsent = router.take_unsent()
        router.detach()
        code = proc.poll() if proc is not None else None
        if proc is not None and code is None:
            try:
                code = proc.wait(1.0)
            except subprocess.TimeoutExpired:
                proc.kill()
                code = proc.wait()
        how = _describe_exit(code)
        cause, self._cause = self._cause, None
        if cause is not None:
            self.sticky_restarts += 1
            why = faults.notice(self.name, self.spec.model_name, cause)
            log.error("%s in a fresh process (its worker, pid %s, %s; sticky restarts of this instance: %d)", why,
                      proc.pid if proc else "?", how, self.sticky_restarts)
        else:
            why = (f"Failed to process the request(s) for model instance '{self.name}', message: Stub process "
                   f"'{self.name}' is not healthy (its process {how}).")
            log.error("the worker process of model instance '%s' (pid %s) %s; restarting it", self.name,
                      proc.pid if proc else "?", how)
        # What it had begun fails (it may be what killed it); what still waited in its queue was never started,
        # and runs on the replacement, after what never left the outbox.
        queued = router.fail_pending(why, started=self._started())
        self._close_progress()
        if ch is not None:
            ch.close()
        if not self.closing:
            self._restart()
        for pending in queued + unsent:
            if pending.done is not None:
                self._submit_when_ready(pending.requests, pending.done)

    def _poisoned(self, cause: str) -> None:
        """The worker's device is poisoned: it answers the execution that found it, then exits, and ``_died``
        restarts it. Until then it is not ready (the router sends it nothing more); one stuck in the driver is
        killed."""
        self._cause = cause
        self.ready = False
        proc, loop = self.proc, self.loop
        if proc is not None and loop is not None:
            loop.call_later(_EXIT_GRACE, _kill_if_running, proc)

    def _started(self) -> int | None:
        """The tag of the last execution the dead worker began (None: unknown, as if it had begun them all)."""
        if self._progress < 0:
            return None
        try:
            word = os.pread(self._progress, 8, 0)  # not mapped: the worker could have shrunk it
        except OSError:
            return None
        return int.from_bytes(word, sys.byteorder, signed=True) if len(word) == 8 else None

    def _close_progress(self) -> None:
        fd, self._progress = self._progress, -1  # (taken before it is closed: a restart and an unload may race)
        if fd >= 0:
            os.close(fd)

    def _restart(self) -> None:
        if self._restarting or self.closing:
            return
        self._restarting = True
        loop = self.loop or asyncio.get_running_loop()
        if self._restarted is None or self._restarted.done():
            self._restarted = loop.create_future()

        def spawn() -> None:
            self.start()
            timeout = self.spec.load_timeout
            self.wait_ready(time.monotonic() + timeout if timeout else None)

        async def run() -> None:
            ok = False
            delay = 0.1
            for attempt in range(5):
                if self.closing:
                    break
                try:
                    self.ready = False
                    await loop.run_in_executor(None, spawn)
                    if self.closing:  # unloaded, or the server stopping, while it started: not wanted any more
                        self.abort()
                        break
                    self.attach(loop)
                    self.restarts += 1
                    ok = True
                    log.info("restarted the worker process of model instance '%s' (pid %s)", self.name,
                             self.proc.pid if self.proc else "?")
                    break
                except InferError as exc:
                    log.error("restarting model instance '%s' failed (attempt %d): %s", self.name, attempt + 1,
                              exc.message)
                    self.ready = False
                    await asyncio.sleep(delay)
                    delay *= 2
                except (OSError, ValueError):
                    if not self.closing:
                        raise
                    self.abort()  # its channel was closed under it by the unload
                    break
            self._restarting = False
            if self._restarted is not None and not self._restarted.done():
                self._restarted.set_result(ok)

        asyncio.ensure_future(run(), loop=loop)


def _kill_if_running(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()


def _wait_bound(requests: list[InferRequest], default: float) -> float:
    """How long executions may wait for a restart: ``default``, or less when every request has a timeout
    (microseconds from its arrival) that ends sooner."""
    now = time.perf_counter_ns()  # (the clock of ``arrival_ns``)
    bound = 0.0
    for request in requests:
        if not request.timeout_us:
            return default
        bound = max(bound, ((request.arrival_ns or now) + request.timeout_us * 1000 - now) / 1e9)
    return max(0.0, min(default, bound))


def _progress_word() -> int:
    """A memfd of one 64-bit word for a new worker (-1 where memfds don't exist: then a dead worker's whole
    queue fails with it, as if it had begun everything it was sent)."""
    try:
        fd = os.memfd_create("naiad-worker-progress", os.MFD_CLOEXEC)
    except (AttributeError, OSError):
        return -1
    try:
        os.ftruncate(fd, 8)
    except OSError:
        os.close(fd)
        return -1
    return fd


def _until(deadline: float | None, most: float | None) -> float | None:
    """How long one wait may block: at most ``most``, and never past ``deadline``."""
    if deadline is None:
        return most
    left = max(0.0, deadline - time.monotonic())
    return left if most is None else min(most, left)


def _passed(deadline: float | None) -> bool:
    return deadline is not None and time.monotonic() >= deadline


def _settle(future: asyncio.Future, execution: Execution) -> None:
    if not future.done():
        future.set_result(execution)
