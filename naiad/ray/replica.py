"""The model deployment: each replica runs naiad's core service and both routers over it. Ray's multiplexing
names the model (the request's multiplexed model id); the replica loads it on first use through SageMaker's
residency (naiad's load path) and, beyond --max-models-per-replica, Ray evicts the least recently used one,
which unloads it the same way (workers stopped, memory released).

The ingress forwards the request's bytes and gets the encoded reply's bytes back: tensors are decoded and
encoded once, here, and the crossing pickles only bytes (no NumPy arrays, no object arrays of BYTES).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import re
import shutil
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import orjson

from naiad.core.errors import InferError, not_found
from naiad.frontends.grpc.codec import parse_version, stream_error
from naiad.frontends.grpc.inference import GRPC_ERROR_HEADER, UNPARSABLE, UNPARSABLE_MESSAGE
from naiad.frontends.http.options import HttpOptions
from naiad.frontends.http.routes import Router
from naiad.frontends.replies import Reply, error_reply
from naiad.frontends.sagemaker.routes import SageMakerRouter
from naiad.ray.asgi import Wire, to_wire
from naiad.ray.local import build_service, local_repositories, sagemaker_options
from naiad.ray.options import RayServeOptions
from naiad.ray.rpc import Call, RpcWire, answer, local_table, status_number
from naiad.ray.statistics import Pusher, app_name
from naiad.service.assemble import find_model

log = logging.getLogger("naiad.ray")

REPLICA_HEADER = b"x-naiad-replica"  # which replica answered
RESIDENCY_HEADER = b"x-naiad-residency"  # hit: the model was loaded there already; load: loaded for this request
_INTERNAL = int(grpc.StatusCode.INTERNAL.value[0])
_KEY = re.compile(r"[0-9A-Za-z._]+")  # what a residency key may be (a path component)


class Loaded:
    """A model as Ray's multiplexer holds it. Ray calls its ``__del__`` when it evicts the model: an async one,
    which Ray awaits on the replica's loop right after taking the model out of its cache, so the replica's own
    view (``resident``) drops the model in the same step. (A plain ``__del__`` runs in a thread, later: in that
    gap a request still saw the model resident, and its cache lookup made Ray load it again at once, evicting the
    model just loaded, outside ``_admit`` and its minimum residency.) Set on the instance, not the class, so that
    garbage collection doesn't call it."""

    def __init__(self, replica: "ModelReplica", name: str, key: str) -> None:
        self.replica = replica
        self.name = name
        self.key = key
        self.unloaded = False
        self.since = time.monotonic()  # loaded at (see ModelReplica._admit)
        self.__del__ = self.evicted

    async def evicted(self) -> None:
        if not self.unloaded:
            self.unloaded = True
            await self.replica.unload(self)


