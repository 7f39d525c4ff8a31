"""The worker process of one Python model instance (Triton's "stub"): ``python -m naiad.backends.python.worker FD``.

It imports the unmodified ``model.py``, then serves its channel on an asyncio loop: a synchronous
``execute`` runs inline in the read callback (no task, no thread hop), an ``async def execute`` runs as a
task so many overlap. Calls that leave the model (BLS, response senders, logs, metrics) are messages to
the server. A blocking call made on the loop thread (``exec()`` inside a sync ``execute``) reads the
channel itself until its answer arrives, deferring new executions meanwhile.

Messages, server -> worker: ``init``, ``x`` execute, ``c`` cancel, ``b`` BLS response, ``r`` call reply,
``q`` finalize. Worker -> server: ``ready``/``fail``, ``d`` execution done, ``s`` response via a sender,
``B`` BLS request, ``C`` BLS cancel, ``L`` log line, ``M`` metric update, ``R`` call, ``fin``.
"""

from __future__ import annotations

import asyncio
import inspect
import os
import queue
import signal
import socket
import sys
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any, Iterator

from naiad.backends.python import pb_utils
from naiad.backends.python.runner import CODES, check_response, check_result, describe, execute_failed
from naiad.backends.python.runner import import_model, initialize
from naiad.backends.python.shm import Arena
from naiad.backends.python.transport import Channel
from naiad.core.errors import Code, InferError

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
# A batch of executions from the server answers in one datagram while each takes less than this, and no
# answer waits longer than this for its datagram; a slower model answers each as soon as it is done, since
# holding an answer back would cost more than the wake-up it saves.
HOLD_BELOW_NS = 100_000


def error_wire(error: InferError) -> tuple:
    return ((error.code.name, error.message), None, None)


class _Waiter:
    """Answers to one outgoing call or BLS request. Sync waiters queue them; async ones resolve a future."""

    __slots__ = ("queue", "future", "collected", "decoupled")

    def __init__(self, future: asyncio.Future | None = None, decoupled: bool = False) -> None:
        self.queue: queue.SimpleQueue | None = None if future is not None else queue.SimpleQueue()
        self.future = future
        self.collected: list[Any] = []
        self.decoupled = decoupled


