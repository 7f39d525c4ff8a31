"""The shared-memory extension's HTTP routes, as Triton serves them:

``/v2/{systemsharedmemory,cudasharedmemory}[/region/{name}]/{status,register,unregister}``; status is a GET,
the others POSTs. Registering takes ``{"key", "offset", "byte_size"}``.
"""

from __future__ import annotations

import base64
import binascii
from typing import TYPE_CHECKING, Any, Awaitable

import orjson

from naiad.core.errors import internal, invalid
from naiad.frontends.replies import Deferred, Reply, json_later, later
from naiad.frontends.replies import method_not_allowed as _method_not_allowed
from naiad.frontends.replies import not_found as _not_found

if TYPE_CHECKING:
    from naiad.service import Administration

_ACTIONS = ("status", "register", "unregister")
_CUDA_IPC_HANDLE_SIZE = 64  # sizeof(cudaIpcMemHandle_t)


def route(service: Administration, method: bytes, parts: list[str], body: bytes | bytearray) -> Reply | Deferred:
    """``parts``: the path split at '/', from "v2"; raises ``InferError`` for the caller to answer. What needs the
    registry (across processes, the model host's) is answered ``later``."""
    rest = parts[2:]
    if len(rest) == 1:
        name, action = "", rest[0]
    elif len(rest) == 3 and rest[0] == "region":
        name, action = rest[1], rest[2]
    else:
        return _not_found()
    if action not in _ACTIONS:
        return _not_found()
    if method != (b"GET" if action == "status" else b"POST"):
        return _method_not_allowed()
    cuda = parts[1] == "cudasharedmemory"
    if action == "status":
        return later(json_later(service.shm_cuda_status(name) if cuda else service.shm_status(name)))
    if action == "register":
        if not name:
            kind = "cuda" if cuda else "system"
            raise invalid(f"'region name' is necessary to register {kind} shared memory region")
        if cuda:
            _cuda_register_request(body)
            return later(_done(service.shm_cuda_register(name)))
        key, offset, byte_size = _register_request(body)
        return later(_done(service.shm_register(name, key, offset, byte_size)))
    if not cuda:  # no CUDA region can exist: unregistering one is always done
        return later(_done(service.shm_unregister(name) if name else service.shm_unregister_all()))
    return Reply(200)


async def _done(call: Awaitable[None]) -> Reply:
    await call
    return Reply(200)


def _json(body: bytes | bytearray) -> Any:
    if not body:
        raise internal("failed to parse the request JSON buffer: The document is empty. at 0")
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise internal(f"failed to parse the request JSON buffer: {exc}") from None


def _register_request(body: bytes | bytearray) -> tuple[str, int, int]:
    """The register body's fields, refused with Triton's (rapidjson's) words."""
    doc = _json(body)
    if not isinstance(doc, dict) or "key" not in doc:
        raise invalid("Shared memory register request has no 'key' field")
    key = doc["key"]
    if not isinstance(key, str):
        raise internal("attempt to access JSON non-string as string")
    offset = _unsigned(doc.get("offset", 0))
    if "byte_size" not in doc:
        raise invalid("Shared memory register request has no 'byte_size' field")
    return key, offset, _unsigned(doc["byte_size"])


def _cuda_register_request(body: bytes | bytearray) -> None:
    """The CUDA register body checked as Triton's GPU build reads it: ``raw_handle.b64`` must decode to a
    64-byte ``cudaIpcMemHandle_t``; ``byte_size`` and ``device_id`` are unsigned."""
    doc = _json(body)
    handle = doc.get("raw_handle") if isinstance(doc, dict) else None
    if handle is None:
        raise invalid("Shared memory register request has no 'raw_handle' field")
    if not isinstance(handle, dict) or "b64" not in handle:
        raise internal("attempt to access non-existing object member 'b64'")
    if not isinstance(handle["b64"], str):
        raise internal("attempt to access JSON non-string as string")
    for field in ("byte_size", "device_id"):
        if field not in doc:
            raise internal(f"attempt to access non-existing object member '{field}'")
        _unsigned(doc[field])
    try:
        raw = base64.b64decode(handle["b64"], validate=False)
    except (binascii.Error, ValueError):
        raw = b""
    if len(raw) != _CUDA_IPC_HANDLE_SIZE:
        raise invalid("'raw_handle' must be a valid base64 encoded cudaIpcMemHandle_t")


def _unsigned(value: Any) -> int:
    if type(value) is not int or value < 0:
        raise internal("attempt to access JSON non-unsigned-integer as unsigned-integer")
    return value
