"""The face in a front-end process (``--frontend-processes N``): every method of ``Service``, answered by the model
host over one channel (``wire.py``). Front ends can't tell it from the in-process face.

Nothing here blocks the event loop, and nothing waits without a deadline:
- health (``live``, ``is_ready``, ``model_ready``) and server metadata are answered at once from the state the host
  pushes (``hosting.Pulse``); a host heard from by no message for ``STALL_SECONDS`` has stalled, and health says
  "not ready" until it is heard again;
- every other call is a coroutine that awaits its REPLY for at most its declared deadline (``calls.py``: a
  minute; ten for loads and unloads), then answers UNAVAILABLE;
- inference is asynchronous: a request goes out as one datagram (tensors in shared memory when large, inline when
  shared memory runs short) and its future is resolved when the host's RESULT comes; a client that goes away
  cancels it there. A request with a timeout whose answer hasn't come when it expires, from a host that has
  stalled, is answered "Request timeout expired" (UNAVAILABLE) here, and cancelled there.

At most ``MAX_IN_FLIGHT`` requests are at the host at once; more wait here, each in its client's connection, so a
slow host slows clients down instead of growing memory. A request is checked here against its model version's
signature before it goes (``precheck.py``, built from what came with the view), so the host need not.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from collections import deque
from functools import partial
from pathlib import Path
from typing import Any, AsyncIterator, Callable

import naiad
from naiad.core.errors import Code, InferError, internal, unavailable
from naiad.core.model_view import ModelView
from naiad.core.request import InferRequest, InferResponse
from naiad.core.settings import LogSettings
from naiad.sagemaker.contract import ArchiveError, UrlRefused
from naiad.sagemaker.counters import EndpointStats
from naiad.service import calls, wire
from naiad.service.endpoint import BEAT_SECONDS, ChannelEnd
from naiad.service.face import EXTENSIONS, Draining
from naiad.service.mirrors import ForwardedStats, SharedRegistry
from naiad.service.precheck import Precheck

log = logging.getLogger("naiad")

MAX_IN_FLIGHT = 4096  # requests at the host at once, from one front end
STALL_SECONDS = 1.0  # a host heard from by nothing for this long has stalled (it beats every 0.25 s)
TIMEOUT_EXPIRED = "Request timeout expired"  # Triton's words for a request whose timeout ran out before it ran
_ERRORS = {cls.__name__: cls for cls in (InferError, UrlRefused, ArchiveError)}
_RESULT, _REPLY, _INVALIDATE, _SHM, _USES, _LOGS = (wire.RESULT, wire.REPLY, wire.INVALIDATE, wire.SHM, wire.USES,
                                                wire.LOGS)
_STATE, _REGION, _BEAT, _LOST, _VIEWS = wire.STATE, wire.REGION, wire.BEAT, wire.LOST, wire.VIEWS


def error_of(value: tuple[str, str, str]) -> InferError:
    kind, code, message = value
    return _ERRORS.get(kind, InferError)(message, Code[code])


class RemoteService(ChannelEnd, Draining):
    def __init__(self, sock: socket.socket, on_lost: Callable[[], None]) -> None:
        self._open(sock)
        self._on_lost = on_lost
        self._next_id = 0
        # Unary requests at the host: their future, and the callback that tells the host when one is cancelled
        # (taken off before the answer is set, so an answered request costs no loop callback).
        self._unary: dict[int, tuple[asyncio.Future, Callable[[asyncio.Future], None]]] = {}
        self._queues: dict[int, asyncio.Queue] = {}
        self._calls: dict[int, asyncio.Future] = {}
        self._waiting: deque[tuple[int, tuple]] = deque()  # over MAX_IN_FLIGHT, in order
        self._unsent: set[int] = set()  # their ids, until sent (or withdrawn: the client went away)
        self._active = 0
        self._views: dict[tuple[str, str], ModelView] = {}
        self._pushed: dict[tuple[str, str], tuple] = {}  # views the host pushed (VIEWS), made on first use
        self._failure: str | None = None  # the host's, from its state
        self._invalidated = 0  # INVALIDATEs so far
        self._idle: asyncio.Event | None = None
        self._state: tuple | None = None  # the host's last wire.State
        self._heard = 0.0  # when the host was last heard from (loop time)
        self._reading = False
        self.accepting = True  # this front end's own: False once it drains
        self.shared_memory: SharedRegistry = SharedRegistry()
        self.log_settings = LogSettings()  # this process's logging, as the host's (``configure``; LOGS)
        self.stats = ForwardedStats(self._stats_changed)  # SageMaker's invocation counters, summed by the host
        self._stats_due = False
        self._beater: asyncio.TimerHandle | None = None

    def attach(self, loop: asyncio.AbstractEventLoop) -> None:
        super().attach(loop)
        self._heard = loop.time()
        self._beater = loop.call_later(BEAT_SECONDS, self._beat)

    def _beat(self) -> None:
        """Say it is there: the host kills and restarts a front end it has not heard from for a while (stopped, or
        its loop stuck), as this one says "not ready" for a host it hasn't heard from."""
        if self.closed or self.loop is None:
            return
        self._beater = self.loop.call_later(BEAT_SECONDS, self._beat)
        self.send((_BEAT,))

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
        if self._reading:  # (a catch-up from within a message's handling: the outer read carries on)
            return
        self._reading = True
        heard = False
        try:
            while True:
                try:
                    messages = self._receive()
                except EOFError:
                    self._channel_lost()
                    return
                if messages is None:
                    if heard:
                        self._heard = self.loop.time()  # type: ignore[union-attr]
                    return
                heard = True
                for message in messages:
                    kind = message[0]
                    if kind == _RESULT:
                        self._result(message)
                    elif kind == _REPLY:
                        _, id_, ok, value = message
                        future = self._calls.pop(id_, None)
                        if future is not None and not future.done():
                            future.set_result((ok, value))
                    elif kind == _BEAT:
                        pass
                    elif kind == _STATE:
                        self._state = message
                        self._failure = message[3]
                    elif kind == _INVALIDATE:
                        self._views.clear()
                        self._pushed.clear()
                        self._invalidated += 1
                    elif kind == _VIEWS:
                        for name, version, *view in message[1]:
                            self._pushed[(name, version)] = view
                    elif kind == _REGION:
                        self.shared_memory.learn(*message[1:])
                    elif kind == _SHM:
                        self.shared_memory.forget(message[1])
                    elif kind == _LOGS:
                        self.log_settings.update(**message[1])
                    elif kind == _USES:
                        self.send((wire.USED, message[1], self.shared_memory.in_use(message[2])))
                    elif kind == _LOST:
                        self._announce_again(message[1])
        finally:
            self._reading = False

    def _catch_up(self) -> None:
        """Read what the host sent and this loop has not yet read (without waiting): where an answer read from the
        pushed state may be stale (a change through another front end, answered to its client already)."""
        if self.loop is not None and not self.closed:
            self._on_readable()

    def _result(self, message: tuple) -> None:
        _, id_, name, version, response_id, outputs, parameters, error, final = message
        unpack = self.channel.unpack
        arrays = {}
        failure: InferError | None = None
        try:
            for record in outputs:
                output_name, array = unpack(False, *record)
                arrays[output_name] = array
        except Exception as exc:  # noqa: BLE001 - its tensors could not be read here (descriptors ran out)
            arrays = {}
            failure = self._unreadable(exc)
        else:
            failure = None if error is None else error_of(error)
        response = InferResponse(name, version, response_id, arrays, parameters, failure)
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

    # --- the host's state: health, answered at once -------------------------------------------------------------

    def stalled(self) -> bool:
        """Whether the host has said nothing for ``STALL_SECONDS`` (stopped, or its loop stuck)."""
        assert self.loop is not None
        if self.loop.time() - self._heard <= STALL_SECONDS:
            return False
        self._catch_up()  # (or this loop was the busy one: what came meanwhile counts)
        return self.loop.time() - self._heard > STALL_SECONDS

    def _known(self) -> tuple:
        if self._state is None:
            self._catch_up()
            if self._state is None:
                raise unavailable("Server not ready")  # (the host's first state comes before any front end serves)
        return self._state

    @property
    def live(self) -> bool:
        return self._state is not None and bool(self._state[1])

    @property
    def failure(self) -> InferError | None:
        return None if self._failure is None else unavailable(self._failure)

    @property
    def server_id(self) -> str:
        return str(self._known()[5])

    def server_metadata(self) -> dict[str, Any]:
        return {"name": self.server_id, "version": naiad.__version__, "extensions": EXTENSIONS}

    @property
    def control_mode(self) -> str:
        return str(self._known()[6])

    @property
    def sagemaker(self) -> bool:
        return bool(self._known()[7])

    def sagemaker_models_root(self) -> Path:
        return Path(self._known()[8])

    # Health reads what the host sent and this loop has not yet read, whichever way the pushed state points: a
    # change may have been answered to a client through another front end already (a model loaded there, or made
    # not ready by a fault: the host sends the state to every front end before that answer), and this query may be
    # read in the same turn of the loop as the state that precedes it.

    def is_ready(self) -> bool:
        if not self.accepting:
            return False
        self._catch_up()
        return self._state is not None and bool(self._state[2]) and not self.stalled()

    def model_ready(self, name: str, version: str = "") -> bool:
        self._catch_up()
        self._check_created()
        state = self._state
        return state is not None and bool(state[4].get(name, {}).get(version, False)) and not self.stalled()

    # --- inference ----------------------------------------------------------------------------------------------

    def _request(self, kind: int, id_: int, request: InferRequest, view: ModelView | None) -> tuple:
        """``request`` as a ``wire.Request``, checked here first when the view came from the host with its
        signature (the host then skips its check)."""
        check = None if view is None else view.handle
        checked, undo = (0, None) if check is None else check.run(request)
        return (kind, id_, request.model_name, request.model_version, request.id, self.records(request.inputs),
                request.requested_outputs, request.parameters, request.correlation_id, request.flags,
                request.priority, request.timeout_us, request.raw_input, checked, request.batch_size, undo)

    def _forward(self, id_: int, message: tuple) -> None:
        if self._active < MAX_IN_FLIGHT:
            self._active += 1
            self.send(message)
        else:
            self._unsent.add(id_)
            self._waiting.append((id_, message))

    def _check_created(self) -> None:
        if self._failure is not None:
            raise unavailable("Server not ready")

    def view(self, name: str, version: str = "") -> ModelView | None:
        if self._failure is not None:
            raise unavailable("Server not ready")
        view = self._views.get((name, version))
        if view is None:
            pushed = self._pushed.pop((name, version), None)
            if pushed is not None:
                fields, number, config = pushed
                view = self._views[(name, version)] = ModelView._make((*fields, Precheck(number, config)))
        return view

    def infer(self, request: InferRequest, view: ModelView | None = None,
              future: asyncio.Future[InferResponse] | None = None) -> "asyncio.Future[InferResponse]":
        if not self.accepting:
            raise unavailable("Server is not ready to accept requests (shutting down)")
        if view is None:
            view = self._views.get((request.model_name, request.model_version))  # (else: sent unchecked)
        if view is not None and view.decoupled:
            raise InferError(f"model '{view.name}' uses the decoupled transaction policy: its responses can only be "
                             "streamed (gRPC ModelStreamInfer, HTTP generate_stream, BLS exec(decoupled=True))",
                             Code.UNSUPPORTED)
        return self._send_unary(wire.INFER, request, view, future)

    def _send_unary(self, kind: int, request: InferRequest, view: ModelView | None,
                    future: asyncio.Future[InferResponse] | None = None) -> "asyncio.Future[InferResponse]":
        """A request answered by one RESULT: its future resolved then, the host told if it is cancelled first."""
        assert self.loop is not None
        id_ = self._id()
        message = self._request(kind, id_, request, view)
        if future is None:
            future = self.loop.create_future()
        on_cancel = partial(self._cancelled, id_)
        self._unary[id_] = (future, on_cancel)
        future.add_done_callback(on_cancel)
        self._forward(id_, message)
        if request.timeout_us:
            self.loop.call_later(request.timeout_us / 1e6, self._expire, id_, request)
        return future

    def _cancelled(self, id_: int, future: asyncio.Future) -> None:
        """``future`` is done before its answer came: cancelled (by its front end: the client went away)."""
        if future.cancelled() and self._unary.pop(id_, None) is not None:
            sent = not self._withdraw(id_)
            if sent:
                self.send((wire.CANCEL, id_))
            self._done(sent)

    def _expire(self, id_: int, request: InferRequest) -> None:
        """``request``'s timeout ran out and its answer hasn't come: the host decides while it is there (a request
        running when its timeout expires still gets its answer, as in Triton), this front end when it has stalled."""
        unary = self._unary.get(id_)
        if unary is None:
            return
        if not self.stalled():
            self.loop.call_later(STALL_SECONDS, self._expire, id_, request)  # type: ignore[union-attr]
            return
        del self._unary[id_]
        future, on_cancel = unary
        future.remove_done_callback(on_cancel)
        sent = not self._withdraw(id_)
        if sent:
            self.send((wire.CANCEL, id_))  # (read when the host is back: it drops the request)
        self._done(sent)
        if not future.done():
            future.set_result(InferResponse(request.model_name, request.model_version, request.id,
                                            error=unavailable(TIMEOUT_EXPIRED)))

    async def stream(self, request: InferRequest, view: ModelView | None = None) -> AsyncIterator[InferResponse]:
        if not self.accepting:
            raise unavailable("Server is not ready to accept requests (shutting down)")
        id_ = self._id()
        queue: asyncio.Queue[InferResponse] = asyncio.Queue()
        self._queues[id_] = queue
        try:
            self._forward(id_, self._request(wire.STREAM, id_, request, view))
        except BaseException:
            del self._queues[id_]
            raise
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

    # --- calls: each built from its declaration (``calls.py``) ---------------------------------------------------

    async def call(self, call: calls.Call, args: tuple) -> Any:
        """Ask the host; its answer (as it crossed), or UNAVAILABLE when none comes within the call's deadline."""
        assert self.loop is not None
        id_ = self._id()
        future = self.loop.create_future()
        self._calls[id_] = future
        self.send((wire.CALL, id_, call.name, args))
        try:
            ok, value = await asyncio.wait_for(future, call.seconds)
        except asyncio.TimeoutError:
            raise unavailable(f"the model host did not answer within {call.seconds:.0f} s") from None
        finally:
            self._calls.pop(id_, None)
        if not ok:
            raise error_of(value)
        return value

    async def model(self, name: str, version: str = "") -> ModelView:
        view = self.view(name, version)
        if view is None:
            seen = self._invalidated
            view = self._kept((name, version), await self.call(calls.MODEL, (name, version)), seen)
        return view

    def _kept(self, key: tuple[str, str], fresh: tuple, seen: int) -> ModelView:
        """A view that came from the host (a ``wire.View``); kept unless the views were invalidated since the call
        went (it may be stale then: good for this request, which the host checks again as needed)."""
        fields, number, config = fresh
        view = ModelView._make((*fields, Precheck(number, config)))
        if self._invalidated == seen:
            self._views[key] = view
        return view

    model_metadata = calls.MODEL_METADATA.remote()
    model_config = calls.MODEL_CONFIG.remote()
    model_config_message = calls.MODEL_CONFIG_MESSAGE.remote()
    model_statistics = calls.MODEL_STATISTICS.remote()
    repository_index = calls.REPOSITORY_INDEX.remote()
    load_model = calls.LOAD_MODEL.remote()
    unload_model = calls.UNLOAD_MODEL.remote()

    def model_metrics(self, quantiles: list[float] | None = None) -> list[dict[str, Any]]:
        raise internal("the metrics page is served by the model host")

    sagemaker_models = calls.SAGEMAKER_MODELS.remote()
    sagemaker_model = calls.SAGEMAKER_MODEL.remote()
    sagemaker_load = calls.SAGEMAKER_LOAD.remote()
    sagemaker_unload = calls.SAGEMAKER_UNLOAD.remote()

    def sagemaker_touch(self, name: str) -> bool:
        self.send((wire.TOUCH, name))
        return True  # (the host knows whether it is resident; nothing here depends on it)

    async def sagemaker_ensure(self, target: str) -> ModelView:
        seen = self._invalidated
        return self._kept((target, ""), await self.call(calls.SAGEMAKER_ENSURE, (target,)), seen)

    def sagemaker_infer(self, request: InferRequest, view: ModelView | None = None,
                        future: asyncio.Future[InferResponse] | None = None
                        ) -> tuple[ModelView, asyncio.Future[InferResponse]] | None:
        """Sent as ``ENSURED`` where the target's view is known here (None: await ``sagemaker_ensure``): the host
        counts the hit, marks the model used and queues it, or loads it again first where an eviction came since
        (no call either way)."""
        if view is None:
            view = self.view(request.model_name)
            if view is None:
                return None
        if not self.accepting:
            raise unavailable("Server is not ready to accept requests (shutting down)")
        return view, self._send_unary(wire.ENSURED, request, view, future)

    def sagemaker_stats(self) -> EndpointStats:
        return self.stats

    def sagemaker_metrics(self) -> dict[str, Any]:
        raise internal("the metrics page is served by the model host")

    async def shm_register(self, name: str, key: str, offset: int, byte_size: int) -> None:
        # (every front end hears of the region, REGION, before the answer)
        await self.call(calls.SHM_REGISTER, (name, key, offset, byte_size))
        # Opened here at once, as one process does: the registering client's requests find it whatever happens to
        # its object next (the other front ends open it when a request first names it).
        self.shared_memory.learn(name, key, offset, byte_size)
        self.shared_memory.attach(name, key, offset, byte_size)

    shm_unregister = calls.SHM_UNREGISTER.remote()  # the host asks every front end whether a request holds it
    shm_unregister_all = calls.SHM_UNREGISTER_ALL.remote()
    shm_status = calls.SHM_STATUS.remote()
    shm_cuda_status = calls.SHM_CUDA_STATUS.remote()
    shm_cuda_register = calls.SHM_CUDA_REGISTER.remote()
    trace_settings = calls.TRACE_SETTINGS.remote()
    update_trace_settings = calls.UPDATE_TRACE_SETTINGS.remote()
    log_settings_values = calls.LOG_SETTINGS_VALUES.remote()
    update_log_settings = calls.UPDATE_LOG_SETTINGS.remote()
    dashboard_feed = calls.DASHBOARD_FEED.remote()

    def close(self) -> None:
        self._stop_sweeping()
        if self._beater is not None:
            self._beater.cancel()
        if not self.channel.closed:
            self._flush()
        if self.loop is not None:
            try:
                self.loop.remove_reader(self.channel.sock.fileno())
                self.loop.remove_writer(self.channel.sock.fileno())
            except (ValueError, OSError):
                pass
        self.channel.close()
        self.closed = True
        self.shared_memory.close()


