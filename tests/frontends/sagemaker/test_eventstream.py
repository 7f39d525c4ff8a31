"""The event stream encoder against botocore's own decoder and its sagemaker-runtime response parser."""

from __future__ import annotations

import io
import json
import struct
import zlib

import boto3
import botocore.session
import pytest
import urllib3
from botocore.awsrequest import AWSResponse
from botocore.eventstream import ChecksumMismatch, EventStream, EventStreamBuffer
from botocore.exceptions import EventStreamError
from botocore.parsers import create_parser

from naiad.frontends.sagemaker import eventstream
from naiad.frontends.sagemaker.eventstream import (
    CONTENT_TYPE,
    encode_message,
    internal_stream_failure,
    model_stream_error,
    payload_part,
)

OPERATION = "InvokeEndpointWithResponseStream"


def decode(data: bytes, step: int | None = None) -> list:
    """All messages in ``data``, fed to botocore's buffer ``step`` bytes at a time (all at once by default)."""
    buffer = EventStreamBuffer()
    messages = []
    step = step or len(data) or 1
    for start in range(0, len(data), step):
        buffer.add_data(data[start:start + step])
        messages.extend(buffer)
    return messages


@pytest.fixture(scope="module")
def operation():
    model = botocore.session.get_session().get_service_model("sagemaker-runtime")
    assert model.protocol == "rest-json"
    return model.operation_model(OPERATION)


class _Body:
    """The raw HTTP body botocore hands an event stream: something with ``stream()`` and ``close()``."""

    def __init__(self, data: bytes, chunk: int) -> None:
        self.data, self.chunk = data, chunk

    def stream(self):
        for start in range(0, len(self.data), self.chunk):
            yield self.data[start:start + self.chunk]

    def close(self) -> None:
        pass


def parse_response(operation, body: bytes, chunk: int = 7) -> dict:
    """The parsed output of a 200 response carrying ``body``, as the client builds it."""
    parser = create_parser(operation.metadata["protocol"])
    response = {
        "status_code": 200,
        "headers": {"X-Amzn-SageMaker-Content-Type": "text/plain",
                    "x-Amzn-Invoked-Production-Variant": "AllTraffic"},
        "body": _Body(body, chunk),
        "context": {"operation_name": OPERATION},
    }
    return parser.parse(response, operation.output_shape)


def test_known_vector_for_an_empty_message():
    # The empty message of the format's published test vectors: 16 bytes, both CRCs fixed.
    assert encode_message({}, b"") == bytes.fromhex("000000100000000005c248eb7d98c8ff")


def test_frame_layout_and_crcs():
    data = encode_message({"a": "b"}, b"xyz")
    total, headers_length, prelude_crc = struct.unpack(">III", data[:12])
    assert total == len(data) == 12 + headers_length + 3 + 4
    assert headers_length == 1 + 1 + 1 + 2 + 1
    assert prelude_crc == zlib.crc32(data[:8])
    assert struct.unpack(">I", data[-4:])[0] == zlib.crc32(data[:-4])


def test_round_trip_every_header_type():
    headers = {"s": "text ✓", "b": b"\x00\xffraw", "yes": True, "no": False, "small": -5,
               "big": 2**40, "neg": -(2**63)}
    (message,) = decode(encode_message(headers, b"payload"))
    assert message.headers == headers
    assert message.payload == b"payload"


def test_byte_by_byte_stream_of_several_messages():
    parts = [b"", b"a", bytes(range(256)) * 10]
    data = b"".join(payload_part(p) for p in parts) + model_stream_error("late", "StreamBroken")
    messages = decode(data, step=1)
    assert [m.payload for m in messages[:3]] == parts
    assert messages[3].headers[":message-type"] == "exception"


def test_corruption_is_caught_by_the_crcs():
    data = bytearray(payload_part(b"hello"))
    data[-6] ^= 1
    with pytest.raises(ChecksumMismatch):
        decode(bytes(data))


def test_payload_part_headers():
    (message,) = decode(payload_part(b"\x01\x02"))
    assert message.headers == {":event-type": "PayloadPart", ":message-type": "event",
                               ":content-type": "application/octet-stream"}
    assert message.payload == b"\x01\x02"


