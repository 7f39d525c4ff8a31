"""The worker channel's schema and handshake: every kind has one encoder and one decoder that agree, through
both codecs; the codec choice follows the two interpreters' versions; and a worker that reports another
Python version (simulated with the test-only variable) is served through pickle, while one speaking another
channel protocol fails its model's load with a clear error."""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import pickle
from pathlib import Path

import numpy as np
import pytest

from naiad.backends.base import VersionContext
from naiad.backends.python import messages as M
from naiad.backends.python.backend import PythonBackend
from naiad.backends.python.messages import Kind, Versions
from naiad.config.loader import load_config
from naiad.config.normalize import fill_defaults
from naiad.config.render import config_to_dict
from naiad.core.errors import InferError
from naiad.core.request import InferRequest
from tests.backends.python import models as m

# kind -> (encoder, decoder, sample fields)
_TENSOR = M.tensor("IN", "<f4", (2,), M.block(1, 64, 8, False))
_REQUEST = M.request("id-1", 7, 0, 100, {"p": 1}, ["OUT"], [_TENSOR])
_RESPONSE = M.response(None, [M.tensor("OUT", "BYTES", (1,), b"\x01\x00\x00\x00x")], {"q": "v"})
CASES = {
    Kind.READY: (M.ready, M.Ready, (True, 123, "/usr/bin/python3")),
    Kind.FAIL: (M.fail, M.Fail, ("INTERNAL", "boom")),
    Kind.DONE: (M.done, M.Done, (5, None, [_RESPONSE], 1, 2, 3, 4, [0])),
    Kind.STREAM: (M.stream, M.Stream, (5, 0, _RESPONSE, 1)),
    Kind.BLS: (M.bls, M.Bls, (9, "other", -1, _REQUEST, False)),
    Kind.BLS_CANCEL: (M.bls_cancel, M.BlsCancel, (9,)),
    Kind.LOG: (M.log, M.Log, (1, "a line")),
    Kind.METRIC: (M.metric, M.Metric, (4, "inc", 1.5)),
    Kind.CALL: (M.call, M.Call, (3, "family", ("name", "help", 0))),
    Kind.FINALIZED: (M.finalized, M.Finalized, (None,)),
    Kind.EXECUTE: (M.execute, M.Execute, (5, [_REQUEST])),
    Kind.CANCEL: (M.cancel, M.Cancel, (5, -1)),
    Kind.BLS_REPLY: (M.bls_reply, M.BlsReply, (9, M.error_response("NOT_FOUND", "no such model"), True)),
    Kind.CALL_REPLY: (M.call_reply, M.CallReply, (3, True, 2.0)),
    Kind.FINALIZE: (M.finalize, M.Finalize, ()),
    Kind.SEGMENT: (M.segment, M.Segment, (2,)),
    Kind.DROPPED: (M.dropped, M.Dropped, ([0, 1],)),
    Kind.PARKED: (M.parked, M.Parked, (2, 128, 70000)),
    Kind.BATCH: (M.batch, M.Batch, ([M.log(0, "x"), M.bls_cancel(1)],)),
    Kind.POISONED: (M.poisoned, M.Poisoned, ("device-side assert triggered",)),
}
PICKLE = M.choose_codec(M.local_versions(), M.local_versions()._replace(python=(3, 7, 0)))


def test_every_kind_but_the_json_handshake_has_a_case() -> None:
    assert set(CASES) | {Kind.INIT, Kind.HELLO} == set(Kind)


@pytest.mark.parametrize("codec", [M.MARSHAL, PICKLE], ids=lambda c: c.name)
@pytest.mark.parametrize("kind", list(CASES), ids=lambda k: k.name)
def test_encoder_and_decoder_agree_through_the_codec(kind: Kind, codec: M.Codec) -> None:
    encode, decoder, fields = CASES[kind]
    # The encoder's parameters are the decoder's fields, in order: one schema.
    assert tuple(inspect.signature(encode).parameters) == decoder._fields[1:] or not fields
    decoded = decoder.of(codec.loads(codec.dumps(encode(*fields))))
    assert decoded.kind == kind and tuple(decoded)[1:] == fields


@pytest.mark.parametrize("encode, record", [(M.error, M.Error), (M.block, M.Block), (M.tensor, M.Tensor),
                                            (M.request, M.Request), (M.response, M.Response)])
def test_record_encoders_take_the_fields_in_order(encode, record) -> None:
    assert tuple(inspect.signature(encode).parameters) == record._fields


def test_records_decode_by_name() -> None:
    request = M.Request.of(_REQUEST)
    assert (request.id, request.requested, request.timeout) == ("id-1", ["OUT"], 100)
    tensor = M.Tensor.of(request.inputs[0])
    assert (tensor.name, tensor.shape, M.Block.of(tensor.payload).offset) == ("IN", (2,), 64)
    error = M.Error.of(M.Response.of(M.error_response("NOT_FOUND", "gone")).error)
    assert (error.code, error.message) == ("NOT_FOUND", "gone")


def test_kinds_are_plain_ints_on_the_wire() -> None:
    import marshal

    assert type(M.done(1, None, None, 0, 0, 0, 0, None)[0]) is int
    marshal.dumps(M.execute(1, []))  # marshal refuses IntEnum members: this would raise


def test_dispatch_table_spreads_messages_into_handlers_named_by_the_schema() -> None:
    seen: list[tuple] = []

    def on_log(kind: int, level: int, text: str) -> None:
        seen.append(("log", level, text))

    table = M.dispatch_table({Kind.LOG: on_log}, lambda kind, *rest: seen.append(("?", kind)))
    for message in (M.log(2, "x"), M.bls_cancel(2)):
        table[message[0]](*message)
    assert seen == [("log", 2, "x"), ("?", Kind.BLS_CANCEL)]


