"""What crosses between a front-end process and the model host (``--frontend-processes N``): one schema per
message kind, each a plain tuple whose first item is its kind, carried by the Python backend's channel
(``backends/python/transport.py``: a SOCK_SEQPACKET datagram each, marshal-encoded, tensors as its ``Tensor``
records: small ones inline, larger ones in the sender's shared-memory arena, read in place).

Kinds start at 100 so they never meet the channel's own framing kinds (SEGMENT, DROPPED, PARKED, BATCH).
"""

from __future__ import annotations

from enum import IntEnum
from typing import Any, NamedTuple


class Kind(IntEnum):
    # Front end -> host.
    INFER = 100  # a unary request (answered by one RESULT)
    STREAM = 101  # a streamed request (answered by RESULTs until one is final)
    CANCEL = 102  # the client went away: cancel request ``id``
    CALL = 103  # any other face method, by name, with plain arguments (answered by REPLY)
    READY = 104  # the front end listens on its ports
    USED = 105  # the answer to USES: which of those regions a request here holds
    STATS = 106  # SageMaker's invocation counters since the last STATS: add them to the host's
    # A unary request (as INFER) for a SageMaker target model that a "sagemaker_hit" or "sagemaker_ensure" CALL
    # made resident just before: the host marks it used and queues it, or, where an eviction took the model in
    # between, loads it again first (as one process, which queues it within the hit or the load, would have).
    ENSURED = 107
    # Host -> front end.
    RESULT = 110  # one response to INFER or STREAM
    REPLY = 111  # the answer to a CALL
    INVALIDATE = 112  # the repository changed: forget the model views kept
    SHM = 113  # shared-memory regions were unregistered (names, or None: all): close them
    LOGS = 115  # the log settings changed (the changes): apply them here too
    USES = 114  # which of these regions (names, or None: all) does a request here hold?


# The kinds as plain ints (marshal carries no enum).
INFER, STREAM, CANCEL, CALL, READY = int(Kind.INFER), int(Kind.STREAM), int(Kind.CANCEL), int(Kind.CALL), int(Kind.READY)
RESULT, REPLY, INVALIDATE, SHM = int(Kind.RESULT), int(Kind.REPLY), int(Kind.INVALIDATE), int(Kind.SHM)
USED, USES, LOGS, STATS = int(Kind.USED), int(Kind.USES), int(Kind.LOGS), int(Kind.STATS)
ENSURED = int(Kind.ENSURED)
REFUSED = 2  # a RESULT's ``final`` when the face raised the error instead of answering it (stream refusals)


class Request(NamedTuple):
    kind: int
    id: int  # the front end's number for it, unique among its requests in flight
    model_name: str
    model_version: str
    request_id: str
    inputs: list  # transport Tensor records
    requested_outputs: list[str] | None
    parameters: dict[str, Any]
    correlation_id: int | str
    flags: int
    priority: int
    timeout_us: int
    raw_input: bytes | None
    # The host's number for the version whose signature the front end checked this request with (the number came
    # with its "model" view); 0: unchecked (no view, or the check failed: the host checks it, and refuses it in its
    # own words). The host skips its check only if that number still stands for the version that serves it.
    checked: int = 0
    batch_size: int = 0  # what that check set (0 when unchecked)
    # What that check changed (``precheck.Undo``; None: nothing but the batch size): where another version serves
    # the request, the host puts it back as the client sent it before checking it.
    undo: tuple | None = None


class Result(NamedTuple):
    kind: int
    id: int
    model_name: str
    model_version: str
    response_id: str
    outputs: list  # transport Tensor records
    parameters: dict[str, Any]
    error: tuple[str, str] | None  # (Code name, message)
    final: bool


class Call(NamedTuple):
    kind: int
    id: int
    method: str
    args: tuple


class Reply(NamedTuple):
    kind: int
    id: int
    ok: bool
    value: Any  # the result, or (error class name, Code name, message) of an error


class Cancel(NamedTuple):
    kind: int
    id: int


class View(NamedTuple):
    """The value of a "model" CALL: the view's fields but its handle (the host's own object), then what a front end
    checks requests with."""
    fields: tuple  # ModelView's, handle left out
    number: int  # the host's number for this version, for its requests' ``checked``; valid until an INVALIDATE
    config: bytes  # the version's ModelConfig, serialized: the front end builds its signature from it


# Face methods the host answers by CALL (plain arguments and results). ``infer``, ``stream`` and ``model`` have
# their own paths; everything else a front end may ask is here, and nothing more is callable. The target's view
# comes with "sagemaker_ensure" (a ``View``) and, where its second argument asks for it, "sagemaker_hit" (``(hit,
# View | None)``): the request that follows needs no other call, in which an eviction could come.
CALLS = frozenset({
    "live", "accepting", "sagemaker", "control_mode", "in_flight", "server_id",
    "model", "is_ready", "server_metadata", "model_ready", "model_metadata", "model_config",
    "model_config_message", "model_statistics", "repository_index", "load_model", "unload_model", "model_metrics",
    "sagemaker_models", "sagemaker_model", "sagemaker_load", "sagemaker_unload", "sagemaker_touch",
    "sagemaker_hit", "sagemaker_ensure", "sagemaker_models_root",
    "shm_register", "shm_unregister", "shm_unregister_all", "shm_status", "shm_cuda_status", "shm_cuda_register",
    "trace_settings", "update_trace_settings", "log_settings_values", "update_log_settings", "dashboard_feed",
})

# Calls that change which versions serve: the host tells every front end to forget its views before it answers.
CHANGES = frozenset({"load_model", "unload_model", "sagemaker_load", "sagemaker_unload", "sagemaker_ensure"})
