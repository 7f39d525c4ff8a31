"""The face in a front-end process (``--frontend-processes N``): every method of ``Service``, answered by the model
host over one channel (``wire.py``). Front ends can't tell it from the in-process face.

Inference is asynchronous: a request goes out as one datagram (tensors in shared memory when large) and its
future is resolved when the host's RESULT comes; a client that goes away cancels it there. At most
``MAX_IN_FLIGHT`` requests are at the host at once; more wait here, each in its client's connection, so a slow
host slows clients down instead of growing memory. A request is checked here against its model version's
signature before it goes (``precheck.py``, built from what came with the view), so the host need not. Other calls
are rare (health, metadata, control): a synchronous one waits for its REPLY on the channel, handling whatever else
arrives meanwhile.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import select
import socket
from collections import deque
from functools import partial
from pathlib import Path
from typing import Any, AsyncIterator, Callable

from naiad.config import ModelConfig
from naiad.core.errors import Code, InferError, internal, unavailable
from naiad.core.model_view import ModelView
from naiad.core.request import InferRequest, InferResponse
from naiad.core.settings import LogSettings
from naiad.core.shared_memory import SharedMemoryRegistry
from naiad.repository.consent import CodeConsent
from naiad.core.cache_stats import Timing
from naiad.sagemaker.contract import ArchiveError, UrlRefused
from naiad.sagemaker.counters import EndpointStats
from naiad.service import wire
from naiad.service.endpoint import ChannelEnd
from naiad.service.face import Service
from naiad.service.precheck import Precheck

log = logging.getLogger("naiad")

MAX_IN_FLIGHT = 4096  # requests at the host at once, from one front end
CALL_TIMEOUT = 600.0  # seconds a synchronous call waits for the host (a load may take long)
_ERRORS = {cls.__name__: cls for cls in (InferError, UrlRefused, ArchiveError)}
_RESULT, _REPLY, _INVALIDATE, _SHM, _USES, _LOGS = (wire.RESULT, wire.REPLY, wire.INVALIDATE, wire.SHM, wire.USES,
                                                wire.LOGS)


def error_of(value: tuple[str, str, str]) -> InferError:
    kind, code, message = value
    return _ERRORS.get(kind, InferError)(message, Code[code])


class SharedRegistry(SharedMemoryRegistry):
    """The host's registry, as one front end sees it: registrations go to the host (which checks them, caps them
    and answers status), and each front end opens a region itself, by its key, the first time a request names it
    here. The host tells every front end when a region goes (``SHM``), before it answers the unregister."""

    def __init__(self, service: RemoteService) -> None:
        super().__init__()
        self.service = service

    def register(self, name: str, key: str, offset: int, byte_size: int) -> None:
        self.service._call("shm_register", name, key, offset, byte_size)
        self._open(name, key, offset, byte_size)

    def _open(self, name: str, key: str, offset: int, byte_size: int) -> None:
        self.forget([name])
        try:
            super().register(name, key, offset, byte_size)
        except InferError:
            pass  # the host holds it; this front end tries again when a request names it

    def unregister(self, name: str) -> None:
        self.service._call("shm_unregister", name)  # the host asks every front end whether a request holds it

    def unregister_all(self) -> None:
        self.service._call("shm_unregister_all")

    def in_use(self, names: list[str] | None) -> list[str]:
        """Which of ``names`` (None: all) a request in this process holds."""
        held = [name for name in (list(self.regions) if names is None else names)
                if name in self.regions and self.regions[name].users]
        if held:
            gc.collect()  # a finished request's hold may wait in cyclic garbage
            held = [name for name in held if self.regions[name].users]
        return held

    def status(self, name: str = "") -> list[dict[str, Any]]:
        return self.service._call("shm_status", name)  # type: ignore[no-any-return]

    def cuda_status(self, name: str = "") -> list[dict[str, Any]]:
        return self.service._call("shm_cuda_status", name)  # type: ignore[no-any-return]

    def cuda_register(self, name: str) -> None:
        self.service._call("shm_cuda_register", name)

    def find(self, name: str, offset: int, byte_size: int) -> Any:
        if name not in self.regions:
            try:
                (found,) = self.service._call("shm_status", name)
            except InferError:
                found = None
            if found is not None:
                self._open(name, found["key"], found["offset"], found["byte_size"])
        return super().find(name, offset, byte_size)

    def forget(self, names: list[str] | None) -> None:
        """Close this front end's copies of regions the host dropped (None: all)."""
        for name in list(self.regions) if names is None else names:
            region = self.regions.pop(name, None)
            if region is not None:
                region.close()