class ModelReplica:
    def __init__(self, options: RayServeOptions) -> None:
        from ray import serve

        self.options = options
        self.repositories = local_repositories(options.model_repositories)
        self.scratch = Path(tempfile.mkdtemp(prefix="naiad-ray-replica-"))
        # Its model links lead into the repositories (see _load).
        self.service = build_service(options, self.scratch, link_roots=self.repositories)
        self.models_root = self.service.sagemaker_models_root()
        # Requests come through Ray's proxy with the Host clients used for the cluster, which a replica can't know:
        # no Host check here (the Origin check stays).
        self.http = Router(self.service, HttpOptions(allowed_hosts=["*"]))
        self.sagemaker = SageMakerRouter(self.service, sagemaker_options(options, self.scratch / "models"),
                                         allowed_hosts=["*"])
        self.rpc_table = local_table(self.service)  # naiad's gRPC handlers, by RPC name
        self.resident: dict[str, Loaded] = {}
        self._room = asyncio.Lock()  # one miss at a time: two waiting misses must not each evict a model
        self.id = _replica_id().encode()
        # This replica's model statistics, for the ingress's sums over the application (started on first use,
        # in Serve's event loop).
        self.pusher = Pusher(self.id.decode(), app_name(options.app_name), self.service.model_statistics)
        # serve.multiplexed takes its limit when applied, and keeps its cache on the function it wraps: applied
        # here, to a function of this replica's own.
        async def load_naiad_model(name: str) -> Loaded:
            return await self._load(name)

        self._get = serve.multiplexed(max_num_models_per_replica=options.max_models_per_replica)(load_naiad_model)
        from ray.serve import metrics

        self.requests = metrics.Counter("naiad_ray_requests", "requests a replica served, by model and residency",
                                        tag_keys=("model", "residency"))  # type: ignore[arg-type]
        self.loads = metrics.Counter("naiad_ray_model_loads", "models loaded on a replica", tag_keys=("model",))
        self.waits = metrics.Counter("naiad_ray_residency_waits", "misses that waited for a model's minimum "
                                     "residency (--min-model-residency-s) before unloading it", tag_keys=("model",))
        self.evictions = metrics.Counter("naiad_ray_model_evictions", "models a replica unloaded (LRU)",
                                         tag_keys=("model",))

    def find(self, name: str) -> Path | None:
        return find_model(self.repositories, name)

    async def _admit(self, name: str) -> bytes:
        """Load ``name`` (a miss), unloading the least recently used model if the replica is full, but none
        within --min-model-residency-s of its load: a replica asked for more models than it may hold (its peer
        died and Ray sends the peer's models here until a replacement runs) would otherwise unload and reload on
        nearly every request. Requests for the model wait here instead, and the models in use keep serving."""
        async with self._room:
            if name in self.resident:  # loaded while this request waited
                await self._get(name)
                return b"hit"
            if len(self.resident) >= self.options.max_models_per_replica and self.resident:
                youngest = max(loaded.since for loaded in self.resident.values())
                delay = youngest + self.options.min_model_residency_s - time.monotonic()
                if delay > 0:
                    self.waits.inc(tags={"model": name})
                    await asyncio.sleep(delay)
            await self._get(name)
            return b"load"

    async def _load(self, name: str) -> Loaded:
        folder = self.find(name)
        if folder is None:
            raise not_found(f"Request for unknown model: '{name}' is not found")
        # SageMaker's layout, <root>/<key>/model, as a link to the repository's folder: residency registers it
        # and loads the model under its own name.
        key = name if _KEY.fullmatch(name) else hashlib.md5(name.encode()).hexdigest()
        link = self.models_root / key
        shutil.rmtree(link, ignore_errors=True)
        link.mkdir(parents=True)
        (link / "model").symlink_to(folder, target_is_directory=True)
        try:
            await self.service.sagemaker_load(key, str(link / "model"), name)
        except BaseException:
            shutil.rmtree(link, ignore_errors=True)
            raise
        loaded = self.resident[name] = Loaded(self, name, key)
        self.loads.inc(tags={"model": name})
        log.info("replica %s loaded model '%s'", self.id.decode(), name)
        return loaded

    async def unload(self, loaded: Loaded) -> None:
        if self.resident.get(loaded.name) is loaded:  # before any await: no request may find it from here on
            del self.resident[loaded.name]
        try:
            await self.service.sagemaker_unload(loaded.key)
        except InferError as exc:
            log.warning("unloading model '%s': %s", loaded.name, exc.message)
        shutil.rmtree(self.models_root / loaded.key, ignore_errors=True)
        self.evictions.inc(tags={"model": loaded.name})
        log.info("replica %s unloaded model '%s'", self.id.decode(), loaded.name)

    async def _reside(self, name: str) -> tuple[bytes, InferError | None]:
        """Model ``name`` (Ray's multiplexed model id) made resident here: "hit", "load", or "-" for a request
        about no model of the repositories (the routers answer it); and the error that kept it from loading."""
        if self.pusher.task is None:
            self.pusher.start()
        if not name or (name not in self.resident and self.find(name) is None):  # the folder scan only on a miss
            return b"-", None
        residency = b"hit" if name in self.resident else b"load"
        try:
            if residency == b"hit":
                await self._get(name)  # in Ray's cache (see Loaded): marks it most recently used, loads nothing
            else:
                residency = await self._admit(name)
        except InferError as exc:
            return residency, exc
        self.requests.inc(tags={"model": name, "residency": residency.decode()})
        return residency, None

    async def __call__(self, method: bytes, path: str, headers: dict[bytes, bytes], body: bytes) -> Wire:
        from ray import serve

        residency, error = await self._reside(serve.get_multiplexed_model_id())
        if error is not None and path.startswith("/v2"):  # else SageMaker's routes answer it in their own shape
            return self._tag(await to_wire(error_reply(error)), residency)
        if residency != b"-" and error is None and path.startswith("/v2/repository/models/"):
            return self._tag((200, b"application/json", [], b""), residency)  # a load: resident here now
        router = self.http if path.startswith("/v2") else self.sagemaker
        try:
            result = router.handle(method, path, headers, body)
        except Exception:
            log.exception("unhandled error for %s", path)
            result = Reply(500, orjson.dumps({"error": "internal server error"}))
        return self._tag(await to_wire(result), residency)

    async def rpc(self, method: str, request: bytes) -> RpcWire:
        """A unary gRPC call about a model (naiad.ray.rpc_ingress.FORWARDED), its request as bytes."""
        from ray import serve

        residency, error = await self._reside(serve.get_multiplexed_model_id())
        if error is not None:
            return status_number(error), error.message, b"", self.id, residency
        if residency != b"-" and method == "RepositoryModelLoad":  # resident here now
            return 0, "", b"", self.id, residency
        call = Call()
        body = await answer(self.rpc_table[method], request, call)
        return call.status, call.message, body, self.id, residency

    async def stream(self, request: bytes, grpc_errors: bool) -> AsyncIterator[bool | bytes | tuple[int, str]]:
        """One request of a ModelStreamInfer stream: first whether its model is decoupled (its responses needn't
        wait for earlier requests'), then each encoded response, and the status that ends the stream if one does
        (a message that doesn't parse; a failure, under the ``triton_grpc_error`` header)."""
        from ray import serve

        handler = self.rpc_table["ModelStreamInfer"]
        message = handler.request_deserializer(request)
        error = (await self._reside(serve.get_multiplexed_model_id()))[1]
        if message is UNPARSABLE or error is not None:
            yield False
            yield (_INTERNAL, UNPARSABLE_MESSAGE) if error is None else stream_error(error, message).SerializeToString()
            return
        try:
            decoupled = (await self.service.model(message.model_name, parse_version(message.model_version))).decoupled
        except InferError:
            decoupled = False  # answered with the error, below
        yield decoupled
        call = Call(((GRPC_ERROR_HEADER, "true"),) if grpc_errors else ())
        async for reply in handler.stream_stream(_one(message), call):
            yield reply.SerializeToString()
        if call.status:
            yield call.status, call.message

    def _tag(self, wire: Wire, residency: bytes) -> Wire:
        wire[2].append((REPLICA_HEADER, self.id))
        wire[2].append((RESIDENCY_HEADER, residency))
        return wire

    async def __del__(self) -> None:
        # Ray Serve calls an async __del__ when it stops the replica: finalize every model's workers.
        self.service.accepting = False
        await self.pusher.stop()
        for loaded in list(self.resident.values()):
            loaded.unloaded = True
            await self.unload(loaded)
        shutil.rmtree(self.scratch, ignore_errors=True)


async def _one(message: Any) -> AsyncIterator[Any]:
    yield message


def _replica_id() -> str:
    try:
        from ray import serve

        return str(serve.get_replica_context().replica_id.unique_id)
    except Exception:  # outside a replica (unit use)
        return f"pid{os.getpid()}"
