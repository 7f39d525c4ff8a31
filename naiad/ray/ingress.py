"""The ingress: an ASGI app on Ray Serve's HTTP proxy that speaks KServe v2 and SageMaker's routes through naiad's
own routers. A request about a model goes, as its bytes, to the model deployment with the model's name as Ray's
multiplexed model id (Ray routes it to a replica holding that model); server-wide routes (health, server
metadata, repository index, /ping) are answered here by the same routers over a service with no model loaded.
"""

from __future__ import annotations

import asyncio
import logging
import tempfile
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import orjson

from naiad.core.errors import InferError, invalid
from naiad.frontends.http.options import HttpOptions
from naiad.frontends.http.routes import Router
from naiad.frontends.sagemaker.routes import SageMakerRouter
from naiad.ray.asgi import Receive, Send, Wire, lifespan, read_request, send_result, send_wire
from naiad.ray.handles import CALL, Handles, for_method
from naiad.ray.local import build_service, local_repositories, sagemaker_options
from naiad.ray.options import RayServeOptions
from naiad.ray.routing import AUTOMATIC, lost
from naiad.ray.rpc import RPC, STREAM
from naiad.ray.rpc_ingress import RpcIngress
from naiad.ray.statistics import app_name, board, merge
from naiad.sagemaker.contract import TARGET_MODEL
from naiad.service.assemble import find_model

log = logging.getLogger("naiad.ray")


# A browser's page: naiad's dashboard draws one server's models and its buttons load and unload them, neither of
# which holds for replicas that Ray places and evicts models on.
_DASHBOARD = (b"naiad's dashboard is not served under naiad ray serve: the models live in Ray's replicas, which load "
              b"and unload them as requests arrive.\n\n"
              b"- Models and their statistics, summed over every replica: GET /v2/models/stats (and "
              b"/v2/models/<model>/stats).\n"
              b"- Replicas, their health and autoscaling: Ray's dashboard (start Ray with `ray start --head "
              b"--include-dashboard=true`, then open http://<head>:8265, Serve tab), and `serve status`.\n"
              b"- Per-replica counters: Ray's metrics export (ray_naiad_ray_requests_total, "
              b"ray_naiad_ray_model_loads_total).\n"
              b"- The dashboard itself: run `naiad serve --model-repository ...` on one machine and open /dashboard.\n")


_FIRST_WAIT_S = 60.0  # the most a request waits behind its model's first (which may be slow itself)
_PLACED_S = 2.0  # the most the first waits, after its answer, for Ray's router to learn where the model went


def _error(status: int, message: str) -> Wire:
    return status, b"application/json", [], orjson.dumps({"error": message})


class Statistics:
    """A statistics route: answered here from every replica's figures (naiad.ray.statistics)."""

    __slots__ = ("name", "version")

    def __init__(self, name: str, version: str) -> None:
        self.name = name
        self.version = version