class _Timing(Timing):
    def __init__(self, changed: Callable[[], None]) -> None:
        super().__init__()
        self.changed = changed

    def add(self, seconds: float) -> None:
        super().add(seconds)
        self.changed()


class ForwardedStats(EndpointStats):
    """The SageMaker front end's counters in this process; each change is sent to the host's at the end of the
    loop's turn (before the client can ask /metrics), and these start again from zero."""

    def __init__(self, changed: Callable[[], None]) -> None:
        super().__init__(model_latency=_Timing(changed), overhead_latency=_Timing(changed))
        object.__setattr__(self, "changed", changed)

    def __setattr__(self, name: str, value: Any) -> None:
        object.__setattr__(self, name, value)
        changed = self.__dict__.get("changed")  # (None while the dataclass's __init__ sets the fields)
        if changed is not None and name in ("invocations", "errors_4xx", "errors_5xx"):
            changed()

    def take(self) -> tuple:
        """The counts since the last take, as a STATS message; zero again."""
        ml, ol = self.model_latency, self.overhead_latency
        message = (wire.STATS, self.invocations, self.errors_4xx, self.errors_5xx, ml.count, ml.sum_us, ol.count,
                   ol.sum_us)
        for name in ("invocations", "errors_4xx", "errors_5xx"):
            object.__setattr__(self, name, 0)
        ml.count = ol.count = 0
        ml.sum_us = ol.sum_us = 0.0
        return message


