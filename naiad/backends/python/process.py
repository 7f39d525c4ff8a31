"""The server's side of one worker process: start it, hand it executions, route what it sends back
(responses, decoupled responses, BLS requests, logs, metrics), notice when it dies and start a new one.

Everything here runs on the server's event loop; the channel is read with ``loop.add_reader``, and
an execution is a bare future resolved from the read callback (no task per request).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import marshal
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from naiad.backends.base import Core, Execution
from naiad.backends.python import metrics
from naiad.backends.python.shm import Arena
from naiad.backends.python.transport import Channel
from naiad.core.errors import Code, InferError, internal
from naiad.core.request import InferRequest, InferResponse

log = logging.getLogger("naiad.python")
model_log = logging.getLogger("naiad.model")
_LEVELS = {0: logging.INFO, 1: logging.WARNING, 2: logging.ERROR, 3: logging.DEBUG}

# The folder that holds the ``naiad`` package: workers import it from there, whatever their interpreter.
NAIAD_ROOT = str(Path(__file__).resolve().parents[3])


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
    python: str = sys.executable
    env: dict[str, str] = field(default_factory=dict)  # extra environment (execution environments)
    python_path: list[str] = field(default_factory=lambda: [NAIAD_ROOT])


class _Pending:
    __slots__ = ("future", "requests", "input_ns", "open", "executed")

    def __init__(self, future: asyncio.Future, requests: list[InferRequest], input_ns: int, decoupled: bool) -> None:
        self.future = future
        self.requests = requests
        self.input_ns = input_ns
        # Decoupled requests stay open until their final response; others close with the execution.
        self.open = [True] * len(requests) if decoupled else None
        self.executed = False


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
        self.core = core
        self.name = spec.instance_name
        self.decoupled = spec.decoupled
        self.is_async = False
        self.ready = False
        self.closing = False
        self.proc: subprocess.Popen | None = None
        self.ch: Channel | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.pending: dict[int, _Pending] = {}
        self.calls: dict[int, Any] = {}  # BLS requests in flight for this worker: tag -> future or task
        self._tag = 0
        self._restarted: asyncio.Future | None = None
        self.restarts = 0

    # --- lifecycle ---------------------------------------------------------------------------------------------

    def start(self) -> None:
        """Spawn the process and send its setup; ``wait_ready`` finishes the handshake."""
        spec = self.spec
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        env = {**os.environ, **spec.env}
        env["PYTHONPATH"] = os.pathsep.join(spec.python_path + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
        try:
            self.proc = subprocess.Popen(
                [spec.python, "-m", "naiad.backends.python.worker", str(child.fileno())],
                pass_fds=(child.fileno(),), env=env, cwd=str(Path(spec.model_file).parent),
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
        }
        # The setup goes first, on the bare socket: the worker builds its channel from it.
        parent.send(marshal.dumps(("init", setup)))
        try:
            self.ch = Channel(parent, Arena(spec.shm_default, spec.shm_growth), self._on_blocked)
        except InferError:
            parent.close()
            self.proc.kill()
            self.proc.wait()
            raise

    def wait_ready(self) -> None:
        """Block until the worker has run ``initialize``; raises its failure."""
        assert self.ch is not None and self.proc is not None
        while True:
            self.ch.wait_readable(0.5)
            try:
                messages = self.ch.receive()
            except EOFError:
                code = self.proc.wait()
                self.ch.close()
                raise internal(f"the worker process of '{self.name}' {_describe_exit(code)} during initialization")
            for message in messages:
                if message[0] == "ready":
                    self.is_async = bool(message[1]["async"])
                    self.ready = True
                    return
                if message[0] == "fail":
                    self.proc.wait()
                    self.ch.close()
                    raise InferError(message[2], Code[message[1]])
                self._handle(message)  # log lines and metric registrations from initialize()

    def attach(self, loop: asyncio.AbstractEventLoop) -> None:
        assert self.ch is not None
        self.loop = loop
        loop.add_reader(self.ch.sock.fileno(), self._on_readable)

    def stop(self, timeout: float = 10.0) -> None:
        """Call the model's ``finalize()`` in the worker, then make sure the process is gone."""
        self.closing = True
        self.ready = False
        ch, proc = self.ch, self.proc
        if ch is None or proc is None:
            return
        if self.loop is not None and not ch.closed:
            try:
                self.loop.remove_reader(ch.sock.fileno())
                self.loop.remove_writer(ch.sock.fileno())
            except Exception:
                pass
        try:
            ch.send(("q",))
            deadline = time.monotonic() + timeout
            while proc.poll() is None and time.monotonic() < deadline:
                if ch.wait_readable(0.05):
                    for message in ch.receive():
                        if message[0] == "fin":
                            if message[1]:
                                log.error("finalize() of '%s' failed: %s", self.name, message[1])
                        elif message[0] in ("L", "M"):
                            self._handle(message)
        except EOFError:
            pass
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        self._fail_pending(f"model instance '{self.name}' was unloaded")
        ch.close()

    # --- executions --------------------------------------------------------------------------------------------

    def execute(self, requests: list[InferRequest]) -> Any:
        if not self.ready:
            return self._execute_when_ready(requests)
        ch = self.ch
        assert ch is not None
        if self.loop is None:
            self.attach(asyncio.get_running_loop())
        t0 = time.perf_counter_ns()
        self._tag += 1
        tag = self._tag
        try:
            with ch.lock:
                pack = ch.pack
                wire = [(r.id, r.correlation_id, r.flags, r.timeout_us, r.parameters, r.requested_outputs,
                         [pack(n, a) for n, a in r.inputs.items()]) for r in requests]
                ch.send(("x", tag, wire))
        except InferError as exc:  # shared memory exhausted: this execution fails, the worker lives on
            return Execution([self._error(r, exc) for r in requests], failed=True)
        except EOFError:
            return self._execute_when_ready(requests)
        future = self.loop.create_future()  # type: ignore[union-attr]
        self.pending[tag] = _Pending(future, requests, time.perf_counter_ns() - t0, self.decoupled)
        return future

    async def _execute_when_ready(self, requests: list[InferRequest]) -> Execution:
        """The worker is restarting: wait for it (bounded by the restart itself), then run."""
        if self.closing:
            error = internal(f"model instance '{self.name}' is unloading")
            return Execution([self._error(r, error) for r in requests], failed=True)
        if self._restarted is None or self._restarted.done():
            self._restarted = asyncio.get_running_loop().create_future()
            if not self._restarting:
                self._restart()
        ok = await self._restarted
        if not ok or not self.ready:
            error = internal(f"Failed to process the request(s) for model instance '{self.name}', message: Stub "
                             f"process '{self.name}' is not healthy and could not be restarted.")
            return Execution([self._error(r, error) for r in requests], failed=True)
        result = self.execute(requests)
        return await result if not isinstance(result, Execution) else result

    def cancel(self, request: InferRequest) -> bool:
        for tag, pending in self.pending.items():
            for index, candidate in enumerate(pending.requests):
                if candidate is request:
                    try:
                        self.ch.send(("c", tag, index))  # type: ignore[union-attr]
                    except EOFError:
                        pass
                    return True
        return False

    def _error(self, request: InferRequest, error: InferError) -> InferResponse:
        return InferResponse(self.spec.model_name, str(self.spec.model_version), request.id, error=error)

    # --- incoming ----------------------------------------------------------------------------------------------

    def _on_readable(self) -> None:
        try:
            messages = self.ch.receive()  # type: ignore[union-attr]
        except EOFError:
            self._died()
            return
        for message in messages:
            kind = message[0]
            if kind == "d":
                self._executed(message)
            elif kind == "s":
                self._streamed(message)
            else:
                self._handle(message)

    def _executed(self, message: tuple) -> None:
        _, tag, failed, wire, input_ns, infer_ns, output_ns = message
        pending = self.pending.get(tag)
        if pending is None:
            return
        t0 = time.perf_counter_ns()
        requests = pending.requests
        if failed is not None:
            error = InferError(failed[1], Code[failed[0]])
            responses = [self._error(r, error) for r in requests]
            if pending.open is not None:
                for index, request in enumerate(requests):
                    if pending.open[index]:
                        pending.open[index] = False
                        self._respond(request, self._error(request, error), True)
        elif wire is None:  # decoupled: the responses travel on their own
            responses = [self._error(r, None) for r in requests]  # type: ignore[arg-type]
        else:
            responses = [self._response(r, w) for r, w in zip(requests, wire)]
        pending.executed = True
        if pending.open is None or not any(pending.open):
            del self.pending[tag]
        execution = Execution(responses, pending.input_ns + input_ns, infer_ns,
                              output_ns + time.perf_counter_ns() - t0, failed=failed is not None)
        if not pending.future.done():
            pending.future.set_result(execution)

    def _streamed(self, message: tuple) -> None:
        _, tag, index, wire, flags = message
        pending = self.pending.get(tag)
        if pending is None or pending.open is None or not pending.open[index]:
            return
        request = pending.requests[index]
        final = bool(flags & 1)
        if wire is None:
            response = InferResponse(self.spec.model_name, str(self.spec.model_version), request.id)
        else:
            response = self._response(request, wire)
        if final:
            pending.open[index] = False
            if pending.executed and not any(pending.open):
                del self.pending[tag]
        self._respond(request, response, final)

    @staticmethod
    def _respond(request: InferRequest, response: InferResponse, final: bool) -> None:
        response.final = final
        responder = request.responder
        if responder is not None:
            responder(response)

    def _response(self, request: InferRequest, wire: tuple) -> InferResponse:
        error, outputs, params = wire
        version = str(self.spec.model_version)
        if error is not None:
            return InferResponse(self.spec.model_name, version, request.id, error=InferError(error[1], Code[error[0]]))
        unpack = self.ch.unpack  # type: ignore[union-attr]
        return InferResponse(self.spec.model_name, version, request.id, {d[0]: unpack(d) for d in outputs}, params)

    def _handle(self, message: tuple) -> None:
        kind = message[0]
        if kind == "L":
            model_log.log(_LEVELS.get(message[1], logging.INFO), "%s", message[2])
        elif kind == "M":
            metrics.REGISTRY.apply(message[1], message[2], message[3])
        elif kind == "R":
            self._call(message[1], message[2], message[3])
        elif kind == "B":
            self._bls(message)
        elif kind == "C":
            call = self.calls.pop(message[1], None)
            if call is not None:
                call.cancel()

    def _reply(self, message: tuple) -> None:
        try:
            with self.ch.lock:  # type: ignore[union-attr]
                self.ch.send(message)  # type: ignore[union-attr]
        except (EOFError, AttributeError):
            pass

    def _call(self, tag: int, what: str, args: tuple) -> None:
        try:
            if what == "family":
                value = metrics.REGISTRY.family(*args, owner=f"{self.spec.model_name}/{self.spec.model_version}")
            elif what == "metric":
                value = metrics.REGISTRY.metric(*args)
            elif what == "value":
                value = metrics.REGISTRY.value(args[0])
            elif what == "control":
                value = self._control(*args)
                if inspect.isawaitable(value):  # a load runs off the loop; the model waits for its answer
                    asyncio.ensure_future(self._reply_when_done(tag, value, args[0]))
                    return
            else:
                raise InferError(f"unknown call '{what}'")
        except (InferError, metrics.MetricError) as exc:
            self._reply(("r", tag, False, str(getattr(exc, "message", exc))))
            return
        self._reply(("r", tag, True, value))

    async def _reply_when_done(self, tag: int, pending: Any, op: str) -> None:
        try:
            value = await pending
        except Exception as exc:  # the model hears about it (in python_backend's words); the server keeps serving
            message = exc.message if isinstance(exc, InferError) else f"{type(exc).__name__}: {exc}"
            self._reply(("r", tag, False, f"Failed to {op} model: Failed to process the request for model "
                                          f"'{self.name}', message: {message}"))
            return
        self._reply(("r", tag, True, value))

    def _control(self, op: str, name: str, arg: str, extra: dict[str, Any]) -> Any:
        core = self.core
        if op == "ready":
            check = getattr(core, "model_ready", None)
            return bool(check(name, arg)) if check is not None else False
        method = getattr(core, f"{op}_model", None)
        if method is None:
            raise InferError(f"explicit model {op} is not available in this server (see --model-control-mode)",
                             Code.UNAVAILABLE)
        return method(name, **({"config": arg, "files": extra} if op == "load" else extra))

    # --- BLS: a worker's request to another model goes through the server core --------------------------------

    def _bls(self, message: tuple) -> None:
        _, tag, model_name, version, wire, decoupled = message
        rid, corr, flags, timeout, params, requested, inputs = wire
        unpack = self.ch.unpack  # type: ignore[union-attr]
        request = InferRequest(model_name, str(version) if version >= 0 else "", rid,
                               {d[0]: unpack(d) for d in inputs}, requested, params)
        request.correlation_id = corr
        request.flags = flags
        request.timeout_us = timeout
        core = self.core
        if core is None:
            self._reply(("b", tag, (("UNAVAILABLE", "BLS is not available: the model runs outside a server"),
                                    None, None), True))
            return
        if decoupled:
            self.calls[tag] = asyncio.ensure_future(self._bls_stream(tag, core, request))
            return
        try:
            future = core.infer(request)
        except InferError as exc:
            self._reply(("b", tag, ((exc.code.name, exc.message), None, None), True))
            return
        self.calls[tag] = future
        future.add_done_callback(lambda f: self._bls_done(tag, f))

    def _bls_done(self, tag: int, future: asyncio.Future) -> None:
        self.calls.pop(tag, None)
        if future.cancelled():
            self._reply(("b", tag, (("CANCELLED", "the BLS request was cancelled"), None, None), True))
            return
        self._send_bls_response(tag, future.result(), True)

    async def _bls_stream(self, tag: int, core: Core, request: InferRequest) -> None:
        try:
            async for response in core.stream(request):
                self._send_bls_response(tag, response, response.final)
        except InferError as exc:
            self._reply(("b", tag, ((exc.code.name, exc.message), None, None), True))
        except asyncio.CancelledError:
            self._reply(("b", tag, (("CANCELLED", "the BLS request was cancelled"), None, None), True))
        finally:
            self.calls.pop(tag, None)

    def _send_bls_response(self, tag: int, response: InferResponse, final: bool) -> None:
        ch = self.ch
        if ch is None or ch.closed:
            return
        try:
            with ch.lock:
                if response.error is not None:
                    wire: tuple = ((response.error.code.name, response.error.message), None, None)
                else:
                    wire = (None, [ch.pack(n, a) for n, a in response.outputs.items()], response.parameters)
                ch.send(("b", tag, wire, final))
        except InferError as exc:
            self._reply(("b", tag, ((exc.code.name, exc.message), None, None), True))
        except EOFError:
            pass

    # --- crashes -----------------------------------------------------------------------------------------------

    def _on_blocked(self) -> None:
        if self.loop is not None and self.ch is not None:
            self.loop.add_writer(self.ch.sock.fileno(), self._on_writable)

    def _on_writable(self) -> None:
        if self.ch is None or self.ch.flush():
            if self.loop is not None and self.ch is not None:
                self.loop.remove_writer(self.ch.sock.fileno())

    def _fail_pending(self, why: str) -> None:
        pending, self.pending = self.pending, {}
        error = internal(why)
        for entry in pending.values():
            responses = [self._error(r, error) for r in entry.requests]
            if entry.open is not None:
                for index, request in enumerate(entry.requests):
                    if entry.open[index]:
                        self._respond(request, self._error(request, error), True)
            if not entry.future.done():
                entry.future.set_result(Execution(responses, failed=True))
        calls, self.calls = self.calls, {}
        for call in calls.values():
            call.cancel()

    _restarting = False

    def _died(self) -> None:
        """The worker is gone (crash, kill, os._exit): fail what it held, then start a new one."""
        ch, proc = self.ch, self.proc
        self.ready = False
        if self.loop is not None and ch is not None:
            self.loop.remove_reader(ch.sock.fileno())
            self.loop.remove_writer(ch.sock.fileno())
        code = proc.poll() if proc is not None else None
        if proc is not None and code is None:
            try:
                code = proc.wait(1.0)
            except subprocess.TimeoutExpired:
                proc.kill()
                code = proc.wait()
        how = _describe_exit(code)
        log.error("the worker process of model instance '%s' (pid %s) %s; restarting it", self.name,
                  proc.pid if proc else "?", how)
        self._fail_pending(f"Failed to process the request(s) for model instance '{self.name}', message: Stub "
                           f"process '{self.name}' is not healthy (its process {how}).")
        if ch is not None:
            ch.close()
        if not self.closing:
            self._restart()

    def _restart(self) -> None:
        if self._restarting or self.closing:
            return
        self._restarting = True
        loop = self.loop or asyncio.get_running_loop()
        if self._restarted is None or self._restarted.done():
            self._restarted = loop.create_future()

        def spawn() -> None:
            self.start()
            self.wait_ready()

        async def run() -> None:
            ok = False
            delay = 0.1
            for attempt in range(5):
                if self.closing:
                    break
                try:
                    self.ready = False
                    await loop.run_in_executor(None, spawn)
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
            self._restarting = False
            if self._restarted is not None and not self._restarted.done():
                self._restarted.set_result(ok)

        asyncio.ensure_future(run(), loop=loop)
