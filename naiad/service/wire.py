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
    # A unary request (as INFER) for a SageMaker target model (``sagemaker_infer``) whose view the front end knows
    # (kept, or from a "sagemaker_ensure" CALL): the host counts the hit, marks it used and queues it, or, where an
    # eviction took the model since, loads it again first (as one process, which queues it within the hit or the
    # load, would have).
    ENSURED = 107
    TOUCH = 108  # an invocation of a SageMaker model (by name) queued as INFER: mark it used (no answer)
    # Host -> front end.
    RESULT = 110  # one response to INFER or STREAM
    REPLY = 111  # the answer to a CALL
    INVALIDATE = 112  # the repository changed: forget the model views kept
    SHM = 113  # shared-memory regions were unregistered (names, or None: all): close them
    LOGS = 115  # the log settings changed (the changes): apply them here too
    USES = 114  # which of these regions (names, or None: all) does a request here hold?
    # What the host's face answers at once, pushed when it changes (and before any answer that changed it), else
    # every ``hosting.BEAT_SECONDS`` as a BEAT: a front end that hears nothing for a while knows the host stalled.
    STATE = 116  # a ``State``
    REGION = 117  # a shared-memory region was registered (name, key, offset, byte_size): requests may name it
    # The views of every version that serves (after each INVALIDATE, and at start): [(name, version, *View)], so a
    # front end resolves a request without asking (one that stalled host could not answer).
    VIEWS = 118
    # Either way.
    BEAT = 120  # nothing: a heartbeat, or a send that carries what the arena announces (segments new and dropped)
    PART = 121  # a part of a message too large for a datagram, sent so where shared memory ran short
    LOST = 122  # a segment whose announcement could not be read here (descriptors ran out): announce it again


# The kinds as plain ints (marshal carries no enum).
INFER, STREAM, CANCEL, CALL, READY = int(Kind.INFER), int(Kind.STREAM), int(Kind.CANCEL), int(Kind.CALL), int(Kind.READY)
RESULT, REPLY, INVALIDATE, SHM = int(Kind.RESULT), int(Kind.REPLY), int(Kind.INVALIDATE), int(Kind.SHM)
USED, USES, LOGS, STATS = int(Kind.USED), int(Kind.USES), int(Kind.LOGS), int(Kind.STATS)
ENSURED, TOUCH, STATE, REGION = int(Kind.ENSURED), int(Kind.TOUCH), int(Kind.STATE), int(Kind.REGION)
VIEWS = int(Kind.VIEWS)
BEAT, PART, LOST = int(Kind.BEAT), int(Kind.PART), int(Kind.LOST)
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


class State(NamedTuple):
    """What a front end answers health and static questions from, without asking the host."""
    kind: int
    live: bool
    ready: bool  # the server's readiness, as ``Service.is_ready``
    failure: str | None  # the server could not be created: model requests are refused "Server not ready"
    models: dict[str, dict[str, bool]]  # model -> version ("" for the policy's choice) -> ready
    server_id: str
    control_mode: str
    sagemaker: bool
    models_root: str  # SageMaker's multi-model layout ("" without SageMaker)


class Part(NamedTuple):
    kind: int
    number: int  # the sender's number for the message, unique among its messages in parts
    last: bool
    data: bytes  # the next slice of the message's encoding


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
    """A face method the host answers, by name, with its arguments' record: each declared in ``calls.py``."""
    kind: int
    id: int
    method: str
    args: tuple


class Reply(NamedTuple):
    kind: int
    id: int
    ok: bool
    value: Any  # the result, as its declaration packs it, or (error class name, Code name, message) of an error


class Cancel(NamedTuple):
    kind: int
    id: int


class View(NamedTuple):
    """The answer of a "model" or "sagemaker_ensure" CALL (``calls.VIEW``): the view's fields but its handle (the
    host's own object), then what a front end checks requests with."""
    fields: tuple  # ModelView's, handle left out
    number: int  # the host's number for this version, for its requests' ``checked``; valid until an INVALIDATE
    config: bytes  # the version's ModelConfig, serialized: the front end builds its signature from it
