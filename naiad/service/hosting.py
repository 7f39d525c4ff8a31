"""The model host's end of one front-end process's channel (``--frontend-processes N``): requests and calls come in
(``wire.py``), go to the face (``face.Service``) as a front end in this process would send them, and their answers
go back. Everything runs on the host's event loop; the channel is read with ``loop.add_reader``.

What a front end answers at once (health, server metadata, which regions are registered) it learns from here:
the state (``wire.State``) is pushed to every front end when it changes, before any answer that changed it (and at
once where an instance's readiness changed by itself: ``core/readiness.py``), and a heartbeat otherwise
(``Pulse``), so a front end knows the host stalled when it hears nothing. Nothing here waits on a front end without
a deadline: a front end that doesn't say within ``USES_SECONDS`` whether a request holds a region being
unregistered holds none it can still use (its copies close when it reads the unregister).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import socket
import weakref
from typing import Any, Awaitable, Callable

from naiad.core import readiness
from naiad.core.answer import Answer
from naiad.core.errors import Code, InferError, internal
from naiad.core.model_view import ModelView
from naiad.core.request import InferRequest, InferResponse
from naiad.service import calls, wire
from naiad.service.endpoint import BEAT_SECONDS, ChannelEnd
from naiad.service.face import Service
from naiad.service.precheck import Undo, undo

log = logging.getLogger("naiad")
_CONFIGS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # a version's config, serialized once

_INFER, _STREAM, _CANCEL, _CALL, _READY = (wire.INFER, wire.STREAM, wire.CANCEL,
                                           wire.CALL, wire.READY)
_RESULT, _REPLY, _USED, _STATS, _ENSURED = wire.RESULT, wire.REPLY, wire.USED, wire.STATS, wire.ENSURED
_TOUCH, _BEAT, _LOST = wire.TOUCH, wire.BEAT, wire.LOST
_FAULTS = (Code.INTERNAL, Code.UNAVAILABLE, Code.UNKNOWN)  # failures that may have changed a model's readiness
USES_SECONDS = 2.0  # how long an unregister waits for each front end to say which regions its requests hold
SILENT_SECONDS = 4 * BEAT_SECONDS  # a front end heard from by nothing for this long is not waited for
_OWN: dict[str, str] = {}  # the calls a link answers itself (it needs its own state), by name: its method's


def _handles(call: calls.Call) -> Callable[[Callable], Callable]:
    """Marks a link's method as the host's handler of ``call`` (the others go to the face method of its name)."""

    def mark(method: Callable) -> Callable:
        _OWN[call.name] = method.__name__
        return method

    return mark


def state_of(service: Service) -> tuple:
    """What front ends answer at once (a ``wire.State``), as the face answers it here."""
    models: dict[str, dict[str, bool]] = {}
    repository = service.repository
    if service.failure is None:
        for name, entry in repository.models.items():
            versions = {"": repository.is_ready(name)}
            for version in entry.versions:
                versions[str(version)] = repository.is_ready(name, str(version))
            models[name] = versions
    residency = service.residency
    return tuple(wire.State(
        wire.STATE, bool(service.live), service.is_ready(),
        None if service.failure is None else service.failure.message, models, service.server_id,
        service.control_mode, residency is not None, "" if residency is None else str(residency.models_root)))


class Pulse:
    """The host's heartbeat to its front ends: every ``BEAT_SECONDS`` the state where it changed, else a BEAT (which
    also carries what each link's arena announces: segments dropped at idle)."""

    def __init__(self, service: Service, loop: asyncio.AbstractEventLoop) -> None:
        self.service = service
        self.loop = loop
        self.links: set[Link] = set()
        self.state: tuple | None = None
        self._timer: asyncio.TimerHandle | None = None

    @staticmethod
    def of(service: Service, loop: asyncio.AbstractEventLoop) -> Pulse:
        pulse = getattr(service, "_pulse", None)
        if pulse is None or pulse.loop is not loop:
            pulse = Pulse(service, loop)
            service._pulse = pulse  # type: ignore[attr-defined]
        return pulse

    def add(self, link: Link) -> None:
        if not self.links:
            readiness.listen(self._readiness_changed)
        self.links.add(link)
        self.state = state_of(self.service)
        link.send(self.state)
        link.send(link.views())
        for region in self.service.shared_memory.regions.values():  # (a front end started again: what it missed)
            link.send((wire.REGION, region.name, region.key, region.offset, region.byte_size))
        if self._timer is None:
            self._timer = self.loop.call_later(BEAT_SECONDS, self._beat)

    def remove(self, link: Link) -> None:
        self.links.discard(link)
        if not self.links:
            readiness.forget(self._readiness_changed)

    def _readiness_changed(self) -> None:
        """An instance's readiness changed by itself (from any thread): the state goes out in the loop's next turn,
        not at the next beat."""
        if not self.loop.is_closed():
            self.loop.call_soon_threadsafe(self.refresh)

    def _beat(self) -> None:
        if not self.links:
            self._timer = None
            return
        self._timer = self.loop.call_later(BEAT_SECONDS, self._beat)
        state = state_of(self.service)
        message = (_BEAT,) if state == self.state else state
        self.state = state
        for link in list(self.links):
            link.send(message)

    def refresh(self) -> None:
        """Where the state changed since it was last sent (a request failed because its model's worker died: the
        model is not ready), every front end hears it now, before the answer that follows: a client told of the
        failure finds the model not ready through any of them, as through one process."""
        state = state_of(self.service)
        if state == self.state:
            return
        self.state = state
        for link in list(self.links):
            link.send(state)
            link._flush()

    def push(self, link: Link) -> None:
        """The state to ``link`` now (flushed: it precedes whatever answer follows on another link)."""
        self.state = state = state_of(self.service)
        link.send(state)


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
        self.pulse: Pulse | None = None
        self.heard = 0.0  # when the front end was last heard from (loop time): it beats every BEAT_SECONDS

    def attach(self, loop: asyncio.AbstractEventLoop) -> None:
        super().attach(loop)
        self.heard = loop.time()
        self.pulse = Pulse.of(self.service, loop)
        self.pulse.add(self)

    def _channel_lost(self) -> None:
        self.lost()

    def lost(self) -> None:
        """The front end is gone: what it had in flight here is cancelled, as a client that went away; its calls
        (numbered below zero) run to their end, as one process's do when their client goes: a load finishes."""
        if self.closed:
            return
        self.close()
        for id_, future in list(self.requests.items()):
            if id_ > 0:
                future.cancel()
        self.requests.clear()
        for future in self._uses.values():
            if not future.done():
                future.set_result([])  # a front end that is gone holds nothing
        self._uses.clear()
        self._on_lost(self)

    def close(self) -> None:
        self.closed = True
        self._stop_sweeping()
        if self.pulse is not None:
            self.pulse.remove(self)
        if self.loop is not None:
            try:
                self.loop.remove_reader(self.channel.sock.fileno())
                self.loop.remove_writer(self.channel.sock.fileno())
            except (ValueError, OSError):
                pass
        self.channel.close()

    # --- what comes from the front end --------------------------------------------------------------------------

    def _on_readable(self) -> None:
        self.heard = self.loop.time()  # type: ignore[union-attr]
        while True:
            try:
                messages = self._receive()
            except EOFError:
                self.lost()
                return
            if messages is None:
                return
            for message in messages:
                kind = message[0]
                if kind == _INFER:
                    try:
                        request = self._decode(message)
                    except Exception as exc:  # noqa: BLE001 - its tensors could not be read here
                        self._unread(message, exc)
                        continue
                    self._queue(message[1], request)
                elif kind == _CANCEL:
                    future = self.requests.pop(message[1], None)
                    if future is not None:
                        future.cancel()
                elif kind == _STREAM:
                    try:
                        request = self._decode(message)
                    except Exception as exc:  # noqa: BLE001
                        self._unread(message, exc)
                        continue
                    self._track(message[1], asyncio.ensure_future(self._stream(message[1], request)))
                elif kind == _CALL:
                    self._call(*message[1:])
                elif kind == _ENSURED:
                    self._ensured(message)
                elif kind == _TOUCH:
                    if self.service.sagemaker:
                        self.service.sagemaker_touch(message[1])
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
                elif kind == _LOST:
                    self._announce_again(message[1])

    def _unread(self, message: tuple, exc: BaseException) -> None:
        """A request whose tensors could not be read here: answered with the error (its stream ends with it)."""
        error = self._unreadable(exc)
        response = InferResponse(message[2], message[3], message[4], error=error)
        if message[0] == _STREAM:
            response.final = wire.REFUSED  # type: ignore[assignment]
        self._result(message[1], response)

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
            view = self.service.view(request.model_name, request.model_version)
        except InferError:
            view = None  # refused by the face in a moment, in its own words
        serving = None if view is None else view.handle
        if changed.handle is not None and serving is changed.handle:
            request.checked = serving
        else:
            request.checked = None
            undo(request, changed.changes)

    def _track(self, id_: int, future: asyncio.Future) -> None:
        self.requests[id_] = future
        future.add_done_callback(lambda f: self.requests.pop(id_, None) if self.requests.get(id_) is f else None)

    def _ensured(self, message: tuple) -> None:
        """A request for a SageMaker target model the front end holds a view of (from a load, or kept): a cache
        hit, queued at once, as one process queues it within the hit; where the model is no longer resident and
        ready (an eviction came since: another front end's load), a miss: loaded again first, and the request
        queued within that load."""
        try:
            request = self._decode(message)
        except Exception as exc:  # noqa: BLE001 - its tensors could not be read here
            self._unread(message, exc)
            return
        id_ = message[1]
        if not self._queue(id_, request, target=True):
            self._track(id_, asyncio.ensure_future(self._reload(id_, request)))

    async def _reload(self, id_: int, request: InferRequest) -> None:
        try:
            view = await self.service.sagemaker_ensure(request.model_name)
        except InferError as exc:
            self._result(id_, InferResponse(request.model_name, request.model_version, request.id, error=exc))
            return
        self._queue(id_, request, view)  # before anything else runs: the model is kept for it until then
        self._on_change()

    def _queue(self, id_: int, request: InferRequest, ensured: ModelView | None = None, target: bool = False
               ) -> bool:
        """A unary request to the face: answered by one RESULT, now (refused) or when it completes. A SageMaker
        target's (``target``, or ``ensured``: the view its load gave) goes by ``sagemaker_infer``: False where
        it missed (nothing queued)."""
        answer = Pending(self, id_)
        self.requests[id_] = answer
        try:
            if request.checked is not None:
                self.settle(request)
            if target or ensured is not None:
                if self.service.sagemaker_infer(request, ensured, answer) is None:  # type: ignore[arg-type]
                    self.requests.pop(id_, None)
                    return False
            else:
                self.service.infer(request, None, answer)  # type: ignore[arg-type]
        except InferError as exc:
            self.requests.pop(id_, None)
            self._result(id_, InferResponse(request.model_name, request.model_version, request.id, error=exc))
        return True

    def _result(self, id_: int, response: InferResponse) -> None:
        error = response.error
        pulse = self.pulse
        if pulse is not None and error is not None and error.code in _FAULTS:
            # Now, not in the loop's next turn as a readiness change is (core/readiness.py): the state goes before
            # this answer, so a client told of the failure finds the model not ready through any front end. (The
            # restart's end needs nothing here: its change is heard before the requests it lets run are answered.)
            pulse.refresh()
        self.send((_RESULT, id_, response.model_name, response.model_version, response.id,
                   self.records(response.outputs) if response.outputs else [], response.parameters,
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

    # --- calls: dispatched by their declarations (``calls.py``) --------------------------------------------------

    def _call(self, id_: int, method: str, args: tuple) -> None:
        call = calls.CALLS.get(method)
        if call is None:
            self.send((_REPLY, id_, False, ("InferError", "INTERNAL", f"no such call: {method}")))
            return
        try:
            own = _OWN.get(method)
            handler = getattr(self, own) if own is not None else getattr(self.service, method)
            value = handler(*call.receive(args))
            if inspect.isawaitable(value):
                task = asyncio.ensure_future(value)
                self._track(-id_, task)  # negative: calls and requests number apart
                task.add_done_callback(lambda t: self._called(id_, call, t))
                return
            self.send((_REPLY, id_, True, self._pack(call, value)))
        except Exception as exc:
            self.send((_REPLY, id_, False, error_value(exc)))

    def _called(self, id_: int, call: calls.Call, task: asyncio.Future) -> None:
        if task.cancelled():
            return
        if call.changes:
            self._on_change()  # before the answer: a client told "loaded" finds it loaded through any front end
        exc = task.exception()
        if exc is not None:
            self.send((_REPLY, id_, False, error_value(exc)))
            return
        self.send((_REPLY, id_, True, self._pack(call, task.result())))

    def _pack(self, call: calls.Call, value: Any) -> Any:
        """A call's answer as it crosses; a view numbered here (after the INVALIDATE its change sent)."""
        return self._wire_view(value) if call.answer is calls.VIEW else call.answer.pack(value)

    @_handles(calls.MODEL)
    def _model(self, name: str, version: str = "") -> ModelView:
        view = self.service.view(name, version)
        assert view is not None  # (the host's own face knows every view)
        return view

    @_handles(calls.SHM_REGISTER)
    def _shm_register(self, name: str, key: str, offset: int, byte_size: int) -> None:
        self.service.shared_memory.register(name, key, offset, byte_size)
        # Every front end learns of it before the client is answered: a request through any may name it.
        for link in self._peers():
            link.send((wire.REGION, name, key, offset, byte_size))
            if link is not self:
                link._flush()

    @_handles(calls.SHM_UNREGISTER)
    def _shm_unregister(self, name: str) -> Awaitable[None]:
        return self._unregister([name])

    @_handles(calls.SHM_UNREGISTER_ALL)
    def _shm_unregister_all(self) -> Awaitable[None]:
        return self._unregister(None)

    @_handles(calls.UPDATE_LOG_SETTINGS)
    async def _update_log_settings(self, changes: dict[str, Any]) -> None:
        await self.service.update_log_settings(changes)
        for link in self._peers():
            link.send((wire.LOGS, changes))  # each front end logs as the host does

    def _wire_view(self, view: ModelView) -> tuple:
        handle = view.handle
        config = _CONFIGS.get(handle)
        if config is None:
            config = _CONFIGS[handle] = handle.config.SerializeToString()
        self._next_version += 1
        self.versions[self._next_version] = view.handle
        return tuple(view)[:-1], self._next_version, config

    def invalidate(self) -> None:
        """The repository changed: the front end forgets its views, and the numbers they came with stand for
        nothing here any more (a request checked against one is checked again). The new state goes first, and
        now: a client answered through another front end finds the change here."""
        self.versions.clear()
        if self.pulse is not None:
            self.pulse.push(self)
        self.send((wire.INVALIDATE,))
        self.send(self.views())
        self._flush()

    def views(self) -> tuple:
        """A VIEWS message: every version that serves, by the names requests give it ("" for the policy's choice)."""
        service, out = self.service, []
        for name, entry in service.repository.models.items():
            for version in ("", *map(str, entry.versions)):
                try:
                    view = service.view(name, version)
                except InferError:
                    continue  # not served (loading, failed, unloaded): asked for, and refused, as a request comes
                if view is not None:
                    out.append((name, version, *self._wire_view(view)))
        return (wire.VIEWS, out)

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
        for held in await asyncio.gather(*(_held(link, names) for link in self._peers())):
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


async def _held(link: Link, names: list[str] | None) -> list[str]:
    """Which of ``names`` a request in ``link``'s front end holds; none, from one that doesn't say in time or has
    been silent for ``SILENT_SECONDS`` (a stopped process: its copies of the regions close when it reads the
    unregister, and a request there holding one keeps its own descriptor until it ends)."""
    assert link.loop is not None
    if link.loop.time() - link.heard > SILENT_SECONDS:
        return []  # stopped already (it beats every BEAT_SECONDS): not asked, as one that doesn't say in time
    try:
        return await asyncio.wait_for(link.uses(names), USES_SECONDS)
    except asyncio.TimeoutError:
        log.warning("a front-end process did not say within %.0f s whether it uses the shared-memory regions being "
                    "unregistered; unregistered anyway", USES_SECONDS)
        return []
