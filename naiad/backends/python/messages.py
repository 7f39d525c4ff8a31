"""The one schema of what crosses a worker channel, used by both ends (``process.py`` / ``router.py`` in the
server, ``worker.py`` in the worker, ``transport.py`` for the channel's own framing).

Every message is a plain tuple whose first item is its ``Kind`` (a small int on the wire: a codec encodes
a tuple of builtins quickly, and an int tag costs what a one-letter string did). Each kind has exactly one
encoder here, a lower-case function building the tuple, and one schema, the ``NamedTuple`` of the same
name; records that travel inside messages (``Request``, ``Response``, ``Error``, ``Tensor``, ``Block``) work
the same way. Nothing outside this module knows the order of their fields. A receiver reads a tuple in
one of two ways:

* ``Done.of(message)`` reinterprets it as the named tuple (fine off the hot path), or
* a function declared ``@reads(Done)`` takes the fields as its last parameters, named as the schema names
  them (checked once, when the function is defined), and is called as ``handler(*message)``: no object is
  made per message, which matters on the execute path (it keeps decoding as cheap as bare tuples were).

Encoding. The first two messages, ``INIT`` (server -> worker) and ``HELLO`` (worker -> server), are JSON,
readable by any interpreter. ``HELLO`` reports the worker's channel protocol, Python and ``marshal``
versions; both ends then pick the same codec with ``choose_codec``: ``marshal`` (fastest) when the two
interpreters share a Python minor version and marshal format, else pickle at the highest protocol both
read (marshal's format is only promised within one Python version; pickle's protocols 4 and 5 are read by
every Python naiad runs on). A different channel protocol cannot be bridged: the model fails to load.
"""

from __future__ import annotations

import inspect
import json
import marshal
import os
import pickle
import sys
from enum import IntEnum
from functools import partial
from io import BytesIO
from typing import Any, Callable, NamedTuple

# Bump when a message's fields change: a worker speaking another protocol is refused at its handshake.
PROTOCOL = 2
# Tests (only) make a worker claim other versions, to drive the mismatch paths: a JSON object of
# ``Versions`` fields, e.g. {"python": [3, 7, 0]}.
TEST_VERSIONS_VARIABLE = "NAIAD_TEST_WORKER_VERSIONS"


class Kind(IntEnum):
    # Handshake (JSON).
    INIT = 1  # server -> worker: the setup and the server's versions
    HELLO = 2  # worker -> server: its versions and the codec it switched to
    # Worker -> server.
    READY = 3  # initialize() succeeded
    FAIL = 4  # initialize() failed
    DONE = 5  # an execution finished: its responses (or none, when decoupled) and timings
    STREAM = 6  # one response through a response sender
    BLS = 7  # an inference request to another model
    BLS_CANCEL = 8  # the model dropped a decoupled BLS response iterator
    LOG = 9  # a pb_utils.Logger line
    METRIC = 10  # a custom metric update (fire and forget)
    CALL = 11  # a call that waits for an answer (metric families and values, model control)
    FINALIZED = 12  # finalize() ran
    # Server -> worker.
    EXECUTE = 13  # run these requests
    CANCEL = 14  # a request (or, with index -1, an execution) was cancelled
    BLS_REPLY = 15  # a response to a BLS request
    CALL_REPLY = 16  # the answer to a CALL
    FINALIZE = 17  # run finalize() and exit
    # The channel's own framing, either way (transport.py).
    SEGMENT = 18  # a new shared-memory segment; its file descriptor rides along
    DROPPED = 19  # shared-memory segments the receiver may unmap
    PARKED = 20  # a message too large for a datagram, parked in shared memory
    BATCH = 21  # several messages in one datagram
    # Worker -> server, just before the DONE of the execution that found it: the device is poisoned (see
    # naiad/backends/faults.py); the worker exits after that DONE.
    POISONED = 22


_new = tuple.__new__


# --- records inside messages -----------------------------------------------------------------------------------

class Error(NamedTuple):
    code: str  # a naiad.core.errors.Code name
    message: str


def error(code: str, message: str) -> tuple:
    return (code, message)


class Block(NamedTuple):
    """A tensor's bytes in the sender's shared memory. ``copy``: the receiver copies them out and frees the
    block at once (the sender's ring is short of room because blocks are being held; see shm.py)."""

    segment: int
    offset: int
    nbytes: int
    copy: bool


def block(segment: int, offset: int, nbytes: int, copy: bool) -> tuple:
    return (segment, offset, nbytes, copy)