def lost_host(index: int) -> Callable[[], None]:
    """What a front end does when its channel to the host closes unasked: exit at once (its requests can't be
    answered); the first front end says why, once, as the server's last line. A host that stops on purpose stops
    its front ends first, so this is a host that died (killed, or it crashed) or, still running, dropped them."""

    host = os.getppid()  # 1: the host was gone before this front end started

    def lost() -> None:
        if index == 0:
            os.write(2, (host_lost_line(host, _alive(host)) + "\n").encode())
        os._exit(1)

    return lost


def host_lost_line(host: int, alive: bool) -> str:
    """The server's last line when its model host went without stopping the front-end processes."""
    named = f"the model host (pid {host})" if host > 1 else "the model host"
    if alive:
        return (f"error: {named} closed its channel to the front-end processes while serving; they stopped serving "
                "and exited")
    return (f"error: {named} was killed or crashed (it exited without stopping the front-end processes; its own "
            "last lines, or the system log for a kill, say why); the front-end processes stopped serving and exited")


def _alive(pid: int, settle: float = 0.2) -> bool:
    """Is the host still running? Its channel closes while the kernel tears a killed host down, before this
    process is handed to a new parent and before the host is a zombie: for a moment it still looks alive and still
    our parent. A host that really dropped us stays our parent past ``settle`` seconds."""
    if pid <= 1:
        return False
    deadline = time.monotonic() + settle
    while True:
        if os.getppid() != pid or _state(pid) in ("Z", "X", None):
            return False
        if time.monotonic() >= deadline:
            return True
        time.sleep(0.01)


def _state(pid: int) -> str | None:
    """The process's state letter from /proc (None: gone)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0].decode()
    except (OSError, IndexError):
        return None