def test_a_reader_whose_parameters_are_not_the_schema_is_refused_when_defined() -> None:
    def swapped(kind: int, text: str, level: int) -> None:
        pass

    with pytest.raises(TypeError, match="must take Log's fields"):
        M.dispatch_table({Kind.LOG: swapped}, print)
    with pytest.raises(TypeError, match="must take Response's fields"):
        @M.reads(M.Response)
        def read(request: object, error: object, parameters: object, outputs: object) -> None:
            pass

    @M.reads(M.Response)  # leading parameters of the reader's own are fine
    def fine(request: object, error: object, outputs: object, parameters: object) -> None:
        pass


def test_codec_choice_follows_the_versions() -> None:
    server = Versions(M.PROTOCOL, (3, 11, 7), 4, 5)
    assert M.choose_codec(server, server._replace(python=(3, 11, 2))) is M.MARSHAL  # patch releases match
    other = M.choose_codec(server, server._replace(python=(3, 12, 1)))
    assert other.name == "pickle-5"
    assert M.choose_codec(server, server._replace(python=(3, 8, 10), pickle=5)).name == "pickle-5"
    assert M.choose_codec(server, server._replace(marshal=3)).name == "pickle-5"  # same Python, other marshal
    assert M.choose_codec(server._replace(pickle=4), server._replace(python=(3, 12, 0))).name == "pickle-4"
    with pytest.raises(M.ProtocolMismatch, match="protocol 99"):
        M.choose_codec(server, server._replace(protocol=99))


def test_pickle_codec_refuses_anything_but_builtins() -> None:
    class Evil:
        def __reduce__(self):  # what a hostile worker could send: a call made while unpickling
            return (print, ("pwned",))

    with pytest.raises(pickle.UnpicklingError, match="builtin types only"):
        PICKLE.loads(pickle.dumps(M.log(0, Evil())))


def test_handshake_messages_are_json() -> None:
    versions = M.local_versions()
    init = M.decode_init(M.encode_init({"model_name": "m"}, versions))
    assert init.setup == {"model_name": "m"} and init.versions == versions
    json.loads(M.encode_hello(versions, "marshal"))
    hello = M.decode_hello(M.encode_hello(versions, "marshal"))
    assert hello.versions == versions and hello.codec == "marshal"
    with pytest.raises(M.ProtocolMismatch):
        M.decode_hello(b"\xe9\x05\x00\x00\x00")  # not JSON: a worker from before the handshake existed
    # A later protocol may add keys: its versions still read, so the refusal can say why.
    future = {**json.loads(M.encode_hello(versions._replace(protocol=M.PROTOCOL + 1), "")), "compression": "zstd"}
    assert M.decode_hello(json.dumps(future).encode()).versions.protocol == M.PROTOCOL + 1


# --- the handshake with a real worker process ------------------------------------------------------------------

ECHO = """
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            data = r.inputs()[0].as_numpy()
            text = np.array([f"{data.size}:{int(data.sum())}".encode()], dtype=np.object_)
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("ECHO", data), pb_utils.Tensor("TEXT", text)]))
        return out
"""


def _load(tmp_path: Path):
    m.write(tmp_path, "echo", m.io_config("echo", [("IN", "TYPE_INT32", "[ -1 ]")],
                                          [("ECHO", "TYPE_INT32", "[ -1 ]"), ("TEXT", "TYPE_STRING", "[ 1 ]")]), ECHO)
    folder = tmp_path / "echo"
    config, _ = load_config(folder, "")
    fill_defaults(config, "echo")
    ctx = VersionContext("echo", 1, config, json.dumps(config_to_dict(config)), folder, folder / "1", {})
    return PythonBackend().load(ctx)


def _round_trips(loaded) -> None:
    async def run() -> None:
        for size in (4, 100_000):  # inline, and through shared memory
            data = np.arange(size, dtype=np.int32)
            execution = await loaded.instances[0].execute([InferRequest("echo", inputs={"IN": data})])
            outputs = execution.responses[0].outputs
            np.testing.assert_array_equal(outputs["ECHO"], data)
            assert outputs["TEXT"][0] == f"{size}:{int(data.sum())}".encode()

    asyncio.run(run())


def test_matching_versions_keep_marshal(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(M.TEST_VERSIONS_VARIABLE, raising=False)
    loaded = _load(tmp_path)
    try:
        assert loaded.processes[0].codec is M.MARSHAL
        _round_trips(loaded)
    finally:
        loaded.unload()


def test_a_worker_on_another_python_is_served_through_pickle(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                            caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv(M.TEST_VERSIONS_VARIABLE, json.dumps({"python": [3, 9, 18], "pickle": 5}))
    with caplog.at_level(logging.INFO, logger="naiad.python"):
        loaded = _load(tmp_path)
    try:
        process = loaded.processes[0]
        assert process.codec.name == "pickle-5" and process.ch.codec is process.codec
        assert any("runs on Python 3.9.18" in r.message and "pickle protocol 5 instead of marshal" in r.message
                   for r in caplog.records)
        _round_trips(loaded)
    finally:
        loaded.unload()


def test_a_worker_speaking_another_protocol_fails_the_load(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(M.TEST_VERSIONS_VARIABLE, json.dumps({"protocol": M.PROTOCOL + 1}))
    with pytest.raises(InferError) as caught:
        _load(tmp_path)
    assert caught.value.code.name == "INTERNAL"
    assert caught.value.message == (
        f"Received unexpected response from Python backend stub: echo_0 (it speaks worker channel protocol "
        f"{M.PROTOCOL + 1}, the server {M.PROTOCOL}; the worker must run the server's own naiad package)")