class Tensor(NamedTuple):
    """``dtype`` is a NumPy type string or "BYTES"; ``payload`` the bytes themselves (small tensors) or a ``Block``."""

    name: str
    dtype: str
    shape: tuple
    payload: Any


def tensor(name: str, dtype: str, shape: tuple, payload: Any) -> tuple:
    return (name, dtype, shape, payload)


class Request(NamedTuple):
    id: str
    correlation_id: Any
    flags: int
    timeout: int
    parameters: Any  # a dict (or, from a BLS request, what the model passed)
    requested: list | None  # output names; None: all of the model's outputs
    inputs: list  # Tensor records


def request(id: str, correlation_id: Any, flags: int, timeout: int, parameters: Any, requested: list | None,
            inputs: list) -> tuple:
    return (id, correlation_id, flags, timeout, parameters, requested, inputs)


class Response(NamedTuple):
    error: tuple | None  # an Error record, or None with outputs
    outputs: list | None  # Tensor records
    parameters: dict | None


def response(error: tuple | None, outputs: list | None, parameters: dict | None) -> tuple:
    return (error, outputs, parameters)


def error_response(code: str, message: str) -> tuple:
    return ((code, message), None, None)


# --- worker -> server ------------------------------------------------------------------------------------------

class Ready(NamedTuple):
    kind: int
    is_async: bool
    pid: int
    python: str


def ready(is_async: bool, pid: int, python: str) -> tuple:
    return (_READY, is_async, pid, python)


class Fail(NamedTuple):
    kind: int
    code: str
    message: str


def fail(code: str, message: str) -> tuple:
    return (_FAIL, code, message)


class Done(NamedTuple):
    kind: int
    tag: int
    error: tuple | None  # the execution failed as a whole: an Error record
    # One Response per request (None for one already sent through its sender, or rescheduled); None when decoupled
    # (they travel as STREAM).
    responses: list | None
    input_ns: int
    infer_ns: int
    output_ns: int
    # When (time.perf_counter_ns, one clock for every process) the worker finished the execution before this one:
    # until then this one waited for the instance (queue time); 0 when it overlaps others (async execute).
    free_ns: int
    rescheduled: list | None  # indexes of requests released with TRITONSERVER_REQUEST_RELEASE_RESCHEDULE


def done(tag: int, error: tuple | None, responses: list | None, input_ns: int, infer_ns: int, output_ns: int,
         free_ns: int, rescheduled: list | None) -> tuple:
    return (_DONE, tag, error, responses, input_ns, infer_ns, output_ns, free_ns, rescheduled)


class Stream(NamedTuple):
    kind: int
    tag: int
    request_index: int  # which request of the execution
    response: tuple | None  # a Response record; None with the final flag alone
    # pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL or 0 (a non-decoupled model's one response: always FINAL)
    flags: int


def stream(tag: int, request_index: int, response: tuple | None, flags: int) -> tuple:
    return (_STREAM, tag, request_index, response, flags)


class Bls(NamedTuple):
    kind: int
    tag: int
    model: str
    version: int  # -1: the model's policy picks
    request: tuple  # a Request record
    decoupled: bool


def bls(tag: int, model: str, version: int, request: tuple, decoupled: bool) -> tuple:
    return (_BLS, tag, model, version, request, decoupled)


class BlsCancel(NamedTuple):
    kind: int
    tag: int


def bls_cancel(tag: int) -> tuple:
    return (_BLS_CANCEL, tag)


class Log(NamedTuple):
    kind: int
    level: int  # pb_utils.Logger level
    text: str


def log(level: int, text: str) -> tuple:
    return (_LOG, level, text)


class Metric(NamedTuple):
    kind: int
    key: Any
    op: str
    value: float


def metric(key: Any, op: str, value: float) -> tuple:
    return (_METRIC, key, op, value)


class Call(NamedTuple):
    kind: int
    tag: int
    what: str  # "family", "metric", "value" or "control"
    args: tuple


def call(tag: int, what: str, args: tuple) -> tuple:
    return (_CALL, tag, what, args)


class Poisoned(NamedTuple):
    kind: int
    cause: str  # the sticky error, in CUDA's words


def poisoned(cause: str) -> tuple:
    return (_POISONED, cause)


class Finalized(NamedTuple):
    kind: int
    error: str | None  # what finalize() raised


def finalized(error: str | None) -> tuple:
    return (_FINALIZED, error)


# --- server -> worker ------------------------------------------------------------------------------------------

class Execute(NamedTuple):
    kind: int
    tag: int
    requests: list  # Request records