def test_exception_events_carry_the_shape_members_as_json():
    (error,) = decode(model_stream_error("too slow", "ModelInvocationTimeExceeded"))
    assert error.headers == {":exception-type": "ModelStreamError", ":message-type": "exception",
                             ":content-type": "application/json"}
    assert json.loads(error.payload) == {"Message": "too slow", "ErrorCode": "ModelInvocationTimeExceeded"}
    (failure,) = decode(internal_stream_failure("oops"))
    assert failure.headers[":exception-type"] == "InternalStreamFailure"
    assert json.loads(failure.payload) == {"Message": "oops"}


def test_large_payload_is_split_into_consecutive_parts(monkeypatch):
    monkeypatch.setattr(eventstream, "MAX_PART", 10)
    data = bytes(range(25))
    messages = decode(payload_part(data))
    assert [len(m.payload) for m in messages] == [10, 10, 5]
    assert b"".join(m.payload for m in messages) == data


@pytest.mark.parametrize("headers, payload, error", [
    ({"": "x"}, b"", ValueError),
    ({"n" * 256: "x"}, b"", ValueError),
    ({"v": "x" * 32768}, b"", ValueError),
    ({"i": 2**63}, b"", ValueError),
    ({"f": 1.5}, b"", TypeError),
    ({}, b"x" * (16 * 1024 * 1024), ValueError),
])
def test_limits_of_the_format(headers, payload, error):
    with pytest.raises(error):
        encode_message(headers, payload)


def test_parser_yields_payload_parts_as_boto3_does(operation):
    parsed = parse_response(operation, payload_part(b"Hello, ") + payload_part(b"\x00world"))
    assert parsed["ContentType"] == "text/plain"
    assert parsed["InvokedProductionVariant"] == "AllTraffic"
    stream = parsed["Body"]
    assert isinstance(stream, EventStream)
    assert list(stream) == [{"PayloadPart": {"Bytes": b"Hello, "}}, {"PayloadPart": {"Bytes": b"\x00world"}}]


@pytest.mark.parametrize("event, code, message", [
    (model_stream_error("model timed out", "ModelInvocationTimeExceeded"), "ModelStreamError", "model timed out"),
    (internal_stream_failure("stream failed"), "InternalStreamFailure", "stream failed"),
])
def test_parser_raises_stream_errors_after_the_parts_before_them(operation, event, code, message):
    stream = parse_response(operation, payload_part(b"first") + event + payload_part(b"never"))["Body"]
    events = iter(stream)
    assert next(events) == {"PayloadPart": {"Bytes": b"first"}}
    with pytest.raises(EventStreamError) as caught:
        next(events)
    assert caught.value.response["Error"] == {"Code": code, "Message": message}
    assert str(caught.value) == f"An error occurred ({code}) when calling the {OPERATION} operation: {message}"


def test_boto3_client_reads_the_stream():
    # The real client end to end, with the HTTP exchange answered in-process (no socket is opened).
    body = payload_part(b'{"a": ') + payload_part(b"1}") + model_stream_error("broken", "StreamBroken")
    client = boto3.client("sagemaker-runtime", region_name="us-east-1", endpoint_url="http://127.0.0.1:9",
                          aws_access_key_id="k", aws_secret_access_key="s")
    seen = {}

    def answer(request, **_):
        seen["url"], seen["headers"] = request.url, request.headers
        raw = urllib3.HTTPResponse(body=io.BytesIO(body), preload_content=False)
        headers = {"Content-Type": CONTENT_TYPE.decode(), "X-Amzn-SageMaker-Content-Type": "application/json",
                   "x-Amzn-Invoked-Production-Variant": "AllTraffic"}
        return AWSResponse(request.url, 200, headers, raw)

    client.meta.events.register("before-send.sagemaker-runtime.*", answer)
    response = client.invoke_endpoint_with_response_stream(EndpointName="ep", Body=b"{}",
                                                           ContentType="application/json")
    assert seen["url"] == "http://127.0.0.1:9/endpoints/ep/invocations-response-stream"
    assert response["ContentType"] == "application/json"
    chunks = []
    with pytest.raises(client.exceptions.ClientError) as caught:
        for event in response["Body"]:
            chunks.append(event["PayloadPart"]["Bytes"])
    assert b"".join(chunks) == b'{"a": 1}'
    assert isinstance(caught.value, EventStreamError)
    assert caught.value.response["Error"]["Code"] == "ModelStreamError"
