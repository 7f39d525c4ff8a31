"""raw_contents.py: a big ModelInfer message's tensors kept out of protobuf, byte for byte what protobuf reads and
writes."""

from __future__ import annotations

import pytest
from tritonclient.grpc import service_pb2 as pb

from naiad.frontends.grpc.raw_contents import response_tail, split_request


def _request() -> pb.ModelInferRequest:
    message = pb.ModelInferRequest(model_name="m", model_version="2", id="x" * 300)
    message.parameters["priority"].int64_param = 3
    for name in ("A", "B", "C"):
        message.inputs.add(name=name, datatype="FP32", shape=[2])
    message.outputs.add(name="OUT")
    message.raw_input_contents.extend([b"\1" * 70000, b"", b"\2" * 8])
    return message


def test_split_request_matches_protobuf() -> None:
    message = _request()
    wire = message.SerializeToString()
    rest, raw = split_request(memoryview(wire))
    assert [bytes(r) for r in raw] == list(message.raw_input_contents)
    assert all(r.readonly for r in raw)
    parsed = pb.ModelInferRequest.FromString(rest)
    del message.raw_input_contents[:]
    assert parsed == message


def test_split_request_keeps_fields_after_the_contents_in_order() -> None:
    # Protobuf writes field 7 last, but a message may carry fields in any order: the rest keeps them all.
    head = pb.ModelInferRequest(model_name="first").SerializeToString()
    tail = pb.ModelInferRequest(model_name="last", id="i").SerializeToString()
    raw = pb.ModelInferRequest(raw_input_contents=[b"r"]).SerializeToString()
    rest, views = split_request(memoryview(head + raw + tail))
    parsed = pb.ModelInferRequest.FromString(rest)
    assert (parsed.model_name, parsed.id, [bytes(v) for v in views]) == ("last", "i", [b"r"])


@pytest.mark.parametrize("cut", [1, 5, 20])
def test_truncated_messages_are_refused(cut: int) -> None:
    wire = _request().SerializeToString()
    with pytest.raises(ValueError):
        split_request(memoryview(wire[:-cut]))


def test_response_tail_is_what_protobuf_writes() -> None:
    raw = [b"\3" * 70000, b"", b"\4" * 200]
    message = pb.ModelInferResponse(model_name="m", model_version="1", id="i")
    message.parameters["p"].string_param = "v"
    message.outputs.add(name="OUT", datatype="FP32", shape=[17500])
    head = message.SerializeToString()
    message.raw_output_contents.extend(raw)
    assert head + b"".join(response_tail([memoryview(r) for r in raw])) == message.SerializeToString()
