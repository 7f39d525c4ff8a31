"""The model host's end of one front-end process's channel (``--frontend-processes N``): requests and calls come in
(``wire.py``), go to the face (``face.Service``) as a front end in this process would send them, and their answers
go back. Everything runs on the host's event loop; the channel is read with ``loop.add_reader``.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import socket
from typing import Any, Callable

from naiad.core.answer import Answer
from naiad.core.errors import InferError, internal
from naiad.core.model_view import ModelView
from naiad.core.request import InferRequest, InferResponse
from naiad.repository.consent import CodeConsent
from naiad.service import wire
from naiad.service.endpoint import ChannelEnd
from naiad.service.face import Service
from naiad.service.precheck import Undo, undo

log = logging.getLogger("naiad")

_INFER, _STREAM, _CANCEL, _CALL, _READY = (wire.INFER, wire.STREAM, wire.CANCEL,
                                           wire.CALL, wire.READY)
_RESULT, _REPLY, _USED, _STATS, _ENSURED = wire.RESULT, wire.REPLY, wire.USED, wire.STATS, wire.ENSURED


def error_value(exc: BaseException) -> tuple[str, str, str]:
    if not isinstance(exc, InferError):
        log.exception("a front end's call failed", exc_info=exc)
        exc = internal(str(exc) or type(exc).__name__)
    return type(exc).__name__, exc.code.name, exc.message


class Changed:
    """A request's ``checked`` until ``Link.settle``: the version a front end checked it against, and what that
    check changed in it."""

    __slots__ = ("handle", "changes")

    def __init__(self, handle: Any, changes: Undo) -> None:
        self.handle = handle
        self.changes = changes


class Pending(Answer):
    """A front end's unary request at the host: answered (within ``set_result``), it is queued for the front end,
    with no asyncio future, loop callback or closure per request. Nothing awaits it; cancelled, the front end
    expects no answer (its client went away, or it is gone)."""

    __slots__ = ("id", "link")

    def __init__(self, link: Link, id_: int) -> None:
        super().__init__()
        self.link = link
        self.id = id_

    def set_result(self, response: InferResponse) -> None:
        super().set_result(response)
        link = self.link
        if link.requests.pop(self.id, None) is self:
            link._result(self.id, response)


class Link(ChannelEnd):
    """One front-end process, as the host sees it: its channel and the requests it has in flight here."""

    def __init__(self, service: Service, sock: socket.socket, on_lost: Callable[[Link], None],
                 on_change: Callable[[], None], on_unregister: Callable[[list[str] | None], None],
                 peers: Callable[[], list[Link]]) -> None:
        self.service = service
        self._open(sock)
        self._on_lost = on_lost
        self._on_change = on_change
        self._on_unregister = on_unregister
        self._peers = peers
        self._uses: dict[int, asyncio.Future] = {}  # USES asked of this front end, by number
        self._next_use = 0
        self.ready = asyncio.Event()
        self.on_ready: Callable[[], None] | None = None
        # Unary answers and stream / call tasks, by the front end's id.
        self.requests: dict[int, Pending | asyncio.Future] = {}
        # The versions whose views the front end holds, by the number each view came with: a request checked
        # against one names it (``wire.Request.checked``). Until the next INVALIDATE, when its views go.
        self.versions: dict[int, Any] = {}
        self._next_version = 0

    def _channel_lost(self) -> None:
        self.lost()

    def lost(self) -> None:
        """The front end is gone: what it had in flight here is cancelled, as a client that went away."""
        if self.closed:
            return
        self.close()
        for future in list(self.requests.values()):
            future.cancel()
        self.requests.clear()
        for future in self._uses.values():
            if not future.done():
                future.set_result([])  # a front end that is gone holds nothing
        self._uses.clear()
        self._on_lost(self)

    def close(self) -> None:
        self.closed = True
        if self.loop is not None:
            try:
                self.loop.remove_reader(self.channel.sock.fileno())
                self.loop.remove_writer(self.channel.sock.fileno())
            except (ValueError, OSError):
                pass
        self.channel.close()

    # --- what comes from the front end --------------------------------------------------------------------------

    def _on_readable(self) -> None:
        try:
            messages = self.channel.receive()
        except EOFError:
            self.lost()
            return
        for message in messages:
            kind = message[0]
            if kind == _INFER:
                self._queue(message[1], self._decode(message))
            elif kind == _CANCEL:
                future = self.requests.pop(message[1], None)
                if future is not None:
                    future.cancel()
            elif kind == _STREAM:
                self._track(message[1], asyncio.ensure_future(self._stream(message[1], self._decode(message))))
            elif kind == _CALL:
                self._call(*message[1:])
            elif kind == _ENSURED:
                self._ensured(message)
            elif kind == _STATS:
                self._add_stats(message)
            elif kind == _USED:
                future = self._uses.pop(message[1], None)
                if future is not None and not future.done():
                    future.set_result(message[2])
            elif kind == _READY:
                self.ready.set()
                if self.on_ready is not None:
                    self.on_ready()

    def _add_stats(self, message: tuple) -> None:
        if not self.service.sagemaker:
            return
        _, invocations, errors_4xx, errors_5xx, ml_count, ml_sum, ol_count, ol_sum = message
        stats = self.service.sagemaker_stats()
        stats.invocations += invocations
        stats.errors_4xx += errors_4xx
        stats.errors_5xx += errors_5xx
        stats.model_latency.count += ml_count
        stats.model_latency.sum_us += ml_sum
        stats.overhead_latency.count += ol_count
        stats.overhead_latency.sum_us += ol_sum

    def _decode(self, message: tuple) -> InferRequest:
        """A request (``wire.Request``) as the face takes it, straight from the message (the hot path: no
        intermediate objects)."""
        (_, _, name, version, request_id, inputs, requested, parameters, correlation_id, flags, priority,
         timeout_us, raw_input, checked, batch_size, changes) = message
        unpack = self.channel.unpack
        arrays = {}
        for record in inputs:
            input_name, array = unpack(False, *record)
            arrays[input_name] = array
        request = InferRequest(name, version, request_id, arrays, requested, parameters)
        request.correlation_id = correlation_id
        request.flags = flags
        request.priority = priority
        request.timeout_us = timeout_us
        request.raw_input = raw_input
        if checked:
            # The version the front end checked it against: that version's submit skips the check; any other
            # (the policy's choice moved on, or the number is from before an INVALIDATE: None) checks it.
            request.batch_size = batch_size
            handle = self.versions.get(checked)
            # A check that changed the request holds only where its version serves it: ``settle`` decides, just
            # before the request is queued (without one, a version that checks again finds it as it came).
            request.checked = handle if changes is None else Changed(handle, changes)
        return request

    def settle(self, request: InferRequest) -> None:
        """Just before ``request`` is queued (nothing may run in between): where the front end's check changed it
        (reshapes, raw input) for a version that no longer serves it, put it back as its client sent it, to be
        checked by the version that does."""
        changed = request.checked
        if type(changed) is not Changed:
            return
        try:
            serving = self.service.model(request.model_name, request.model_version).handle
        except InferError:
            serving = None  # refused by the face in a moment, in its own words
        if changed.handle is not None and serving is changed.handle:
            request.checked = serving
        else:
            request.checked = None
            undo(request, changed.changes)

    def _track(self, id_: int, future: asyncio.Future) -> None:
        self.requests[id_] = future
        future.add_done_callback(lambda f: self.requests.pop(id_, None) if self.requests.get(id_) is f else None)

    def _ensured(self, message: tuple) -> None:
        """A request for a SageMaker target model the front end's hit or load made resident: queued, as one
        process queues it within the hit or the load; where an eviction came in between (another front end's
        load), the model is loaded again first, and the request queued within that load."""
        id_, request = message[1], self._decode(message)
        if self.service.sagemaker_touch(request.model_name):
            self._queue(id_, request)
        else:
            self._track(id_, asyncio.ensure_future(self._reload(id_, request)))

    async def _reload(self, id_: int, request: InferRequest) -> None:
        try:
            await self.service.sagemaker_ensure(request.model_name)
        except InferError as exc:
            self._result(id_, InferResponse(request.model_name, request.model_version, request.id, error=exc))
            return
        self._queue(id_, request)  # before anything else runs: the model is kept for it until then
        self._on_change()

    def _queue(self, id_: int, request: InferRequest) -> None:
        """A unary request to the face: answered by one RESULT, now (refused) or when it completes."""
        answer = Pending(self, id_)
        self.requests[id_] = answer
        try:
            if request.checked is not None:
                self.settle(request)
            self.service.infer(request, None, answer)  # type: ignore[arg-type]
        except InferError as exc:
            self.requests.pop(id_, None)
            self._result(id_, InferResponse(request.model_name, request.model_version, request.id, error=exc))

    def _result(self, id_: int, response: InferResponse) -> None:
        error = response.error
        pack = self.channel.pack
        self.send((_RESULT, id_, response.model_name, response.model_version, response.id,
                   [pack(name, array) for name, array in response.outputs.items()], response.parameters,
                   None if error is None else (type(error).__name__, error.code.name, error.message),
                   response.final))

    async def _stream(self, id_: int, request: InferRequest) -> None:
        try:
            self.settle(request)  # (the stream's first step queues the request: nothing runs in between)
            async for response in self.service.stream(request):
                self._result(id_, response)
                if response.final:
                    return
        except InferError as exc:
            response = InferResponse(request.model_name, request.model_version, request.id, error=exc)
            response.final = wire.REFUSED  # type: ignore[assignment]
            self._result(id_, response)

    # --- calls --------------------------------------------------------------------------------------------------

    def _call(self, id_: int, method: str, args: tuple) -> None:
        if method not in wire.CALLS:
            self.send((_REPLY, id_, False, ("InferError", "INTERNAL", f"no such call: {method}")))
            return
        try:
            if method == "model":
                self.send((_REPLY, id_, True, self._view(*args)))
                return
            if method == "sagemaker_hit":  # (hit, its View where the front end wants one)
                target, want = args
                view = self.service.sagemaker_hit(target)
                self.send((_REPLY, id_, True, (view is not None, self._wire_view(view) if want and view else None)))
                return
            if method == "load_model" and args[3] is not None:
                args = (*args[:3], CodeConsent(*args[3]))
            if method in ("shm_register", "shm_status", "shm_cuda_status", "shm_cuda_register"):
                self.send((_REPLY, id_, True, getattr(self.service.shared_memory, method[4:])(*args)))
                return
            if method in ("shm_unregister", "shm_unregister_all"):
                task = asyncio.ensure_future(self._unregister(list(args) if args else None))
                task.add_done_callback(lambda t: self._called(id_, method, t))
                return
            value = getattr(self.service, method)
            if callable(value):
                value = value(*args)
            if inspect.isawaitable(value):
                task = asyncio.ensure_future(value)
                self._track(-id_, task)  # negative: calls and requests number apart
                task.add_done_callback(lambda t: self._called(id_, method, t))
                return
        except Exception as exc:
            self.send((_REPLY, id_, False, error_value(exc)))
            return
        if method == "update_log_settings":
            for link in self._peers():
                link.send((wire.LOGS, args[0]))  # each front end logs as the host does
        self.send((_REPLY, id_, True, plain(method, value)))

    def _view(self, name: str, version: str = "") -> tuple:
        """A "model" call's answer (``wire.View``): the view, and what the front end checks its requests with."""
        return self._wire_view(self.service.model(name, version))

    def _wire_view(self, view: ModelView) -> tuple:
        config = view.handle.config.SerializeToString()
        self._next_version += 1
        self.versions[self._next_version] = view.handle
        return tuple(view)[:-1], self._next_version, config

    def invalidate(self) -> None:
        """The repository changed: the front end forgets its views, and the numbers they came with stand for
        nothing here any more (a request checked against one is checked again)."""
        self.versions.clear()
        self.send((wire.INVALIDATE,))

    def uses(self, names: list[str] | None) -> "asyncio.Future[list[str]]":
        """Ask the front end which of ``names`` (None: all) a request there holds."""
        assert self.loop is not None
        future: asyncio.Future[list[str]] = self.loop.create_future()
        if self.closed:
            future.set_result([])
            return future
        self._next_use += 1
        self._uses[self._next_use] = future
        self.send((wire.USES, self._next_use, names))
        return future

    async def _unregister(self, names: list[str] | None) -> None:
        """Unregister as one registry would, a region held by a request in any front end refused in Triton's
        words; every front end closes its copies before the client is answered."""
        busy: set[str] = set()
        for held in await asyncio.gather(*(link.uses(names) for link in self._peers())):
            busy.update(held)
        registry = self.service.shared_memory
        if names is not None:
            (name,) = names
            if name in busy:
                raise internal(f"Cannot unregister shared memory region '{name}', it is currently in use.")
            registry.unregister(name)
            self._on_unregister([name])
            return
        dropped, failed = [], []
        for name in sorted(registry.regions):
            if name in busy:
                failed.append(name)
            else:
                registry.unregister(name)
                dropped.append(name)
        self._on_unregister(dropped)
        if failed:
            raise internal("Failed to unregister the following system shared memory regions: "
                           + "".join(f"{name} ," for name in failed))

    def _called(self, id_: int, method: str, task: asyncio.Future) -> None:
        if task.cancelled():
            return
        if method in wire.CHANGES:
            self._on_change()  # before the answer: a client told "loaded" finds it loaded through any front end
        exc = task.exception()
        if exc is not None:
            self.send((_REPLY, id_, False, error_value(exc)))
            return
        value = task.result()
        if method == "sagemaker_ensure":
            value = self._wire_view(value)  # the view taken as the load ended, numbered after the INVALIDATE
        self.send((_REPLY, id_, True, plain(method, value)))


def plain(method: str, value: Any) -> Any:
    """A call's result as marshal carries it."""
    if method == "model_config_message":
        return value.SerializeToString()
    if method == "sagemaker_models_root":
        return str(value)
    return value
