"""The server's side of one worker's messages: executions out, and everything the worker sends back routed
to where it belongs (execution results and streamed responses to their requests, BLS requests to the
server core, log lines to the log, metrics to the registry, calls answered).

Everything here runs on the server's event loop; the channel is read with ``loop.add_reader``, and an
execution completes through the scheduler's callback, called from the read callback (no task, no future, no
loop hop per request). Executions submitted during one turn of the loop leave in one datagram at its end,
so a busy server wakes its worker once per turn rather than once per request. The process behind the
channel (start, health, restarts) is ``process.py``'s business: it hands this router each new channel.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from typing import Any, Callable

import numpy as np

from naiad.backends.base import Core, Execution
from naiad.backends.python import messages as M
from naiad.backends.python import metrics
from naiad.backends.python.messages import Kind, reads
from naiad.backends.python.pb_utils import TRITONSERVER_RESPONSE_COMPLETE_FINAL as _FINAL
from naiad.backends.python.transport import _DTYPES, INLINE_TENSOR, TYPESTRS, Channel
from naiad.core.errors import Code, InferError, internal
from naiad.core.request import InferRequest, InferResponse

model_log = logging.getLogger("naiad.model")
EAGER_BACKOFF = 64  # sends (see Router._flush_turn)
_LEVELS = {0: logging.INFO, 1: logging.WARNING, 2: logging.ERROR, 3: logging.DEBUG}

Done = Callable[[Execution], None]
_EXECUTE, _INLINE, _TYPESTRS, _frombuffer, _now = (int(Kind.EXECUTE), INLINE_TENSOR, TYPESTRS, np.frombuffer,
                                                    time.perf_counter_ns)
# The execute path writes EXECUTE messages, their Request records and small Tensor records, and reads a DONE's
# Response and small Tensor records, as bare tuples (no call per request or tensor): in this order.
if (M.Execute._fields != ("kind", "tag", "requests")
        or M.Request._fields != ("id", "correlation_id", "flags", "timeout", "parameters", "requested", "inputs")
        or M.Tensor._fields != ("name", "dtype", "shape", "payload")
        or M.Response._fields != ("error", "outputs", "parameters")):
    raise ImportError("router.py's inline EXECUTE, Request, Response and Tensor records must follow messages.py's "
                      "fields")


class Pending:
    __slots__ = ("done", "requests", "input_ns", "open", "executed", "submitted", "early", "waiting")

    def __init__(self, done: Done | None, requests: list[InferRequest], input_ns: int, decoupled: bool,
                 submitted: int = 0) -> None:
        self.done = done  # called once with the Execution, then set to None
        self.requests = requests
        self.input_ns = input_ns
        # Decoupled requests stay open until their final response; others close with the execution.
        self.open = [True] * len(requests) if decoupled else None
        self.executed = False
        self.submitted = submitted  # when the scheduler handed it over (perf_counter_ns)
        # A non-decoupled model's answers sent through a response sender before execute returned: index -> answer.
        self.early: dict[int, InferResponse] | None = None
        # The execution ended before some of those answers came (execute returned None): it waits for them, with
        # the indexes still to come.
        self.waiting: tuple[Execution, set[int]] | None = None


class Router:
    """``died`` is called when the channel closes under it; ``resubmit`` takes executions submitted while
    the worker isn't ready, and those that never reached it, to run them on its replacement."""

    def __init__(self, name: str, model_name: str, model_version: int, decoupled: bool, core: Core | None,
                 died: Callable[[], None], resubmit: Callable[[list[InferRequest], Done], None]) -> None:
        self.name = name
        self.model_name = model_name
        self.version = str(model_version)
        self.decoupled = decoupled
        self.core = core
        self._died = died
        self._resubmit = resubmit
        self.ch: Channel | None = None
        self.ready = False  # set by the process's lifecycle: the worker takes executions
        self.loop: asyncio.AbstractEventLoop | None = None
        self.pending: dict[int, Pending] = {}
        self.calls: dict[int, Any] = {}  # BLS requests in flight for this worker: tag -> future or task
        self._tag = 0
        self._outbox: list[tuple] = []  # executions waiting for the end of this turn of the loop
        self._flush_handle: asyncio.Handle | None = None
        self._eager_skip = 0  # sends left before _flush_turn reads right after one again
        self.poisoned: Callable[[str], None] | None = None  # the worker's device is poisoned: the process's part
        self._routes = M.dispatch_table({
            Kind.DONE: self._executed, Kind.STREAM: self._streamed, Kind.LOG: self._log, Kind.METRIC: self._metric,
            Kind.CALL: self._call, Kind.BLS: self._bls, Kind.BLS_CANCEL: self._bls_cancel,
            Kind.POISONED: self._poisoned}, self._unexpected)

    def handle(self, message: tuple) -> None:
        """Route one message from the worker (the lifecycle calls this for those that arrive while the worker
        starts or stops; once it runs, ``on_readable`` routes them)."""
        self._routes[message[0]](*message)

    def _unexpected(self, kind: Any, *_: Any) -> None:
        try:
            kind = Kind(kind).name
        except ValueError:
            pass
        logging.getLogger("naiad.python").warning("model instance '%s' sent an unexpected %s message", self.name,
                                                  kind)

    # --- the channel --------------------------------------------------------------------------------------------

    def bind(self, ch: Channel) -> None:
        """Route the messages of a new worker's channel (after a start or restart); the channel calls
        ``on_blocked`` when its socket is full."""
        self.ch = ch

    def attach(self, loop: asyncio.AbstractEventLoop) -> None:
        assert self.ch is not None
        if self.ch.sock.fileno() < 0:  # closed before the loop took it (a server stopping while models load)
            return
        self.loop = loop
        loop.add_reader(self.ch.sock.fileno(), self.on_readable)

    def detach(self) -> None:
        """Stop watching the channel (before it closes: its descriptor number may be reused)."""
        ch, loop = self.ch, self.loop
        if loop is None or ch is None or ch.sock.fileno() < 0:
            return
        try:
            loop.remove_reader(ch.sock.fileno())
            loop.remove_writer(ch.sock.fileno())
        except Exception:
            pass  # the loop is closed

    def on_blocked(self) -> None:
        if self.loop is not None and self.ch is not None:
            self.loop.add_writer(self.ch.sock.fileno(), self._on_writable)

    def _on_writable(self) -> None:
        if self.ch is None or self.ch.flush():
            if self.loop is not None and self.ch is not None:
                self.loop.remove_writer(self.ch.sock.fileno())

    def reply(self, message: tuple) -> None:
        try:
            with self.ch.lock:  # type: ignore[union-attr]
                self.ch.send(message)  # type: ignore[union-attr]
        except (EOFError, AttributeError):
            pass

    # --- executions ----------------------------------------------------------------------------------------------

    def submit(self, requests: list[InferRequest], done: Done) -> None:
        """Send ``requests`` at the end of this turn of the loop; ``done(Execution)`` is called once."""
        if not self.ready:
            self._resubmit(requests, done)
            return
        ch = self.ch
        assert ch is not None
        if self.loop is None:
            self.attach(asyncio.get_running_loop())
        t0 = _now()
        tag = self._tag = self._tag + 1
        try:
            # Request and small Tensor records built inline (the fields' order is checked at import, above), others
            # by the channel, under its lock (packing allocates in the arena); loops, not comprehensions: each
            # comprehension is a call.
            wire = []
            for r in requests:
                records = []
                for n, a in r.inputs.items():
                    dtype = a.dtype
                    records.append((n, _TYPESTRS[dtype], a.shape, a.tobytes())
                                   if a.nbytes <= _INLINE and dtype.kind not in "OSU" else self._pack(n, a))
                wire.append((r.id, r.correlation_id, r.flags, r.timeout_us, r.parameters, r.requested_outputs,
                             records))
        except InferError as exc:  # shared memory exhausted: this execution fails, the worker lives on
            done(Execution([self.error(r, exc) for r in requests], failed=True))
            return
        self._outbox.append((_EXECUTE, tag, wire))
        if self._flush_handle is None:
            self._flush_handle = self.loop.call_soon(self._flush_turn)  # type: ignore[union-attr]
        self.pending[tag] = Pending(done, requests, _now() - t0, self.decoupled, t0)

    def _pack(self, name: str, array: np.ndarray) -> tuple:
        ch = self.ch
        with ch.lock:  # type: ignore[union-attr]
            return ch.pack(name, array)  # type: ignore[union-attr]

    def flush(self) -> None:
        """Send the executions submitted this turn, in one datagram."""
        self._flush_handle = None
        out = self._outbox
        if not out:
            return
        self._outbox = []
        try:
            self.ch.send_many(out)  # type: ignore[union-attr]
        except EOFError:
            # The worker died before they left: run them on its replacement, as a failed send always has.
            for message in out:
                pending = self.pending.pop(M.Execute.of(message).tag, None)  # type: ignore[attr-defined]
                if pending is not None and pending.done is not None:
                    done, pending.done = pending.done, None
                    self._resubmit(pending.requests, done)

    def _flush_turn(self) -> None:
        """The end of the loop's turn: send what was submitted, then read the answer at once if it came.

        On a busy core the worker preempts its sender and answers before the send returns (one connection, the
        worker and the server on one core): reading it here saves the loop's poll that would find it, a system call
        and a turn. When nothing had come, reads are left to the loop for the next ``EAGER_BACKOFF`` sends, so
        where the worker runs on a core of its own this costs one empty read now and then."""
        self.flush()
        if self._eager_skip:
            self._eager_skip -= 1
        elif self.pending and self.ch is not None and not self.on_readable():
            self._eager_skip = EAGER_BACKOFF

    def take_unsent(self) -> list[Pending]:
        """Executions still in the outbox (the worker died before they left), out of ``pending``."""
        unsent = [self.pending.pop(tag) for tag in (M.Execute.of(m).tag for m in self._outbox)  # type: ignore
                  if tag in self.pending]
        self._outbox = []
        return unsent

    def cancel(self, request: InferRequest) -> bool:
        self.flush()  # the execution must reach the worker before its cancellation does
        for tag, pending in self.pending.items():
            for index, candidate in enumerate(pending.requests):
                if candidate is request:
                    try:
                        self.ch.send(M.cancel(tag, index))  # type: ignore[union-attr]
                    except EOFError:
                        pass
                    return True
        return False

    def error(self, request: InferRequest, error: InferError | None) -> InferResponse:
        return InferResponse(self.model_name, self.version, request.id, error=error)

    def fail_pending(self, why: str, started: int | None = None) -> list[Pending]:
        """Fail the executions sent to the worker; with ``started`` (the tag of the last one a dead worker
        began), return those after it instead, unfailed: they never ran, and may run elsewhere."""
        pending, self.pending = self.pending, {}
        unstarted = []
        if started is not None:
            for tag in [t for t, entry in pending.items() if t > started and not entry.executed]:
                unstarted.append(pending.pop(tag))
        error = internal(why)
        for entry in pending.values():
            responses = [self.error(r, error) for r in entry.requests]
            if entry.open is not None:
                for index, request in enumerate(entry.requests):
                    if entry.open[index]:
                        self._respond(request, self.error(request, error), True)
            done = entry.done
            if done is not None:
                entry.done = None
                done(Execution(responses, failed=True))
        calls, self.calls = self.calls, {}
        for call in calls.values():
            call.cancel()
        return unstarted

    # --- incoming ------------------------------------------------------------------------------------------------

    def on_readable(self) -> bool:
        """Route what the worker sent; False if nothing had come."""
        # A datagram at a time, and another only while answers are still due: after the last one, trying again
        # would be a system call that finds nothing (the loop's poll reports anything else that comes).
        ch, routes = self.ch, self._routes
        came = False
        while True:
            try:
                messages = ch.receive(one=True)  # type: ignore[union-attr]
            except EOFError:
                self._died()
                return True
            if not messages:
                return came
            came = True
            for message in messages:
                routes[message[0]](*message)
            if not self.pending or self.ch is not ch:
                return True

    @reads(M.Done)
    def _executed(self, kind: int, tag: int, error: tuple | None, responses: list | None, input_ns: int,
                  infer_ns: int, output_ns: int, free_ns: int, rescheduled: list | None) -> None:
        pending = self.pending.get(tag)
        if pending is None:
            return
        if (error is not None or responses is None or rescheduled is not None or pending.open is not None
                or pending.early is not None or pending.done is None or None in responses):
            self._executed_otherwise(pending, tag, error, responses, input_ns, infer_ns, output_ns, free_ns,
                                     rescheduled)
            return
        # The usual execution: a response per request, all in this DONE. Decoded inline: small tensors read in
        # place from the message's bytes (as ``Channel.unpack`` does), others through it.
        t0 = _now()
        del self.pending[tag]
        model_name, version, unpack = self.model_name, self.version, self.ch.unpack  # type: ignore[union-attr]
        answers = []
        for request, (failure, outputs, parameters) in zip(pending.requests, responses):
            if failure is not None:
                answers.append(InferResponse(model_name, version, request.id, error=_error(*failure)))
                continue
            arrays = {}
            for name, dtype, shape, payload in outputs:
                if type(payload) is bytes and dtype != "BYTES":
                    array = _frombuffer(payload, _DTYPES[dtype])
                    arrays[name] = array if len(shape) == 1 else array.reshape(shape)
                else:
                    arrays[name] = unpack(False, name, dtype, shape, payload)[1]
            answers.append(InferResponse(model_name, version, request.id, arrays, parameters))
        done, pending.done = pending.done, None
        pending.executed = True
        # Triton's phases: queue until the instance starts the execution (here: when it was handed over, or, had
        # the worker not finished the one before by then, when it had); compute covers the instance's whole work,
        # the round trip to the worker counted as infer.
        end = _now()
        started = pending.submitted if pending.submitted > free_ns else free_ns
        input_ns += pending.input_ns
        output_ns += end - t0
        whole = end - started - input_ns - output_ns
        done(Execution(answers, input_ns, whole if whole > infer_ns else infer_ns, output_ns, False, started))

    def _executed_otherwise(self, pending: Pending, tag: int, error: tuple | None, responses: list | None,
                            input_ns: int, infer_ns: int, output_ns: int, free_ns: int,
                            rescheduled: list | None) -> None:
        """An execution that failed, a decoupled one, or one whose requests were (some) answered through their
        senders or rescheduled."""
        t0 = _now()
        requests = pending.requests
        failed: bool | str = error is not None
        if error is not None:
            failure = _error(*error)
            if failure.code is Code.CANCELLED:  # the worker skipped it: all its requests were cancelled first
                failed = "CANCELED"
            answers = [self.error(r, failure) for r in requests]
            if pending.open is not None:
                for index, request in enumerate(requests):
                    if pending.open[index]:
                        pending.open[index] = False
                        self._respond(request, self.error(request, failure), True)
        elif responses is None:  # decoupled: the responses travel on their own
            answers = [self.error(r, None) for r in requests]
        elif pending.early is None and rescheduled is None and None not in responses:
            response = self._response
            answers = [response(r, *w) for r, w in zip(requests, responses)]
        else:
            answers = self._special(pending, responses)
        if rescheduled is not None and pending.open is not None:
            for index in rescheduled:  # it comes back as a new execution, with its own place here
                pending.open[index] = False
        pending.executed = True
        later = None
        if error is None and responses is not None and None in responses:  # some answered through their senders
            early, again = pending.early or {}, rescheduled or ()
            later = {i for i, w in enumerate(responses) if w is None and i not in early and i not in again} or None
        if later is None and (pending.open is None or not any(pending.open)):
            del self.pending[tag]
        done = pending.done
        if done is not None:
            if later is None:
                pending.done = None
            end = _now()  # (the phases as in _executed)
            started = max(pending.submitted, free_ns)
            input_ns += pending.input_ns
            output_ns += end - t0
            whole = end - started - input_ns - output_ns
            execution = Execution(answers, input_ns, max(whole, infer_ns), output_ns,
                                  failed=failed, started_ns=started, rescheduled=rescheduled)
            if later is not None:  # answers still to come through their senders
                pending.waiting = (execution, later)
                return
            done(execution)

    def _special(self, pending: Pending, responses: list) -> list[InferResponse]:
        """Answers where some were sent through a response sender (kept from then) or rescheduled (placeholders
        the scheduler does not deliver)."""
        early = pending.early or {}
        answers = []
        for index, (request, wire) in enumerate(zip(pending.requests, responses)):
            if wire is not None:
                answers.append(self._response(request, *wire))
            else:
                answers.append(early.get(index) or self.error(request, None))
        return answers

    @reads(M.Stream)
    def _streamed(self, kind: int, tag: int, request_index: int, response: tuple | None, flags: int) -> None:
        pending = self.pending.get(tag)
        index = request_index
        if pending is not None and pending.open is None:
            self._answer_early(tag, pending, index, response)
            return
        if pending is None or pending.open is None or not pending.open[index]:
            return
        request = pending.requests[index]
        final = bool(flags & _FINAL)
        if response is None:
            answer = InferResponse(self.model_name, self.version, request.id)
        else:
            answer = self._response(request, *response)
        if final:
            pending.open[index] = False
            if pending.executed and not any(pending.open):
                del self.pending[tag]
        self._respond(request, answer, final)

    def _answer_early(self, tag: int, pending: Pending, index: int, response: tuple | None) -> None:
        """A non-decoupled model's one response through its sender: it goes to the client now (the model version
        set ``responder`` for this) and stands as the request's answer in its execution, which may have ended
        already (execute returned None) and waits for it."""
        if pending.early is None:
            pending.early = {}
        if index in pending.early or response is None or index >= len(pending.requests):
            return
        request = pending.requests[index]
        answer = self._response(request, *response)
        pending.early[index] = answer
        if request.responder is not None:
            request.responder(answer)
        if pending.waiting is not None:
            execution, left = pending.waiting
            execution.responses[index] = answer
            left.discard(index)
            if not left:
                pending.waiting = None
                self.pending.pop(tag, None)
                done, pending.done = pending.done, None
                if done is not None:
                    done(execution)

    @staticmethod
    def _respond(request: InferRequest, response: InferResponse, final: bool) -> None:
        response.final = final
        responder = request.responder
        if responder is not None:
            responder(response)

    @reads(M.Response)
    def _response(self, request: InferRequest, error: tuple | None, outputs: list | None,
                  parameters: dict | None) -> InferResponse:
        if error is not None:
            return InferResponse(self.model_name, self.version, request.id, error=_error(*error))
        unpack = self.ch.unpack  # type: ignore[union-attr]
        arrays = {}
        for record in outputs:  # type: ignore[union-attr]
            name, array = unpack(False, *record)
            arrays[name] = array
        return InferResponse(self.model_name, self.version, request.id, arrays, parameters)

    def _arrays(self, records: list) -> dict[str, Any]:
        unpack = self.ch.unpack  # type: ignore[union-attr]
        arrays = {}
        for record in records:
            name, array = unpack(False, *record)
            arrays[name] = array
        return arrays

    @reads(M.Poisoned)
    def _poisoned(self, kind: int, cause: str) -> None:
        """The worker found its device poisoned and exits after the answer behind this: nothing more goes to it."""
        if self.poisoned is not None:
            self.poisoned(cause)  # (the process's part: not ready, as listeners hear)
        self.ready = False

    # --- logs, metrics and calls ----------------------------------------------------------------------------------

    @reads(M.Log)
    def _log(self, kind: int, level: int, text: str) -> None:
        model_log.log(_LEVELS.get(level, logging.INFO), "%s", text)

    @reads(M.Metric)
    def _metric(self, kind: int, key: Any, op: str, value: float) -> None:
        metrics.REGISTRY.apply(key, op, value)

    @reads(M.Call)
    def _call(self, kind: int, tag: int, what: str, args: tuple) -> None:
        try:
            value: Any = None
            if what == "family":
                name, description, family_kind = args
                metrics.REGISTRY.family(name, description, family_kind, owner=f"{self.model_name}/{self.version}")
            elif what == "metric":
                metrics.REGISTRY.metric(*args)
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
            self.reply(M.call_reply(tag, False, str(getattr(exc, "message", exc))))
            return
        self.reply(M.call_reply(tag, True, value))

    async def _reply_when_done(self, tag: int, pending: Any, op: str) -> None:
        try:
            value = await pending
        except Exception as exc:  # the model hears about it (in python_backend's words); the server keeps serving
            message = exc.message if isinstance(exc, InferError) else f"{type(exc).__name__}: {exc}"
            self.reply(M.call_reply(tag, False, f"Failed to {op} model: Failed to process the request for model "
                                                f"'{self.name}', message: {message}"))
            return
        self.reply(M.call_reply(tag, True, value))

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

    # --- BLS: a worker's request to another model goes through the server core ----------------------------------

    @reads(M.Bls)
    def _bls(self, kind: int, tag: int, model: str, version: int, request: tuple, decoupled: bool) -> None:
        call = self._bls_request(model, version, *request)
        core = self.core
        if core is None:
            self._bls_error(tag, "UNAVAILABLE", "BLS is not available: the model runs outside a server")
            return
        if decoupled:
            self.calls[tag] = asyncio.ensure_future(self._bls_stream(tag, core, call))
            return
        try:
            future = core.infer(call)
        except InferError as exc:
            self._bls_error(tag, exc.code.name, exc.message)
            return
        self.calls[tag] = future
        future.add_done_callback(lambda f: self._bls_done(tag, f))

    @reads(M.Request)
    def _bls_request(self, model: str, version: int, id: str, correlation_id: Any, flags: int, timeout: int,
                     parameters: dict, requested: list | None, inputs: list) -> InferRequest:
        request = InferRequest(model, str(version) if version >= 0 else "", id, self._arrays(inputs), requested,
                               parameters)
        request.correlation_id = correlation_id
        request.flags = flags
        request.timeout_us = timeout
        return request

    @reads(M.BlsCancel)
    def _bls_cancel(self, kind: int, tag: int) -> None:
        call = self.calls.pop(tag, None)
        if call is not None:
            call.cancel()

    def _bls_error(self, tag: int, code: str, text: str) -> None:
        self.reply(M.bls_reply(tag, M.error_response(code, text), True))

    def _bls_done(self, tag: int, future: asyncio.Future) -> None:
        self.calls.pop(tag, None)
        if future.cancelled():
            self._bls_error(tag, "CANCELLED", "the BLS request was cancelled")
            return
        self._send_bls_response(tag, future.result(), True)

    async def _bls_stream(self, tag: int, core: Core, request: InferRequest) -> None:
        try:
            async for response in core.stream(request):
                self._send_bls_response(tag, response, response.final)
        except InferError as exc:
            self._bls_error(tag, exc.code.name, exc.message)
        except asyncio.CancelledError:
            self._bls_error(tag, "CANCELLED", "the BLS request was cancelled")
        finally:
            self.calls.pop(tag, None)

    def _send_bls_response(self, tag: int, response: InferResponse, final: bool) -> None:
        ch = self.ch
        if ch is None or ch.closed:
            return
        try:
            with ch.lock:
                if response.error is not None:
                    wire = M.error_response(response.error.code.name, response.error.message)
                else:
                    wire = M.response(None, [ch.pack(n, a) for n, a in response.outputs.items()],
                                      response.parameters)
                ch.send(M.bls_reply(tag, wire, final))
        except InferError as exc:
            self._bls_error(tag, exc.code.name, exc.message)
        except EOFError:
            pass


@reads(M.Error)
def _error(code: str, message: str) -> InferError:
    return InferError(message, Code[code])
