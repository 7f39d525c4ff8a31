"""The worker process of one Python model instance (Triton's "stub"):
``python -m naiad.backends.python.worker FD SERVER_PID``.

It imports the unmodified ``model.py``, then serves its channel on an asyncio loop: a synchronous
``execute`` runs inline in the read callback (no task, no thread hop), an ``async def execute`` runs as a
task so many overlap. Calls that leave the model (BLS, response senders, logs, metrics) are messages to
the server. A blocking call made on the loop thread (``exec()`` inside a sync ``execute``) reads the
channel itself until its answer arrives, deferring new executions meanwhile.

Cancellation. A sync worker may hold several executions at once (the server pipelines them, see backend.py's
``pipeline-depth``), so a request whose client went away may wait here rather than in the server's queue. After
an execution that took long enough for a client to give up (``HOLD_BELOW_NS`` or more), the worker reads what
else has arrived before it starts the next one; an execution whose requests were all cancelled by then is
answered CANCELLED without running (the server counts it as its scheduler counts a dropped request), one with
only some cancelled runs with ``is_cancelled()`` true for those. Behind quick executions it doesn't look: a
system call per execution would cost a pipelined round trip ~15 %, and running a quick one for nobody costs little.

The messages are ``messages.py``'s; the handshake (INIT in, HELLO out, both JSON) picks the codec for the
rest, so a worker on another Python version than the server's still talks to it.
"""

from __future__ import annotations

import signal

if __name__ == "__main__":
    # As Triton's stub: Ctrl-C in a terminal, or SIGTERM to the process group (timeout, docker, systemd), reaches
    # the workers too; the server drives their shutdown (drain, then finalize()), so they pass both over. A handler
    # rather than SIG_IGN, which processes the model starts would inherit (exec resets handlers, not SIG_IGN). Set
    # before the imports below, the slow part of a worker's start.
    def _server_decides(signum: int, frame: object) -> None:
        pass

    signal.signal(signal.SIGINT, _server_decides)
    signal.signal(signal.SIGTERM, _server_decides)

import asyncio  # noqa: E402
import functools
import inspect
import mmap
import os
import queue
import socket
import sys
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from naiad.backends import faults
from naiad.backends.python import messages as M
from naiad.backends.python import pb_utils
from naiad.backends.python.messages import Kind, reads
from naiad.backends.python.runner import CODES, check_response, check_result, describe, execute_failed
from naiad.backends.python.runner import import_model, initialize
from naiad.backends.python.shm import Arena
from naiad.backends.python.transport import _DTYPES, INLINE_TENSOR, TYPESTRS, Channel
from naiad.core.errors import Code, InferError, internal

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
RESCHEDULE, _SENT = pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE, pb_utils.SENT
_InferenceRequest, _RequestState = pb_utils.InferenceRequest, pb_utils._RequestState
_InferenceResponse, _new_request = pb_utils.InferenceResponse, object.__new__
_new_tensor = _new_request
_Tensor, _frombuffer, _partial = pb_utils.Tensor, np.frombuffer, functools.partial
_encode_done, _encode_response = M.done, M.response  # (hot path: no module lookup per call)
_EXECUTE, _FINALIZE = int(Kind.EXECUTE), int(Kind.FINALIZE)
# The execute path reads and writes small tensor records as bare tuples (no call per tensor): in this order.
if M.Tensor._fields != ("name", "dtype", "shape", "payload"):
    raise ImportError("worker.py's inline tensor records must follow messages.Tensor's fields")
# The answer to an execution skipped because every request in it was cancelled (core's drop_cancelled wording).
CANCELLED = M.error(Code.CANCELLED.name, "Request was cancelled")
# A batch of executions from the server answers in one datagram while each takes less than this, and no
# answer waits longer than this for its datagram; a slower model answers each as soon as it is done, since
# holding an answer back would cost more than the wake-up it saves.
HOLD_BELOW_NS = 100_000