def execute(tag: int, requests: list) -> tuple:
    return (_EXECUTE, tag, requests)


class Cancel(NamedTuple):
    kind: int
    tag: int
    request_index: int  # -1: every request of the execution


def cancel(tag: int, request_index: int) -> tuple:
    return (_CANCEL, tag, request_index)


class BlsReply(NamedTuple):
    kind: int
    tag: int
    response: tuple  # a Response record
    final: bool


def bls_reply(tag: int, response: tuple, final: bool) -> tuple:
    return (_BLS_REPLY, tag, response, final)


class CallReply(NamedTuple):
    kind: int
    tag: int
    ok: bool
    value: Any  # the answer, or the error text when not ok


def call_reply(tag: int, ok: bool, value: Any) -> tuple:
    return (_CALL_REPLY, tag, ok, value)


class Finalize(NamedTuple):
    kind: int


def finalize() -> tuple:
    return (_FINALIZE,)


# --- framing (transport.py) ------------------------------------------------------------------------------------

class Segment(NamedTuple):
    kind: int
    id: int


def segment(id: int) -> tuple:
    return (_SEGMENT, id)


class Dropped(NamedTuple):
    kind: int
    ids: list


def dropped(ids: list) -> tuple:
    return (_DROPPED, ids)


class Parked(NamedTuple):
    kind: int
    segment: int
    offset: int
    nbytes: int


def parked(segment: int, offset: int, nbytes: int) -> tuple:
    return (_PARKED, segment, offset, nbytes)


class Batch(NamedTuple):
    kind: int
    messages: list


def batch(messages: list) -> tuple:
    return (_BATCH, messages)


# Each decoder's ``of``: the received tuple, its fields named (``tuple.__new__`` shares the items, no copy).
for _decoder in (Error, Block, Tensor, Request, Response, Ready, Fail, Done, Stream, Bls, BlsCancel, Log, Metric, Call,
                 Poisoned, Finalized, Execute, Cancel, BlsReply, CallReply, Finalize, Segment, Dropped, Parked, Batch):
    _decoder.of = staticmethod(partial(_new, _decoder))  # type: ignore

SCHEMAS: dict[Kind, type] = {  # each kind's fields (INIT and HELLO are JSON: see Init and Hello)
    Kind.READY: Ready, Kind.FAIL: Fail, Kind.DONE: Done, Kind.STREAM: Stream, Kind.BLS: Bls, Kind.BLS_CANCEL: BlsCancel,
    Kind.LOG: Log, Kind.METRIC: Metric, Kind.CALL: Call, Kind.FINALIZED: Finalized, Kind.EXECUTE: Execute,
    Kind.CANCEL: Cancel, Kind.BLS_REPLY: BlsReply, Kind.CALL_REPLY: CallReply, Kind.FINALIZE: Finalize,
    Kind.SEGMENT: Segment, Kind.DROPPED: Dropped, Kind.PARKED: Parked, Kind.BATCH: Batch, Kind.POISONED: Poisoned}

# Plain ints for the encoders: the codecs take exact builtins only (marshal refuses an IntEnum member).
_READY, _FAIL, _DONE, _STREAM = int(Kind.READY), int(Kind.FAIL), int(Kind.DONE), int(Kind.STREAM)
_BLS, _BLS_CANCEL, _LOG, _METRIC = int(Kind.BLS), int(Kind.BLS_CANCEL), int(Kind.LOG), int(Kind.METRIC)
_CALL, _FINALIZED, _EXECUTE, _CANCEL = int(Kind.CALL), int(Kind.FINALIZED), int(Kind.EXECUTE), int(Kind.CANCEL)
_BLS_REPLY, _CALL_REPLY, _FINALIZE = int(Kind.BLS_REPLY), int(Kind.CALL_REPLY), int(Kind.FINALIZE)
_SEGMENT, _DROPPED, _PARKED, _BATCH = int(Kind.SEGMENT), int(Kind.DROPPED), int(Kind.PARKED), int(Kind.BATCH)
_POISONED = int(Kind.POISONED)


def reads(schema: type) -> Callable[[Callable], Callable]:
    """Declare that a function takes ``schema``'s fields as its last parameters (any before them are the
    caller's own), and check now that their names and order are the schema's."""
    fields = schema._fields  # type: ignore[attr-defined]

    def check(function: Callable) -> Callable:
        names = tuple(inspect.signature(function).parameters)
        if names[len(names) - len(fields):] != fields:
            raise TypeError(f"{function.__qualname__} must take {schema.__name__}'s fields {fields} as its last "
                            f"parameters, not {names}")
        return function

    return check