class Worker:
    def __init__(self, channel: Channel, setup: dict[str, Any]) -> None:
        self.ch = channel
        self.name: str = setup["instance_name"]
        self.decoupled: bool = setup["decoupled"]
        self.output_names: list[str] = setup["output_names"]
        self.model_name: str = setup["model_name"]
        self.model_version = int(setup["model_version"])
        self.loop = _new_loop()
        self.is_async = False
        self.deferred: deque[tuple] = deque()  # executions that arrived while a blocking call read the channel
        asyncio.set_event_loop(self.loop)
        self.loop_thread = threading.get_ident()
        self.executions: dict[int, list[pb_utils._RequestState]] = {}
        self.waiters: dict[int, _Waiter] = {}
        self._tags = 0
        self._tag_lock = threading.Lock()
        self.pumping = 0
        self.model: Any = None
        self._execute: Any = None
        self.finalized = False
        self._hold = False  # hold this execution's answer back: more of the batch follows
        self._quick = True  # the last execution took less than HOLD_BELOW_NS
        self._held_since = 0  # when the oldest answer now held back was ready

    # --- startup ---------------------------------------------------------------------------------------------

    def load(self, setup: dict[str, Any]) -> bool:
        pb_utils._set_host(self)
        sys.modules.setdefault("triton_python_backend_utils", pb_utils)
        try:
            module = import_model(Path(setup["model_file"]), setup["model_name"])
            self.model = module.TritonPythonModel()
            initialize(self.model, setup["args"], setup["model_name"], self.loop.run_until_complete)
            self._execute = self.model.execute
        except InferError as exc:
            self.ch.send(("fail", exc.code.name, exc.message))
            return False
        except Exception as exc:
            self.ch.send(("fail", Code.INTERNAL.name, describe(exc)))
            return False
        is_async = self.is_async = inspect.iscoroutinefunction(self._execute)
        self.ch.send(("ready", {"async": is_async, "pid": os.getpid(), "python": sys.executable}))
        return True

    def run(self) -> None:
        if self.is_async:
            self.loop.add_reader(self.ch.sock.fileno(), self._on_readable)
            self.loop.run_forever()
            return
        # A synchronous model needs no event loop: block on the socket, one system call per message.
        ch, deferred = self.ch, self.deferred
        while True:
            while deferred:
                self._run_execute(deferred.popleft())
            try:
                messages = ch.receive(wait=True)
            except EOFError:
                self._quit()
                return
            if len(messages) == 1:
                self._dispatch(messages[0])
                continue
            last = len(messages) - 1
            for index, message in enumerate(messages):
                self._hold = index < last and self._quick
                self._dispatch(message)
            self._hold = False
            self._held_since = 0
            ch.release()

    # --- incoming ----------------------------------------------------------------------------------------------

    def _on_readable(self) -> None:
        try:
            messages = self.ch.receive()
        except EOFError:
            self._quit()  # the server is gone
            return
        for message in messages:
            self._dispatch(message)

    def _dispatch(self, message: tuple) -> None:
        kind = message[0]
        if kind == "x":
            if not self.pumping:
                self._run_execute(message)
            elif self.is_async:
                self.loop.call_soon(self._run_execute, message)
            else:
                self.deferred.append(message)
        elif kind == "b" or kind == "r":
            waiter = self.waiters.get(message[1])
            if waiter is not None:
                self._deliver(message, waiter)
        elif kind == "c":
            states = self.executions.get(message[1])
            if states is not None:
                for index, state in enumerate(states):
                    if message[2] < 0 or message[2] == index:
                        state.cancelled = True
        elif kind == "q":
            self._finalize()

    def _deliver(self, message: tuple, waiter: _Waiter) -> None:
        final = message[0] == "r" or not waiter.decoupled or message[3]
        if final:
            del self.waiters[message[1]]
        if waiter.queue is not None:
            waiter.queue.put(message)
            return
        future = waiter.future
        if future is None or future.done():
            return
        if message[0] == "r":
            future.set_result(message)
        elif waiter.decoupled:
            waiter.collected.append(self._bls_response(message[2]))
            if final:
                future.set_result(pb_utils.ResponseIterator(waiter.collected))
        else:
            future.set_result(self._bls_response(message[2]))

    def _wait(self, waiter: _Waiter) -> tuple:
        """The next answer for ``waiter``; on the loop thread, read the channel meanwhile."""
        assert waiter.queue is not None
        if threading.get_ident() != self.loop_thread:
            return waiter.queue.get()
        self.pumping += 1
        try:
            while waiter.queue.empty():
                self.ch.wait_readable()
                try:
                    messages = self.ch.receive()
                except EOFError:
                    self._quit()
                    raise pb_utils.TritonModelException("the server closed the connection") from None
                for message in messages:
                    self._dispatch(message)
        finally:
            self.pumping -= 1
        return waiter.queue.get()

    def _new_tag(self) -> int:
        with self._tag_lock:
            self._tags += 1
            return self._tags

    # --- execution ---------------------------------------------------------------------------------------------

    def _run_execute(self, message: tuple) -> None:
        _, tag, wire_requests = message
        t0 = time.perf_counter_ns()
        unpack = self.ch.unpack
        wrap = pb_utils.Tensor._wrap
        states = []
        requests = []
        for index, (rid, corr, flags, timeout, params, requested, inputs) in enumerate(wire_requests):
            state = pb_utils._RequestState(self.decoupled, self._sender_for(tag, index, requested))
            request = pb_utils.InferenceRequest.__new__(pb_utils.InferenceRequest)
            request._model_name = self.model_name
            request._model_version = self.model_version
            request._inputs = [wrap(d[0], unpack(d, True)) for d in inputs]
            request._by_name = None
            request._requested_output_names = requested if requested is not None else self.output_names
            request._request_id = rid
            request._correlation_id = corr
            request._flags = flags
            request._timeout = timeout
            request._parameters = params
            request._state = state
            request._sender = None
            states.append(state)
            requests.append(request)
        self.executions[tag] = states
        t1 = time.perf_counter_ns()
        box: list[Any] = []
        try:
            box.append(self._execute(requests))
        except Exception as exc:
            del requests
            self._done(tag, wire_requests, box, exc, t1 - t0, t1)
            return
        # Our references to the inputs go before the answer does: the server may reuse their blocks at once.
        del requests
        if inspect.isawaitable(box[0]):
            task = asyncio.ensure_future(box.pop(), loop=self.loop)
            task.add_done_callback(lambda t: self._async_done(t, tag, wire_requests, t1 - t0, t1))
            return
        self._done(tag, wire_requests, box, None, t1 - t0, t1)

    def _async_done(self, task: asyncio.Future, tag: int, wire_requests: list, input_ns: int, t1: int) -> None:
        if task.cancelled():
            self._done(tag, wire_requests, None, asyncio.CancelledError("execute was cancelled"), input_ns, t1)
            return
        exc = task.exception()
        self._done(tag, wire_requests, [] if exc else [task.result()], exc, input_ns, t1)

    def _done(self, tag: int, wire_requests: list, box: list[Any], exc: BaseException | None, input_ns: int,
              t1: int) -> None:
        """Send the outcome of an execution. ``box`` holds execute's return value, so that the last reference
        to it (and to any input arrays it holds) is dropped here, before the answer leaves."""
        t2 = time.perf_counter_ns()
        result = box.pop() if box else None
        states = self.executions.get(tag, [])
        failed = None if exc is None else (Code.INTERNAL.name, execute_failed(self.name, exc).message)
        with self.ch.lock:
            if self.decoupled or failed is not None:
                wire = None
            elif result is None and states and all(s.response is not None for s in states):
                # A non-decoupled model answered through its response senders.
                wire = [self._response_wire(s.response, r[5]) for s, r in zip(states, wire_requests)]
            else:
                checked = check_result(result, len(wire_requests), self.name)
                wire = [self._response_wire(c, r[5]) for c, r in zip(checked, wire_requests)]
                del checked
            del result
            for state in states:
                state.response = None
            t3 = time.perf_counter_ns()
            self._quick = t3 - t1 + input_ns < HOLD_BELOW_NS
            message = ("d", tag, failed, wire, input_ns, t2 - t1, t3 - t2)
            if self._hold and (not self._held_since or t3 - self._held_since < HOLD_BELOW_NS):
                self._held_since = self._held_since or t3
                self.ch.hold(message)
            else:
                self._held_since = 0
                self.ch.send(message)
        if not self.decoupled or all(s.closed for s in states):
            self.executions.pop(tag, None)

    def _response_wire(self, response: Any, requested: list[str] | None) -> tuple:
        if isinstance(response, InferError):
            return error_wire(response)
        pack = self.ch.pack
        try:
            if requested is None:
                outputs = [pack(t._name, t._array) for t in response._output_tensors]
            else:
                outputs = [pack(t._name, t._array) for t in response._output_tensors if t._name in requested]
        except InferError as exc:  # shared memory exhausted: this response fails, the instance lives on
            return error_wire(InferError(f"Failed to send the outputs of model '{self.name}': {exc.message}",
                                         exc.code))
        except Exception as exc:
            return error_wire(InferError(f"Failed to send the outputs of model '{self.name}': {describe(exc)}",
                                         Code.INTERNAL))
        return (None, outputs, response._parameters)

    def _sender_for(self, tag: int, index: int, requested: list[str] | None) -> Any:
        def send(response: Any, flags: int) -> None:
            with self.ch.lock:
                if response is None:
                    wire = None
                else:
                    checked = check_response(response, self.name)
                    wire = self._response_wire(checked, requested)
                self.ch.send(("s", tag, index, wire, flags))
            if flags & FINAL:
                states = self.executions.get(tag)
                if states is not None and all(s.closed for s in states):
                    self.executions.pop(tag, None)
        return send

    # --- the pb_utils host: BLS, logs, metrics, model control -----------------------------------------------

    def _send_bls(self, request: pb_utils.InferenceRequest, decoupled: bool, waiter: _Waiter) -> int:
        tag = self._new_tag()
        self.waiters[tag] = waiter
        with self.ch.lock:
            inputs = [self.ch.pack(t._name, t._array) for t in request._inputs]
            wire = (request._request_id, request._correlation_id, request._flags, request._timeout,
                    request._parameters, request._requested_output_names or None, inputs)
            self.ch.send(("B", tag, request._model_name, int(request._model_version), wire, decoupled))
        return tag

    def _bls_response(self, wire: tuple) -> pb_utils.InferenceResponse:
        error, outputs, params = wire
        if error is not None:
            code = CODES.index(Code[error[0]])
            return pb_utils.InferenceResponse(error=pb_utils.TritonError(error[1], code))
        unpack = self.ch.unpack
        response = pb_utils.InferenceResponse([pb_utils.Tensor._wrap(d[0], unpack(d)) for d in outputs])
        response._parameters = params or {}
        return response

    def exec(self, request: pb_utils.InferenceRequest, decoupled: bool) -> Any:
        waiter = _Waiter(decoupled=decoupled)
        tag = self._send_bls(request, decoupled, waiter)
        if not decoupled:
            return self._bls_response(self._wait(waiter)[2])

        def responses() -> Iterator[pb_utils.InferenceResponse]:
            while True:
                message = self._wait(waiter)
                yield self._bls_response(message[2])
                if message[3]:
                    return

        return pb_utils.ResponseIterator(responses(), lambda: self.ch.send(("C", tag)))

    def async_exec(self, request: pb_utils.InferenceRequest, decoupled: bool) -> asyncio.Future:
        future = self.loop.create_future()
        self._send_bls(request, decoupled, _Waiter(future, decoupled))
        return future

    def _call(self, what: str, *args: Any) -> Any:
        waiter = _Waiter()
        tag = self._new_tag()
        self.waiters[tag] = waiter
        self.ch.send(("R", tag, what, args))
        _, _, ok, value = self._wait(waiter)
        if not ok:
            raise pb_utils.TritonModelException(value)
        return value

    def log(self, level: int, message: str) -> None:
        self.ch.send(("L", level, message))

    def metric_family(self, name: str, description: str, kind: int) -> None:
        self._call("family", name, description, kind)

    def metric_new(self, family: str, labels: dict[str, str], buckets: list[float] | None) -> None:
        self._call("metric", family, labels, buckets)

    def metric_op(self, key: Any, op: str, value: float) -> float:
        if op == "value":
            return self._call("value", key)
        self.ch.send(("M", key, op, value))  # fire and forget: the server applies updates in order
        return 0.0

    def control(self, op: str, name: str, arg: str, extra: dict[str, Any]) -> Any:
        return self._call("control", op, name, arg, extra)

    # --- shutdown ----------------------------------------------------------------------------------------------

    def _finalize(self) -> None:
        error = None
        if not self.finalized:
            self.finalized = True
            fin = getattr(self.model, "finalize", None)
            if fin is not None:
                try:
                    result = fin()
                    if inspect.isawaitable(result):
                        self.loop.run_until_complete(result) if not self.loop.is_running() else None
                except Exception as exc:
                    error = describe(exc)
        try:
            self.ch.send(("fin", error))
        except EOFError:
            pass
        self._quit()

    def _quit(self) -> None:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


def _new_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop  # in the server's environment; an execution environment may not have it

        return uvloop.new_event_loop()
    except ImportError:
        return asyncio.new_event_loop()


def _die_with_parent() -> None:
    """Ask Linux to kill this process when the server dies, so no worker outlives it."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except Exception:
        pass


def main(argv: list[str]) -> int:
    _die_with_parent()
    sock = socket.socket(fileno=int(argv[0]))
    if os.getppid() == 1:
        return 1
    # The first message is the setup; wait for it before the loop exists.
    sock.setblocking(True)
    data = sock.recv(1 << 20)
    if not data:
        return 1
    import marshal

    kind, setup = marshal.loads(data)
    assert kind == "init"
    try:
        arena = Arena(setup["shm_default"], setup["shm_growth"])
    except InferError as exc:
        sock.send(marshal.dumps(("fail", exc.code.name, exc.message)))
        return 1
    worker = Worker(Channel(sock, arena, blocking=True), setup)
    if not worker.load(setup):
        sys.stdout.flush()
        os._exit(1)
    worker.run()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