def error_wire(error: InferError) -> tuple:
    return M.error_response(error.code.name, error.message)


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
        # The tag of the last execution this worker began, where the server reads it if the worker dies: the
        # executions after it never started, and run on the replacement instead of failing with it.
        self._progress = _progress_word(setup.get("progress_fd"))
        # sequence_batching { iterative_sequence: true }: a request released with RESCHEDULE runs again; elsewhere
        # that flag releases it as usual (as Triton's other schedulers do).
        self.iterative = bool(setup.get("iterative", False))
        self.loop = _new_loop()
        self.is_async = False
        # Executions (and a FINALIZE behind them) waiting their turn: a pipelined batch, or those that arrived
        # while a blocking call read the channel.
        self.queued: deque[tuple] = deque()
        self._skip: dict[int, set[int]] = {}  # queued execution's tag -> cancelled request indexes (-1: all)
        self._unpack = channel.unpack
        routes = {Kind.EXECUTE: self._run_execute, Kind.BLS_REPLY: self._on_bls_reply,
                  Kind.CALL_REPLY: self._on_call_reply, Kind.CANCEL: self._on_cancel, Kind.FINALIZE: self._on_finalize}
        self._routes = M.dispatch_table(routes, self._unexpected)
        # While a blocking call reads the channel for its answer, executions wait their turn.
        self._pumping_routes = M.dispatch_table({**routes, Kind.EXECUTE: self._defer}, self._unexpected)
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
        self._free_ns = 0  # when the last execution finished (a sync worker runs one at a time)
        self._errors: list[str] = []  # the texts of the errors answered since the last execution ended

    # --- startup ---------------------------------------------------------------------------------------------

    def load(self, setup: dict[str, Any]) -> bool:
        pb_utils._set_host(self)
        args = setup["args"]
        pb_utils._model_dir = os.path.join(args.get("model_repository", ""), str(args.get("model_version", "")))
        sys.modules.setdefault("triton_python_backend_utils", pb_utils)
        try:
            module = import_model(Path(setup["model_file"]), setup["model_name"])
            self.model = module.TritonPythonModel()
            initialize(self.model, setup["args"], setup["model_name"], self.loop.run_until_complete)
            self._execute = self.model.execute
        except InferError as exc:
            self.ch.send(M.fail(exc.code.name, exc.message))
            return False
        except Exception as exc:
            self.ch.send(M.fail(Code.INTERNAL.name, describe(exc)))
            return False
        is_async = self.is_async = inspect.iscoroutinefunction(self._execute)
        self.ch.send(M.ready(is_async, os.getpid(), sys.executable))
        return True

    def run(self) -> None:
        if self.is_async:
            self.loop.add_reader(self.ch.sock.fileno(), self._on_readable)
            self.loop.run_forever()
            return
        # A synchronous model needs no event loop: block on the socket, one system call per message.
        ch, queued, routes = self.ch, self.queued, self._routes
        while True:
            if queued:
                if not self._quick:
                    # The last execution was slow: what arrived meanwhile (cancellations, more executions) is read
                    # before the next one starts. After quick ones it isn't: a cancellation can't save much then,
                    # and not looking keeps a pipelined round trip one system call cheaper.
                    self._look()
                message = queued.popleft()
                self._hold = bool(queued) and self._quick
                routes[message[0]](*message)
                if not queued:
                    self._hold = False
                    self._held_since = 0
                    ch.release()
                continue
            try:
                messages = ch.receive(wait=True)
            except EOFError:
                self._quit()
                return
            if len(messages) == 1 and self._quick:  # the common unloaded case: run it now
                message = messages[0]
                routes[message[0]](*message)
                continue
            for message in messages:
                self._take(message)

    def _take(self, message: tuple) -> None:
        """Queue an execution (or a FINALIZE, which must not overtake one) for its turn; route anything else now."""
        kind = message[0]
        if kind == _EXECUTE or kind == _FINALIZE:
            self.queued.append(message)
        else:
            self._routes[kind](*message)

    def _look(self) -> None:
        """Take in whatever has arrived, without waiting."""
        try:
            messages = self.ch.receive()
        except EOFError:
            self._quit()
            return
        for message in messages:
            self._take(message)

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
        (self._pumping_routes if self.pumping else self._routes)[message[0]](*message)

    @reads(M.Execute)
    def _defer(self, kind: int, tag: int, requests: list) -> None:
        if self.is_async:
            self.loop.call_soon(self._run_execute, kind, tag, requests)
        else:
            self.queued.append((kind, tag, requests))

    @reads(M.CallReply)
    def _on_call_reply(self, kind: int, tag: int, ok: bool, value: Any) -> None:
        waiter = self.waiters.pop(tag, None)
        if waiter is None:
            return
        reply = M.CallReply(kind, tag, ok, value)
        if waiter.queue is not None:
            waiter.queue.put(reply)
        elif waiter.future is not None and not waiter.future.done():
            waiter.future.set_result(reply)

    @reads(M.BlsReply)
    def _on_bls_reply(self, kind: int, tag: int, response: tuple, final: bool) -> None:
        waiter = self.waiters.get(tag)
        if waiter is None:
            return
        final = not waiter.decoupled or final
        if final:
            del self.waiters[tag]
        if waiter.queue is not None:
            waiter.queue.put(M.BlsReply(kind, tag, response, final))
            return
        future = waiter.future
        if future is None or future.done():
            return
        response = self._bls_response(*response)
        if waiter.decoupled:
            waiter.collected.append(response)
            if final:
                future.set_result(pb_utils.ResponseIterator(waiter.collected))
        else:
            future.set_result(response)

    @reads(M.Cancel)
    def _on_cancel(self, kind: int, tag: int, request_index: int) -> None:
        states = self.executions.get(tag)
        if states is not None:  # running: the model sees is_cancelled()
            for at, state in enumerate(states):
                if request_index < 0 or request_index == at:
                    state.cancelled = True
            return
        for message in self.queued:  # waiting its turn: remembered until it comes (else: finished, ignored)
            if message[0] == _EXECUTE and message[1] == tag:
                self._skip.setdefault(tag, set()).add(request_index)
                return

    @reads(M.Finalize)
    def _on_finalize(self, kind: int) -> None:
        self._finalize()

    def poll(self) -> None:
        """``is_cancelled()`` asks while a synchronous execute runs on the loop thread, which reads nothing meanwhile:
        take in what has arrived (a cancellation is applied now; executions wait their turn). One non-blocking
        system call, paid only by models that ask."""
        if self.is_async or self.pumping or threading.get_ident() != self.loop_thread:
            return  # the loop (or the blocking call's pump) reads the channel already
        self._look()

    def _unexpected(self, kind: int, *_: Any) -> None:
        print(f"naiad worker '{self.name}': ignoring an unexpected message of kind {kind}", file=sys.stderr)

    def _wait(self, waiter: _Waiter) -> Any:
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

    @reads(M.Execute)
    def _run_execute(self, kind: int, tag: int, requests: list) -> None:
        t0 = time.perf_counter_ns()
        self._progress[0] = tag
        cancelled = self._skip.pop(tag, None) if self._skip else None
        if cancelled is not None and (-1 in cancelled or len(cancelled) >= len(requests)):
            self._drop(tag, requests)
            return
        states = []
        request_for = self._request
        records, requests = requests, []  # the wire's records in, the model's requests out
        request = None
        for index, record in enumerate(records):
            request = request_for(tag, index, *record)
            states.append(request._state)
            requests.append(request)
        self.executions[tag] = states
        if cancelled is not None:  # some of them: those run cancelled (the model may check is_cancelled())
            for index in cancelled:
                if index < len(states):
                    states[index].cancelled = True
        t1 = time.perf_counter_ns()
        box: list[Any] = []
        try:
            box.append(self._execute(requests))
        except Exception as exc:
            del requests, request
            self._done(tag, states, box, exc, t1 - t0, t1)
            return
        # Our references to the inputs go before the answer does: the server may reuse their blocks at once.
        del requests, request
        if type(box[0]) is not list and inspect.isawaitable(box[0]):  # (a list, execute's usual answer, never is)
            task = asyncio.ensure_future(box.pop(), loop=self.loop)
            task.add_done_callback(lambda t: self._async_done(t, tag, states, t1 - t0, t1))
            return
        self._done(tag, states, box, None, t1 - t0, t1)

    def _drop(self, tag: int, records: list) -> None:
        """Answer an execution whose requests were all cancelled before it started, without running it. Their
        input blocks are freed unread (the server reuses a block once its receiver frees it)."""
        release = self.ch.segments.release
        for record in records:
            for tensor in M.Request.of(record).inputs:  # type: ignore[attr-defined]
                payload = M.Tensor.of(tensor).payload  # type: ignore[attr-defined]
                if type(payload) is not bytes:
                    block = M.Block.of(payload)  # type: ignore[attr-defined]
                    release(block.segment, block.offset)
        self.ch.send(_encode_done(tag, CANCELLED, None, 0, 0, 0, 0, None))  # at once: what is held goes along

    @reads(M.Request)
    def _request(self, tag: int, index: int, id: str, correlation_id: Any, flags: int, timeout: int, parameters: dict,
                 requested: list | None, inputs: list) -> pb_utils.InferenceRequest:
        unpack, dtypes, tensors = self._unpack, _DTYPES, []
        for record in inputs:
            tensor = _new_tensor(_Tensor)
            name, dtype, shape, payload = record
            if type(payload) is bytes and dtype != "BYTES":  # small, inline: the model gets its own copy
                array = _frombuffer(payload, dtypes[dtype])
                # (frombuffer's own shape is the record's when that has one dimension: the sender's array's bytes)
                tensor._name, tensor._array = name, (array if len(shape) == 1 else array.reshape(shape)).copy()
            else:
                tensor._name, tensor._array = unpack(True, *record)
            tensors.append(tensor)
        request = _new_request(_InferenceRequest)
        request._model_name = self.model_name
        request._model_version = self.model_version
        request._inputs = tensors
        request._by_name = None
        request._requested_output_names = requested if requested is not None else self.output_names
        request._request_id = id
        request._correlation_id = correlation_id
        request._flags = flags
        request._timeout = timeout
        request._parameters = parameters
        request._state = _RequestState(self.decoupled, _partial(self._send_response, tag, index, requested), requested)
        request._sender = None
        return request

    def _async_done(self, task: asyncio.Future, tag: int, states: list, input_ns: int, t1: int) -> None:
        if task.cancelled():
            self._done(tag, states, [], asyncio.CancelledError("execute was cancelled"), input_ns, t1)
            return
        exc = task.exception()
        self._done(tag, states, [] if exc else [task.result()], exc, input_ns, t1)

    def _done(self, tag: int, states: list[pb_utils._RequestState], box: list[Any], exc: BaseException | None,
              input_ns: int, t1: int) -> None:
        """Send the outcome of an execution. ``box`` holds execute's return value, so that the last reference
        to it (and to any input arrays it holds) is dropped here, before the answer leaves."""
        t2 = time.perf_counter_ns()
        result = box.pop() if box else None
        failed = None
        if exc is not None:
            error = execute_failed(self.name, exc)  # (its code: INTERNAL, or a framework's own, runner.py)
            failed = M.error(error.code.name, error.message)
        # A request answered through its sender (or to be, after execute returned None), or released to be
        # rescheduled: the per-request answers need a closer look.
        special = result is None
        if not special:
            for state in states:
                if state.response is not None or state.release != 1:
                    special = True
                    break
        rescheduled = None
        with self.ch.lock:
            if failed is None and self.decoupled and result is not None:
                # Triton's words; the error is every open request's final answer, so no client waits forever.
                failed = M.error(Code.INTERNAL.name, f"Failed to process the request(s) for model '{self.name}', "
                                 f"message: Python model '{self.name}' is using the decoupled mode and the execute "
                                 "function must return None.")
                for state in states:
                    state.closed = True
            if special:
                rescheduled = self._released(states, result)
            if self.decoupled or failed is not None:
                wire = None
            elif special:
                wire = self._special_wire(result, states)
            elif type(result) is list and len(result) == len(states):
                # The usual answer: check_result's checks, inline for a plain response without an error.
                response_wire, name = self._response_wire, self.name
                wire = [response_wire(r if type(r) is _InferenceResponse and r._error is None
                                      else check_response(r, name), s.requested) for r, s in zip(result, states)]
            else:
                wire = [self._response_wire(c, s.requested)
                        for c, s in zip(check_result(result, len(states), self.name), states)]
            del result
            if special:  # (otherwise none holds a response)
                for state in states:
                    state.response = None
            cause = None
            if failed is not None or self._errors:  # (a failed execution only: the device may be poisoned)
                failed, wire, cause = self._contain(failed, wire)
            t3 = time.perf_counter_ns()
            self._quick = t3 - t1 + input_ns < HOLD_BELOW_NS
            free, self._free_ns = self._free_ns, t3
            message = _encode_done(tag, failed, wire, input_ns, t2 - t1, t3 - t2, 0 if self.is_async else free,
                                   rescheduled)
            if cause is not None:  # the notice, then the answer, in one datagram; then a fresh process takes over
                self.ch.hold(M.poisoned(cause))
                self.ch.send(message)
                self._quit()
            if self._hold and self._quick and (not self._held_since or t3 - self._held_since < HOLD_BELOW_NS):
                self._held_since = self._held_since or t3
                self.ch.hold(message)
            else:
                self._held_since = 0
                self.ch.send(message)
        if not self.decoupled or all(s.closed for s in states):
            self.executions.pop(tag, None)

    def _contain(self, failed: tuple | None, wire: list | None) -> tuple[tuple | None, list | None, str | None]:
        """After a failed execution (it raised, or answered errors): is this process's device poisoned? If so, the
        errors name the cause, and the caller ends the process once they are sent."""
        texts, self._errors = self._errors, []
        if failed is not None:
            texts.append(M.Error.of(failed).message)  # type: ignore[attr-defined]
        cause = faults.poisoned(texts)
        if cause is None:
            return failed, wire, None
        note = faults.notice(self.name, self.model_name, cause)
        if failed is not None:
            error = M.Error.of(failed)  # type: ignore[attr-defined]
            failed = M.error(error.code, f"{note}: {error.message}")
        if wire is not None:
            wire = [w if w is None or w[0] is None else M.error_response(w[0][0], f"{note}: {w[0][1]}") for w in wire]
        return failed, wire, cause

    def _released(self, states: list[pb_utils._RequestState], result: Any) -> list[int] | None:
        """The indexes of the requests to run again (RESCHEDULE, with iterative scheduling only). A rescheduled
        request comes back as a new execution: this one's senders are done with. One that execute also answered
        is not run again: Triton answers it with an error (``_special_wire``)."""
        if not self.iterative:
            return None
        items = result if isinstance(result, list) and len(result) == len(states) else None
        out = [i for i, s in enumerate(states) if s.release == RESCHEDULE and (items is None or items[i] is None)]
        for index in out:
            states[index].closed = True
        return out or None

    def _special_wire(self, result: Any, states: list[pb_utils._RequestState]) -> list:
        """A non-decoupled execution's answers where some request was answered through its sender (its answer
        already left: None here), is rescheduled (None: it answers in a later execution), or will be answered
        through its sender after execute returned None (None: the server waits for it, as Triton's does)."""
        rescheduled = [self.iterative and s.release == RESCHEDULE for s in states]
        if result is None and all(s.taken or r for s, r in zip(states, rescheduled)):
            items: list[Any] = [None] * len(states)  # the senders answer, now or later
        elif not isinstance(result, list) or len(result) != len(states):
            items = check_result(result, len(states), self.name)
        else:
            items = list(result)
        wire: list = []
        for item, state, again in zip(items, states, rescheduled):
            if state.response is _SENT or (again and item is None):
                wire.append(None)
            elif item is None and state.taken and state.response is None:
                wire.append(None)  # its sender answers after execute returned (Triton skips None here too)
            elif again:
                wire.append(error_wire(internal(
                    f"Failed to process the request(s) for model '{self.name}', message: Expected a None object in "
                    f"the execute function return list for reschduled request, found type '{type(item)}'.")))
            elif item is None and state.response is not None:
                wire.append(self._response_wire(state.response, state.requested))  # sent without FINAL
            else:
                wire.append(self._response_wire(check_response(item, self.name), state.requested)
                            if not isinstance(item, InferError) else error_wire(item))
        return wire

    def _response_wire(self, response: Any, requested: list[str] | None) -> tuple:
        if isinstance(response, InferError):
            self._errors.append(response.message)
            return error_wire(response)
        pack, outputs = self.ch.pack, []
        try:
            for tensor in response._output_tensors:
                name, array = tensor._name, tensor._array
                if requested is not None and name not in requested:
                    continue
                dtype = array.dtype
                if array.nbytes <= INLINE_TENSOR and dtype.kind not in "OSU":  # Channel.pack's inline case, inline
                    outputs.append((name, TYPESTRS[dtype], array.shape, array.tobytes()))
                else:
                    outputs.append(pack(name, array))
        except InferError as exc:  # shared memory exhausted: this response fails, the instance lives on
            return error_wire(InferError(f"Failed to send the outputs of model '{self.name}': {exc.message}",
                                         exc.code))
        except Exception as exc:
            return error_wire(InferError(f"Failed to send the outputs of model '{self.name}': {describe(exc)}",
                                         Code.INTERNAL))
        return _encode_response(None, outputs, response._parameters)

    def _send_response(self, tag: int, index: int, requested: list[str] | None, response: Any, flags: int) -> None:
        """A request's response sender, bound to it with ``functools.partial`` (a C call per request, where a
        closure cost a Python one)."""
        with self.ch.lock:
            if response is None:
                wire = None
            else:
                checked = check_response(response, self.name)
                wire = self._response_wire(checked, requested)
            self.ch.send(M.stream(tag, index, wire, flags))
        if flags & FINAL and self.decoupled:
            states = self.executions.get(tag)
            if states is not None and all(s.closed for s in states):
                self.executions.pop(tag, None)

    # --- the pb_utils host: BLS, logs, metrics, model control -----------------------------------------------

    def _send_bls(self, request: pb_utils.InferenceRequest, decoupled: bool, waiter: _Waiter) -> int:
        if self._execute is None or self.finalized:  # as Triton's stub: not from initialize() or finalize()
            raise pb_utils.TritonModelException("BLS is only supported during the 'execute' function.")
        tag = self._new_tag()
        self.waiters[tag] = waiter
        with self.ch.lock:
            inputs = [self.ch.pack(t._name, t._array) for t in request._inputs]
            wire = M.request(request._request_id, request._correlation_id, request._flags, request._timeout,
                             request._parameters, request._requested_output_names or None, inputs)
            self.ch.send(M.bls(tag, request._model_name, int(request._model_version), wire, decoupled))
        return tag

    @reads(M.Response)
    def _bls_response(self, error: tuple | None, outputs: list | None,
                      parameters: dict | None) -> pb_utils.InferenceResponse:
        if error is not None:
            failure = M.Error.of(error)  # type: ignore[attr-defined]
            return pb_utils.InferenceResponse(error=pb_utils.TritonError(failure.message,
                                                                         CODES.index(Code[failure.code])))
        unpack, wrap = self.ch.unpack, pb_utils.Tensor._wrap
        response = pb_utils.InferenceResponse([wrap(*unpack(False, *record)) for record in outputs])  # type: ignore
        response._parameters = parameters or {}
        return response

    def exec(self, request: pb_utils.InferenceRequest, decoupled: bool) -> Any:
        waiter = _Waiter(decoupled=decoupled)
        tag = self._send_bls(request, decoupled, waiter)
        if not decoupled:
            return self._bls_response(*self._wait(waiter).response)

        def responses() -> Iterator[pb_utils.InferenceResponse]:
            while True:
                reply = self._wait(waiter)
                yield self._bls_response(*reply.response)
                if reply.final:
                    return

        return pb_utils.ResponseIterator(responses(), lambda: self.ch.send(M.bls_cancel(tag)))

    def async_exec(self, request: pb_utils.InferenceRequest, decoupled: bool) -> asyncio.Future:
        future = self.loop.create_future()
        self._send_bls(request, decoupled, _Waiter(future, decoupled))
        return future

    def _call(self, what: str, *args: Any) -> Any:
        waiter = _Waiter()
        tag = self._new_tag()
        self.waiters[tag] = waiter
        self.ch.send(M.call(tag, what, args))
        reply = self._wait(waiter)
        if not reply.ok:
            raise pb_utils.TritonModelException(reply.value)
        return reply.value

    def log(self, level: int, message: str) -> None:
        self.ch.send(M.log(level, message))

    def metric_family(self, name: str, description: str, kind: int) -> None:
        self._call("family", name, description, kind)

    def metric_new(self, family: str, labels: dict[str, str], buckets: list[float] | None) -> None:
        self._call("metric", family, labels, buckets)

    def metric_op(self, key: Any, op: str, value: float) -> float:
        if op == "value":
            return self._call("value", key)
        self.ch.send(M.metric(key, op, value))  # fire and forget: the server applies updates in order
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
            self.ch.send(M.finalized(error))
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