def dispatch_table(handlers: dict[Kind, Callable[..., Any]], default: Callable[..., Any]) -> list:
    """A list indexed by kind, so a receiver dispatches with one subscript: ``table[message[0]](*message)``.
    Each handler must read its kind's fields (``reads``); checked here, once."""
    table = [default] * (max(Kind) + 1)
    for kind, handler in handlers.items():
        reads(SCHEMAS[kind])(handler)
        table[kind] = handler
    return table


# --- handshake and codecs ----------------------------------------------------------------------------------------

class Versions(NamedTuple):
    protocol: int
    python: tuple  # sys.version_info[:3]
    marshal: int
    pickle: int  # the highest pickle protocol this interpreter reads


def local_versions() -> Versions:
    return Versions(PROTOCOL, tuple(sys.version_info[:3]), marshal.version, pickle.HIGHEST_PROTOCOL)


def reported_versions() -> Versions:
    """What a worker reports: its own versions, unless a test asks it to claim others."""
    versions = local_versions()
    override = os.environ.get(TEST_VERSIONS_VARIABLE)
    if override:
        fields = {k: tuple(v) if k == "python" else v for k, v in json.loads(override).items()}
        versions = versions._replace(**fields)  # type: ignore[arg-type]
    return versions


class ProtocolMismatch(Exception):
    pass


class Codec(NamedTuple):
    name: str  # "marshal" or "pickle-<protocol>"
    dumps: Callable[[Any], bytes]
    loads: Callable[[Any], Any]


class _BuiltinsOnly(pickle.Unpickler):
    """Messages hold builtins only (like marshal): refuse anything that would import, so a worker's
    bytes can't make the server run code."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"worker messages carry builtin types only, not {module}.{name}")


def _pickle_loads(data: Any) -> Any:
    return _BuiltinsOnly(BytesIO(data)).load()


MARSHAL = Codec("marshal", marshal.dumps, marshal.loads)


def choose_codec(server: Versions, worker: Versions) -> Codec:
    """The codec both ends use after the handshake (each end calls this with the same two arguments)."""
    if server.protocol != worker.protocol:
        raise ProtocolMismatch(f"it speaks worker channel protocol {worker.protocol}, the server {server.protocol}")
    if tuple(server.python[:2]) == tuple(worker.python[:2]) and server.marshal == worker.marshal:
        return MARSHAL
    protocol = min(server.pickle, worker.pickle)
    if protocol < 4:
        raise ProtocolMismatch(f"its Python {_dotted(worker.python)} reads no pickle protocol >= 4")
    return Codec(f"pickle-{protocol}", partial(pickle.dumps, protocol=protocol), _pickle_loads)


def _dotted(version: tuple) -> str:
    return ".".join(str(v) for v in version)


def describe(versions: Versions) -> str:
    return f"Python {_dotted(versions.python)}, marshal {versions.marshal}"


# The handshake's two messages are JSON objects: any interpreter reads them, and a later protocol may add
# keys without stopping this one from reading the versions (to refuse it with a clear reason).

class Init(NamedTuple):
    setup: dict
    versions: Versions


def encode_init(setup: dict, versions: Versions) -> bytes:
    return json.dumps({"kind": int(Kind.INIT), "setup": setup, **versions._asdict()}).encode()


def decode_init(data: bytes) -> Init:
    fields = json.loads(data)
    if fields.get("kind") != Kind.INIT:
        raise ProtocolMismatch(f"expected the server's INIT message, got kind {fields.get('kind')}")
    return Init(fields["setup"], _versions(fields))


class Hello(NamedTuple):
    versions: Versions
    codec: str  # the codec the worker switched to ("" when it refused the server's protocol)


def encode_hello(versions: Versions, codec: str) -> bytes:
    return json.dumps({"kind": int(Kind.HELLO), "codec": codec, **versions._asdict()}).encode()


def decode_hello(data: bytes) -> Hello:
    """Raises ProtocolMismatch when the first message is not a HELLO this server can read."""
    try:
        fields = json.loads(bytes(data))
        if fields["kind"] != Kind.HELLO:
            raise ValueError(f"kind {fields['kind']}")
        return Hello(_versions(fields), str(fields["codec"]))
    except (ValueError, TypeError, KeyError) as exc:
        raise ProtocolMismatch(f"its first message is not a handshake this server reads ({exc})") from None


def _versions(fields: dict) -> Versions:
    return Versions(int(fields["protocol"]), tuple(fields["python"]), int(fields["marshal"]), int(fields["pickle"]))