class Ingress(RpcIngress):
    def __init__(self, model: Any, options: RayServeOptions) -> None:
        # DeploymentHandle of the model deployment. Its options came pickled from the process that built the
        # application, so the gRPC transport of Ray's throughput settings (naiad.ray.tuning) is asked for here:
        # each call goes to the replica over gRPC instead of as an actor task (half the replica's CPU per request).
        self.model = model
        if options.throughput_optimized:
            try:
                self.model = model.options(_by_reference=False)
            except TypeError:  # a Ray Serve without the option: actor tasks
                pass
        self.options = options
        self.scratch = Path(tempfile.mkdtemp(prefix="naiad-ray-ingress-"))
        # Over the repositories themselves, in explicit mode with nothing loaded: the index lists every model a
        # replica can load.
        self.repositories = local_repositories(options.model_repositories)
        self.service = build_service(options, self.scratch, self.repositories)
        sagemaker = sagemaker_options(options, self.scratch / "models")
        # Behind Ray's proxy the Host is the cluster's name, which naiad can't know: no Host check (Origin stays).
        self.http = Router(self.service, HttpOptions(allowed_hosts=["*"]))
        self.sagemaker = SageMakerRouter(self.service, sagemaker, allowed_hosts=["*"])
        self.default_model = options.default_model
        # Per model of the repositories, a handle per method of the model deployment (the most recently used
        # models'); a name no repository has goes without a model id, through one handle per method.
        self.handles = Handles()
        self.unrouted = {method: for_method(self.model, method) for method in (CALL, RPC, STREAM)}
        self.first: dict[str, asyncio.Future] = {}  # a model's first request, while it is under way
        self.placing: set[asyncio.Task] = set()  # models answered once, until Ray's router knows where they went
        self.board: Any = None  # the statistics board, found on first use
        super().__init__(self.service)

    def __serve_build_asgi_app__(self) -> Any:  # Ray Serve's late-bound ASGI app
        return _Asgi(self)

    def route(self, method: bytes, path: str, headers: dict[bytes, bytes]) -> str | Wire | Statistics | None:
        """The model a request is about (forwarded), an answer (refused here), statistics to sum, or None
        (answered here)."""
        if path.startswith("/v2/"):
            parts = path.split("/")
            if parts[-1] == "stats" and parts[2] == "models" and method == b"GET" and len(parts) in (4, 5, 7):
                if len(parts) == 4:
                    return Statistics("", "")
                if len(parts) == 5 or parts[4] == "versions":
                    return Statistics(unquote(parts[3]), parts[5] if len(parts) == 7 else "")
            if parts[2] == "models" and len(parts) >= 4 and parts[3] and not (len(parts) == 4 and parts[3] == "stats"):
                return unquote(parts[3])
            if parts[2] == "repository" and len(parts) == 6 and parts[3] == "models" and method == b"POST":
                if parts[5] == "load":
                    return unquote(parts[4])
                if parts[5] == "unload":
                    return _error(400, AUTOMATIC.format("unloading"))
            return None
        if path == "/dashboard" or path.startswith("/dashboard/"):
            return 404, b"text/plain; charset=utf-8", [], _DASHBOARD
        if path == "/invocations":
            return self.default_model or None
        if path.startswith("/endpoints/"):
            target = headers.get(TARGET_MODEL)
            if target is None and self.default_model:
                headers[TARGET_MODEL] = target = self.default_model.encode()
            return target.decode("utf-8", "replace") if target else None
        if path.startswith("/models"):
            if path.endswith("/invoke") and method == b"POST":
                target = headers.get(TARGET_MODEL)
                return target.decode("utf-8", "replace") if target else path.split("/")[2]
            if method in (b"POST", b"DELETE"):
                return _error(400, AUTOMATIC.format("loading and unloading"))
        return None

    async def asgi(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        method, path, headers, body = await read_request(scope, receive)
        target = self.route(method, path, headers)
        if target is None:
            router = self.http if path.startswith("/v2") else self.sagemaker
            await send_result(send, router.handle(method, path, headers, body))
            return
        if isinstance(target, tuple):
            await send_wire(send, target)
            return
        if isinstance(target, Statistics):
            answer: Wire
            try:
                answer = 200, b"application/json", [], orjson.dumps(await self.summed(target.name, target.version))
            except InferError as exc:
                answer = _error(exc.http_status, exc.message)
            await send_wire(send, answer)
            return
        await send_wire(send, await self.forward(target, method, path, headers, body))

    async def summed(self, name: str, version: str) -> dict[str, Any]:
        """Triton's statistics (of every model, or of ``name``), summed over the replicas: a model no replica
        holds is not available, as an unloaded model is on Triton (raises ``InferError``)."""
        rows: list[bytes] = []
        for _ in range(2):
            try:
                if self.board is None:
                    self.board = board(app_name(self.options.app_name))
                rows = await self.board.current.remote()
                break
            except Exception as exc:  # the board went with its owner: a new one (empty until replicas push)
                log.debug("statistics board: %s", exc)
                self.board = None
        if not name:
            return merge(rows)
        found = merge(rows, name)
        if not found["model_stats"]:
            raise invalid(f"requested model '{name}' is not available")
        if version:
            found = merge(rows, name, version)
            if not found["model_stats"]:
                raise invalid(f"requested model version is not available for model '{name}'")
        return found

    async def forward(self, name: str, method: bytes, path: str, headers: dict[bytes, bytes], body: bytes) -> Wire:
        try:
            return await self.reach(name, CALL, (method, path, headers, body))  # type: ignore[no-any-return]
        except InferError as exc:
            return _error(exc.http_status, exc.message)

    async def reach(self, name: str, method: str, args: tuple) -> Any:
        """``method``'s answer, from a replica holding model ``name`` (raises ``InferError`` UNAVAILABLE when the
        replica is lost or every queue is full). A streamed method (STREAM) answers its first item and the rest."""
        handle = self.handles.get(name, method)
        if handle is None:
            if find_model(self.repositories, name) is None:
                # No repository has it (a stat per repository): a replica's routers answer that, as they do a
                # request naming no model, and nothing is kept for the name.
                return await self._call(self.unrouted[method], name, method, args)
            return await self._first(name, method, args)
        if self.first:  # some model's first request is under way (rare: a dict's truth is the only cost)
            first = self.first.get(name)
            if first is not None:  # it is this model's, loading it: wait for it to land somewhere
                await asyncio.wait([first], timeout=_FIRST_WAIT_S)
        return await self._call(handle, name, method, args)

    def cached_models(self) -> list[str]:
        """The models this ingress holds handles for, least recently used first (through a Ray handle: tests,
        debugging)."""
        return list(self.handles.names)

    async def _first(self, name: str, method: str, args: tuple) -> Any:
        """A model's first request here goes alone: until it has loaded the model on a replica, Ray knows of no
        replica holding it and would spread the requests behind it over every replica, each loading its own copy.
        They wait for it instead, and then go where it went."""
        handle = self.handles.add(name, self.model.options(multiplexed_model_id=name), method)
        done = self.first[name] = asyncio.get_running_loop().create_future()
        try:
            if self.placing:
                # Another model has just loaded on a replica that Ray's router doesn't know of yet. Ray sends a
                # model held nowhere to the replicas with the fewest models: by that stale view, possibly the
                # other one's, which (at --max-models-per-replica) would evict it. At most _PLACED_S, once.
                await asyncio.wait(list(self.placing), timeout=_PLACED_S)
            answer = await self._call(handle, name, method, args)
        except BaseException:
            self._release(name, done)
            raise
        # The waiters go once Ray's router knows where the model went; this answer needn't wait for that.
        # (Its handle's router: the one that learned the way there.) Once per model, not on the per-request path.
        task = asyncio.ensure_future(_placed(handle, name))
        self.placing.add(task)
        task.add_done_callback(lambda _: self._landed(task, name, done))
        return answer

    def _landed(self, task: asyncio.Task, name: str, done: asyncio.Future) -> None:
        self.placing.discard(task)
        self._release(name, done)

    def _release(self, name: str, done: asyncio.Future) -> None:
        if self.first.get(name) is done:  # (a first again, its handles dropped meanwhile, has its own)
            del self.first[name]
        done.set_result(None)

    async def _call(self, handle: Any, name: str, method: str, args: tuple) -> Any:
        try:
            if method != STREAM:
                return await handle.remote(*args)
            items = handle.remote(*args)
            return await items.__anext__(), items
        except Exception as exc:
            error = lost(exc, name)
            if error is exc:
                raise
            raise error from exc


async def _placed(handle: Any, name: str) -> None:
    """Until the handle's router knows a replica holding ``name`` (the replica reports its models every 0.1 s,
    and the controller passes them on; on a busy cluster that takes a while): routed before, the requests that
    waited would go to the replica with the fewest models and load another copy. Ray has no public view of
    this, so it is read where Ray 2.4x-2.6x keeps it; elsewhere a fixed pause stands in."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + _PLACED_S
    while loop.time() < deadline:
        try:
            router = handle._router._asyncio_router.request_router
            if router._multiplexed_model_id_to_replica_ids.get(name):
                return
        except AttributeError:
            await asyncio.sleep(_PLACED_S / 4)
            return
        await asyncio.sleep(0.02)


class _Asgi:
    """An ASGI 3 callable (servers tell ASGI 3 from 2 by an ``async def __call__``; a bound method reads as 2)."""

    def __init__(self, ingress: Ingress) -> None:
        self.ingress = ingress

    async def __call__(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        await self.ingress.asgi(scope, receive, send)