class RemoteService(ChannelEnd, Service):
    def __init__(self, sock: socket.socket, on_lost: Callable[[], None]) -> None:  # noqa: no super().__init__
        self._open(sock)
        self._on_lost = on_lost
        self._next_id = 0
        # Unary requests at the host: their future, and the callback that tells the host when one is cancelled
        # (taken off before the answer is set, so an answered request costs no loop callback).
        self._unary: dict[int, tuple[asyncio.Future, Callable[[asyncio.Future], None]]] = {}
        self._queues: dict[int, asyncio.Queue] = {}
        self._calls: dict[int, Any] = {}  # async calls: future; synchronous: None until the reply
        self._waiting: deque[tuple[int, tuple]] = deque()  # over MAX_IN_FLIGHT, in order
        self._unsent: set[int] = set()  # their ids, until sent (or withdrawn: the client went away)
        self._active = 0
        self._views: dict[tuple[str, str], ModelView] = {}
        self._invalidated = 0  # INVALIDATEs so far
        self._idle: asyncio.Event | None = None
        self.accepting = True  # this front end's own: False once it drains
        self.failure = None
        self.residency = None
        self.shared_memory: SharedRegistry = SharedRegistry(self)
        self.log_settings = LogSettings()  # this process's logging, as the host's (``configure``; LOGS)
        self.stats = ForwardedStats(self._stats_changed)  # SageMaker's invocation counters, summed by the host
        self._stats_due = False

    def _channel_lost(self) -> None:
        if self.loop is not None:
            try:
                self.loop.remove_reader(self.channel.sock.fileno())
            except (ValueError, OSError):
                pass
        self._on_lost()

    def _stats_changed(self) -> None:
        if not self._stats_due and self.loop is not None:
            self._stats_due = True
            self.loop.call_soon(self._send_stats)

    def _send_stats(self) -> None:
        self._stats_due = False
        self.send(self.stats.take())

    def _id(self) -> int:
        self._next_id += 1
        return self._next_id

    # --- what comes from the host -------------------------------------------------------------------------------

    def _on_readable(self) -> None:
        try:
            messages = self.channel.receive()
        except EOFError:
            self._channel_lost()
            return
        for message in messages:
            kind = message[0]
            if kind == _RESULT:
                self._result(message)
            elif kind == _REPLY:
                _, id_, ok, value = message
                future = self._calls.get(id_)
                if future is None:
                    self._calls[id_] = (ok, value)
                else:
                    del self._calls[id_]
                    if not future.done():
                        future.set_result((ok, value))
            elif kind == _INVALIDATE:
                self._views.clear()
                self._invalidated += 1
            elif kind == _SHM:
                self.shared_memory.forget(message[1])
            elif kind == _LOGS:
                self.log_settings.update(**message[1])
            elif kind == _USES:
                self.send((wire.USED, message[1], self.shared_memory.in_use(message[2])))

    def _result(self, message: tuple) -> None:
        _, id_, name, version, response_id, outputs, parameters, error, final = message
        unpack = self.channel.unpack
        arrays = {}
        for record in outputs:
            output_name, array = unpack(False, *record)
            arrays[output_name] = array
        response = InferResponse(name, version, response_id, arrays, parameters,
                                 None if error is None else error_of(error))
        response.final = final
        unary = self._unary.pop(id_, None)
        if unary is not None:
            future, on_cancel = unary
            future.remove_done_callback(on_cancel)
            self._done()
            if not future.done():
                future.set_result(response)
            return
        queue = self._queues.get(id_)
        if queue is not None:
            queue.put_nowait(response)  # (in flight until the stream's reader took the last: see ``stream``)

    def _done(self, sent: bool = True) -> None:
        if sent:
            self._active -= 1
        while self._waiting and self._active < MAX_IN_FLIGHT:
            id_, message = self._waiting.popleft()
            if id_ in self._unsent:
                self._unsent.discard(id_)
                self._active += 1
                self.send(message)
        if self._idle is not None and not self.in_flight:
            self._idle.set()

    def _withdraw(self, id_: int) -> bool:
        """Whether ``id_`` was still waiting here (it never reached the host); it won't now."""
        if id_ in self._unsent:
            self._unsent.discard(id_)
            return True
        return False

    # --- inference ----------------------------------------------------------------------------------------------

    def _request(self, kind: int, id_: int, request: InferRequest, view: ModelView | None) -> tuple:
        """``request`` as a ``wire.Request``, checked here first when the view came from the host with its
        signature (the host then skips its check)."""
        check = None if view is None else view.handle
        checked, undo = (0, None) if check is None else check.run(request)
        pack = self.channel.pack
        return (kind, id_, request.model_name, request.model_version, request.id,
                [pack(name, array) for name, array in request.inputs.items()], request.requested_outputs,
                request.parameters, request.correlation_id, request.flags, request.priority, request.timeout_us,
                request.raw_input, checked, request.batch_size, undo)

    def _forward(self, id_: int, message: tuple) -> None:
        if self._active < MAX_IN_FLIGHT:
            self._active += 1
            self.send(message)
        else:
            self._unsent.add(id_)
            self._waiting.append((id_, message))

    def infer(self, request: InferRequest, view: ModelView | None = None,
              future: asyncio.Future[InferResponse] | None = None) -> "asyncio.Future[InferResponse]":
        if not self.accepting:
            raise unavailable("Server is not ready to accept requests (shutting down)")
        if view is None:
            view = self.model(request.model_name, request.model_version)
        if view.decoupled:
            raise InferError(f"model '{view.name}' uses the decoupled transaction policy: its responses can only be "
                             "streamed (gRPC ModelStreamInfer, HTTP generate_stream, BLS exec(decoupled=True))",
                             Code.UNSUPPORTED)
        return self._send_unary(wire.INFER, request, view, future)

    def _send_unary(self, kind: int, request: InferRequest, view: ModelView,
                    future: asyncio.Future[InferResponse] | None = None) -> "asyncio.Future[InferResponse]":
        """A request answered by one RESULT: its future resolved then, the host told if it is cancelled first."""
        assert self.loop is not None
        id_ = self._id()
        if future is None:
            future = self.loop.create_future()
        on_cancel = partial(self._cancelled, id_)
        self._unary[id_] = (future, on_cancel)
        future.add_done_callback(on_cancel)
        self._forward(id_, self._request(kind, id_, request, view))
        return future

    def _cancelled(self, id_: int, future: asyncio.Future) -> None:
        """``future`` is done before its answer came: cancelled (by its front end: the client went away)."""
        if future.cancelled() and self._unary.pop(id_, None) is not None:
            sent = not self._withdraw(id_)
            if sent:
                self.send((wire.CANCEL, id_))
            self._done(sent)

    async def stream(self, request: InferRequest, view: ModelView | None = None) -> AsyncIterator[InferResponse]:
        if not self.accepting:
            raise unavailable("Server is not ready to accept requests (shutting down)")
        id_ = self._id()
        queue: asyncio.Queue[InferResponse] = asyncio.Queue()
        self._queues[id_] = queue
        self._forward(id_, self._request(wire.STREAM, id_, request, view))
        ended = False
        try:
            while True:
                response = await queue.get()
                ended = bool(response.final)
                if response.final == wire.REFUSED:  # refused before the model: raised, as the face raises it
                    assert response.error is not None
                    raise response.error
                yield response
                if response.final:
                    return
        finally:
            del self._queues[id_]
            sent = not self._withdraw(id_)
            if sent and not ended:  # the client went away before the last response
                self.send((wire.CANCEL, id_))
            self._done(sent)

    @property
    def in_flight(self) -> int:
        return len(self._unary) + len(self._queues)

    def cut(self, message: str) -> int:
        return 0  # the host answers what is left in flight; its answers still come through here

    # --- calls --------------------------------------------------------------------------------------------------

    def _call(self, method: str, *args: Any) -> Any:
        """A synchronous call: send it, then read the channel (answering whatever else comes) until its reply."""
        id_ = self._id()
        self._calls[id_] = None
        self._out.append((wire.CALL, id_, method, args))
        self._flush()  # now, after what was queued before it
        sock = self.channel.sock
        while self._calls.get(id_) is None:
            writing = [sock] if self.channel._backlog else []
            readable, writable, _ = select.select([sock], writing, [], CALL_TIMEOUT)
            if writable:
                self.channel.flush()
            if readable:
                self._on_readable()
                self._flush()  # what it answered meanwhile (the host may be waiting for it: USED)
            elif not writable:
                del self._calls[id_]
                raise unavailable("the model host did not answer")
            if self.channel.closed:
                raise unavailable("the model host is gone")
        ok, value = self._calls.pop(id_)
        if not ok:
            raise error_of(value)
        return value

    async def _call_async(self, method: str, *args: Any) -> Any:
        assert self.loop is not None
        id_ = self._id()
        future = self.loop.create_future()
        self._calls[id_] = future
        self.send((wire.CALL, id_, method, args))
        try:
            ok, value = await future
        finally:
            self._calls.pop(id_, None)
        if not ok:
            raise error_of(value)
        return value

    def model(self, name: str, version: str = "") -> ModelView:
        view = self._views.get((name, version))
        if view is None:
            fields, number, config = self._call("model", name, version)  # (a wire.View)
            view = self._views[(name, version)] = ModelView._make((*fields, Precheck(number, config)))
        return view

    @property  # type: ignore[override]
    def live(self) -> bool:
        return bool(self._call("live"))

    @live.setter
    def live(self, value: bool) -> None:
        pass  # the host's

    @property  # type: ignore[override]
    def server_id(self) -> str:
        return str(self._call("server_id"))

    @server_id.setter
    def server_id(self, value: str) -> None:
        pass

    def is_ready(self) -> bool:
        return self.accepting and bool(self._call("is_ready"))

    def server_metadata(self) -> dict[str, Any]:
        return self._call("server_metadata")  # type: ignore[no-any-return]

    def model_ready(self, name: str, version: str = "") -> bool:
        return bool(self._call("model_ready", name, version))

    def model_metadata(self, name: str, version: str = "") -> dict[str, Any]:
        return self._call("model_metadata", name, version)  # type: ignore[no-any-return]

    def model_config(self, name: str, version: str = "") -> dict[str, Any]:
        return self._call("model_config", name, version)  # type: ignore[no-any-return]

    def model_config_message(self, name: str, version: str = "") -> ModelConfig:
        config = ModelConfig()
        config.ParseFromString(self._call("model_config_message", name, version))
        return config

    def model_statistics(self, name: str = "", version: str = "") -> dict[str, Any]:
        return self._call("model_statistics", name, version)  # type: ignore[no-any-return]

    def repository_index(self, ready_only: bool = False) -> list[dict[str, str]]:
        return self._call("repository_index", ready_only)  # type: ignore[no-any-return]

    async def load_model(self, name: str, config: str | None = None, files: dict[str, bytes] | None = None,
                         consent: CodeConsent | None = None) -> None:
        await self._call_async("load_model", name, config, files,
                               None if consent is None else (consent.keyed, consent.restrict))

    async def unload_model(self, name: str, unload_dependents: bool = False) -> None:
        await self._call_async("unload_model", name, unload_dependents)

    @property
    def control_mode(self) -> str:
        return str(self._call("control_mode"))

    def model_metrics(self, quantiles: list[float] | None = None) -> list[dict[str, Any]]:
        return self._call("model_metrics", quantiles)  # type: ignore[no-any-return]

    @property
    def sagemaker(self) -> bool:
        return bool(self._call("sagemaker"))

    def sagemaker_models(self) -> list[dict[str, Any]]:
        return self._call("sagemaker_models")  # type: ignore[no-any-return]

    def sagemaker_model(self, key: str) -> dict[str, Any] | None:
        return self._call("sagemaker_model", key)  # type: ignore[no-any-return]

    async def sagemaker_load(self, key: str, url: str, target: str) -> None:
        await self._call_async("sagemaker_load", key, url, target)

    async def sagemaker_unload(self, key: str) -> None:
        await self._call_async("sagemaker_unload", key)

    def sagemaker_touch(self, name: str) -> bool:
        return bool(self._call("sagemaker_touch", name))

    def sagemaker_hit(self, target: str) -> ModelView | None:
        # The view comes with the answer where none is kept here: no second call (in which an eviction could
        # come) between the hit and the request.
        view = self._views.get((target, ""))
        seen = self._invalidated
        hit, fresh = self._call("sagemaker_hit", target, view is None)
        if not hit:
            return None
        return view if fresh is None else self._resident_view(target, fresh, seen)

    async def sagemaker_ensure(self, target: str) -> ModelView:
        seen = self._invalidated
        return self._resident_view(target, await self._call_async("sagemaker_ensure", target), seen)

    def _resident_view(self, target: str, fresh: tuple, seen: int) -> ModelView:
        """A view that came with a hit or a load; kept unless the views were invalidated since the call went (it
        may be stale then: good for this request, which the host checks and loads again as needed)."""
        fields, number, config = fresh
        view = ModelView._make((*fields, Precheck(number, config)))
        if self._invalidated == seen:
            self._views[(target, "")] = view
        return view

    def sagemaker_infer(self, request: InferRequest, view: ModelView) -> asyncio.Future[InferResponse]:
        """As ``infer``, sent as ``ENSURED``: the host marks the model used, or loads it again first where an
        eviction came since the hit or the load that gave ``view``."""
        if not self.accepting:
            raise unavailable("Server is not ready to accept requests (shutting down)")
        return self._send_unary(wire.ENSURED, request, view)

    def sagemaker_stats(self) -> EndpointStats:
        return self.stats

    def sagemaker_models_root(self) -> Path:
        return Path(self._call("sagemaker_models_root"))

    def sagemaker_metrics(self) -> dict[str, Any]:
        raise internal("the metrics page is served by the model host")

    def trace_settings(self, model: str = "") -> dict[str, Any]:
        return self._call("trace_settings", model)  # type: ignore[no-any-return]

    def update_trace_settings(self, model: str, changes: dict[str, Any]) -> None:
        self._call("update_trace_settings", model, changes)

    def log_settings_values(self) -> dict[str, Any]:
        return self._call("log_settings_values")  # type: ignore[no-any-return]

    def update_log_settings(self, changes: dict[str, Any]) -> None:
        self._call("update_log_settings", changes)

    def dashboard_feed(self, port: str) -> dict[str, Any]:
        return self._call("dashboard_feed", port)  # type: ignore[no-any-return]

    def close(self) -> None:
        if not self.channel.closed:
            self._flush()
        if self.loop is not None:
            try:
                self.loop.remove_reader(self.channel.sock.fileno())
                self.loop.remove_writer(self.channel.sock.fileno())
            except (ValueError, OSError):
                pass
        self.channel.close()
        self.shared_memory.close()


def lost_host(index: int) -> Callable[[], None]:
    """What a front end does when the host is gone: exit at once (its requests can't be answered); the first
    front end says why, once."""

    host = os.getppid()

    def lost() -> None:
        if index == 0:
            os.write(2, f"error: the model host (pid {host}) is gone; front-end processes exit\n".encode())
        os._exit(1)

    return lost