def _progress_word(fd: int | None) -> Any:
    """One shared 64-bit word (the server's memfd; a plain list when the server sent none)."""
    if fd is None:
        return [0]
    try:
        return memoryview(mmap.mmap(fd, 8)).cast("q")
    except (OSError, ValueError):
        return [0]
    finally:
        os.close(fd)


def main(argv: list[str]) -> int:
    _die_with_parent()
    sock = socket.socket(fileno=int(argv[0]))
    # A server that died before PR_SET_PDEATHSIG took hold left us to whoever reaps orphans: our parent is no
    # longer the pid it gave us. Not "our parent is 1": in a container the server itself is PID 1.
    if len(argv) > 1 and os.getppid() != int(argv[1]):
        return 1
    # The first message is the setup (JSON, whatever our Python version); wait for it before the loop exists.
    sock.setblocking(True)
    data = sock.recv(1 << 20)
    if not data:
        return 1
    init = M.decode_init(data)
    setup, ours = init.setup, M.reported_versions()
    try:
        codec = M.choose_codec(init.versions, ours)
    except M.ProtocolMismatch:
        sock.send(M.encode_hello(ours, ""))  # the server explains the refusal
        return 1
    sock.send(M.encode_hello(ours, codec.name))
    try:
        arena = Arena(setup["shm_default"], setup["shm_growth"])
    except InferError as exc:
        sock.send(codec.dumps(M.fail(exc.code.name, exc.message)))
        return 1
    worker = Worker(Channel(sock, arena, blocking=True, codec=codec), setup)
    if not worker.load(setup):
        sys.stdout.flush()
        os._exit(1)
    worker.run()
    return 0


if __name__ == "__main__":
    args = sys.argv[1:]
    del sys.argv[1:]  # a model sees no arguments, as in Triton's stub: unittest.main() in a model reads them
    sys.exit(main(args))
