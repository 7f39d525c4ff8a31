"""Seeded fuzzing of the gRPC front end: ModelInfer messages that lie (shapes, datatypes, raw contents, typed
contents, BYTES prefixes, parameters of the wrong kind, odd names and versions), the other RPCs with odd fields,
bytes that are no valid protobuf at all (sent through a raw ``unary_unary`` without a serializer), unknown
methods, and ModelStreamInfer streams mixing good and bad requests.

The oracle: every call ends within the timeout with a status Triton gives for a client fault (INVALID_ARGUMENT,
NOT_FOUND, UNIMPLEMENTED, ALREADY_EXISTS; UNAVAILABLE only for load/unload outside explicit mode); INTERNAL
only where Triton answers INTERNAL too (a message that does not parse, shared memory that can't be opened);
UNKNOWN (an unhandled exception) never. A stream answers each of its requests once, then ends OK.
"""

from __future__ import annotations

import random
import struct
import time
from dataclasses import dataclass
from typing import Any, Callable

import grpc
import numpy as np
import tritonclient.grpc as grpcclient
from tritonclient.grpc import service_pb2 as pb
from tritonclient.utils import InferenceServerException

from tests.reliability.batches import in_batches
from tests.reliability.http_oracle import SHM_REGION, SHM_SIZE, explained

SERVICE = "/inference.GRPCInferenceService/"
MODELS = ("echo", "bytes", "batched", "ensemble", "sequence", "decoupled", "onnx_add_sub")
DATATYPES = ("BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64", "FP16", "FP32",
             "FP64", "BYTES", "fp32", "", "STRING", "BF16")
ODD_NAMES = ("", "nope", "echo ", "ECHO", "\x00", "e" * 2000, "../echo", "echo/1", "\u00e9")
ODD_VERSIONS = ("", "1", "0", "-1", "2", "abc", "1x", " 1", "+1", "99999999999999999999", "9" * 400, "1.5", "\u0661")

# INTERNAL is Triton's own answer for these client faults; anything else INTERNAL is a server fault.
TRITON_INTERNAL = ("Unable to parse request", "Exception deserializing request!", "Unable to open shared memory region",
                   "Invalid shared memory region")
CLIENT_CODES = {grpc.StatusCode.OK, grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND,
                grpc.StatusCode.UNIMPLEMENTED, grpc.StatusCode.ALREADY_EXISTS}
TRITON_UNAVAILABLE = ("explicit model load / unload is not allowed if polling is enabled", "Request timeout expired")


@dataclass
class GrpcCase:
    kind: str
    method: str
    payload: bytes | list[bytes]  # a list: a ModelStreamInfer stream's messages

    def describe(self) -> str:
        shown = self.payload if isinstance(self.payload, bytes) else b" | ".join(self.payload)
        return f"[{self.kind}] {self.method} {shown[:400]!r}"


@dataclass
class GrpcOutcome:
    case: GrpcCase
    code: grpc.StatusCode | None  # None: no end within the timeout
    details: str
    seconds: float
    problem: str | None


# --- valid requests -----------------------------------------------------------------------------------------------

def valid_infer(rng: random.Random, model: str) -> pb.ModelInferRequest:
    message = pb.ModelInferRequest(model_name=model)
    if model in ("echo", "decoupled"):
        arrays = {"INPUT0": np.array([rng.uniform(-5, 5) for _ in range(rng.randint(0, 5))], dtype=np.float32)}
    elif model == "bytes":
        arrays = {"INPUT0": np.array([rng.choice([b"", b"a", b"xyz"]) for _ in range(rng.randint(0, 4))],
                                     dtype=np.object_)}
    elif model in ("batched", "ensemble"):
        arrays = {"INPUT0": np.array([[rng.randint(-9, 9)] * 2 for _ in range(rng.randint(1, 4))], dtype=np.int32)}
    elif model == "sequence":
        arrays = {"INPUT0": np.array([[rng.randint(0, 9)]], dtype=np.int32)}
        message.parameters["sequence_id"].int64_param = rng.randint(1, 50)
        message.parameters["sequence_start"].bool_param = rng.random() < 0.5
        message.parameters["sequence_end"].bool_param = rng.random() < 0.5
    else:
        b = rng.randint(1, 3)
        arrays = {n: np.full((b, 4), rng.randint(0, 9), dtype=np.float32) for n in ("INPUT0", "INPUT1")}
    for name, array in arrays.items():
        datatype = "BYTES" if array.dtype == np.object_ else {"float32": "FP32", "int32": "INT32"}[str(array.dtype)]
        message.inputs.add(name=name, datatype=datatype, shape=array.shape)
        message.raw_input_contents.append(_raw(array))
    if rng.random() < 0.3:
        message.id = f"id-{rng.randint(0, 99)}"
    return message


def _raw(array: np.ndarray) -> bytes:
    if array.dtype == np.object_:
        return b"".join(struct.pack("<I", len(x)) + x for x in array.ravel())
    return array.tobytes()


# --- mutations ------------------------------------------------------------------------------------------------------

def _param(target: Any, key: str, rng: random.Random) -> None:
    kind = rng.randrange(6)
    param = target[key]
    if kind == 0:
        param.bool_param = rng.random() < 0.5
    elif kind == 1:
        param.int64_param = rng.choice([0, 1, -1, 2**63 - 1, -(2**63), 7])
    elif kind == 2:
        param.string_param = rng.choice(["", "x", "1", "\u00e9", "region"])
    elif kind == 3:
        param.double_param = rng.choice([0.0, -1.5, float("nan"), float("inf")])
    elif kind == 4:
        param.uint64_param = rng.choice([0, 1, 2**64 - 1])
    # kind 5: an InferParameter with no value set at all


def mutate_infer(rng: random.Random, model: str) -> GrpcCase:
    message = valid_infer(rng, model)
    choice = rng.randrange(11)
    tensor = rng.choice(list(message.inputs)) if message.inputs else None
    if choice == 0 and tensor is not None:
        tensor.datatype = rng.choice(DATATYPES)
    elif choice == 1 and tensor is not None:
        del tensor.shape[:]
        # Two negatives whose product is the element count, a zero beside dimensions that overflow: shapes whose
        # count can match the data but that no array can have (a ValueError, and a dropped connection, before).
        tensor.shape.extend(rng.choice([[], [-1], [-(2**63)], [2**62, 4], [0], [2**31, 2**31, 2**31], [1] * 10,
                                        [rng.randint(0, 6)], [3, -3], [-1, -1], [-2, -2],
                                        [0, 2**63 - 1], [2**62, 0, 4]]))
    elif choice == 2:
        raw = message.raw_input_contents
        what = rng.randrange(4)
        if what == 0 and raw:
            raw[rng.randrange(len(raw))] = raw[0][: rng.randrange(len(raw[0]) + 1)] + b"\x01" * rng.randint(0, 3)
        elif what == 1:
            raw.append(b"extra")
        elif what == 2 and raw:
            del raw[-1]
        else:
            del raw[:]
    elif choice == 3 and tensor is not None:  # typed contents, maybe of the wrong kind, maybe beside raw
        field = rng.choice(["bool_contents", "int_contents", "int64_contents", "uint_contents", "uint64_contents",
                            "fp32_contents", "fp64_contents", "bytes_contents"])
        values = {"bool_contents": [True, False], "bytes_contents": [b"a", b""], "fp32_contents": [1.5, 2.5],
                  "fp64_contents": [1.5], "int_contents": [-1, 2**31 - 1], "int64_contents": [-(2**63)],
                  "uint_contents": [2**32 - 1], "uint64_contents": [2**64 - 1]}[field]
        getattr(tensor.contents, field).extend(values * rng.randint(1, 3))
        if rng.random() < 0.6:
            del message.raw_input_contents[:]
    elif choice == 4:  # request parameters of every kind under every reserved key
        for _ in range(rng.randint(1, 3)):
            _param(message.parameters, rng.choice(["sequence_id", "sequence_start", "sequence_end", "priority",
                                                   "timeout", "triton_enable_empty_final_response", "triton_x",
                                                   "binary_data_output", "custom"]), rng)
    elif choice == 5 and tensor is not None:  # tensor parameters
        for _ in range(rng.randint(1, 2)):
            _param(tensor.parameters, rng.choice(["shared_memory_region", "shared_memory_offset",
                                                  "shared_memory_byte_size", "binary_data_size", "other"]), rng)
    elif choice == 6:  # requested outputs
        for _ in range(rng.randint(1, 3)):
            out = message.outputs.add(name=rng.choice(["OUTPUT0", "OUTPUT1", "PID", "NOPE", ""]))
            if rng.random() < 0.7:
                _param(out.parameters, rng.choice(["classification", "shared_memory_region", "shared_memory_offset",
                                                   "shared_memory_byte_size", "binary_data"]), rng)
    elif choice == 7:
        message.model_name = rng.choice(ODD_NAMES)
        message.model_version = rng.choice(ODD_VERSIONS)
    elif choice == 8:  # BYTES whose length prefixes lie
        message = pb.ModelInferRequest(model_name="bytes")
        n = rng.randint(1, 3)
        message.inputs.add(name="INPUT0", datatype="BYTES", shape=[n])
        good = b"".join(struct.pack("<I", 1) + b"a" for _ in range(n))
        message.raw_input_contents.append(rng.choice([
            struct.pack("<I", 2**32 - 1) + good, good[:-1], good + b"\x02", good * 2, good + struct.pack("<I", 9),
            bytes(rng.randrange(256) for _ in range(rng.randint(0, 12)))]))
    elif choice == 9:  # tensors in the registered region (or none), in and out of its bounds
        targets = ([tensor] if tensor is not None and rng.random() < 0.6 else []) + [
            message.outputs.add(name=rng.choice(["OUTPUT0", "OUTPUT1", "PID"])) for _ in range(rng.randint(0, 2))]
        for target in targets:
            target.parameters["shared_memory_region"].string_param = rng.choice([SHM_REGION, SHM_REGION, "nope"])
            for key in ("shared_memory_offset", "shared_memory_byte_size"):
                if rng.random() < 0.8:
                    target.parameters[key].int64_param = rng.choice(
                        [0, 1, 4, 8, SHM_SIZE - 4, SHM_SIZE, SHM_SIZE + 4, -1, -8, 2**63 - 1, -(2**63)])
        if targets and targets[0] is tensor and rng.random() < 0.7:
            del message.raw_input_contents[:1]
    else:  # the same input twice, or an input the model lacks
        if tensor is not None and rng.random() < 0.5:
            message.inputs.add().CopyFrom(tensor)
            message.raw_input_contents.append(message.raw_input_contents[0] if message.raw_input_contents else b"")
        else:
            message.inputs.add(name=rng.choice(["EXTRA", "", "INPUT0"]), datatype="FP32", shape=[1])
            message.raw_input_contents.append(b"\0\0\0\0")
    return GrpcCase("infer", "ModelInfer", message.SerializeToString())


def mutate_protobuf_bytes(rng: random.Random, model: str) -> GrpcCase:
    """Bytes that are not the method's message: a valid one cut, flipped or extended, or noise."""
    data = bytearray(valid_infer(rng, model).SerializeToString())
    choice = rng.randrange(5)
    if choice == 0 and data:
        data = data[: rng.randrange(len(data))]
    elif choice == 1 and data:
        for _ in range(rng.randint(1, 4)):
            data[rng.randrange(len(data))] = rng.randrange(256)
    elif choice == 2:
        data += rng.choice([b"\xff", b"\x0a\x80\x80\x80\x80\x10", b"\x0a\x05ab", b"\x12\x02\xc3\x28", b"\x78"])
    elif choice == 3:
        data = bytearray(rng.randrange(256) for _ in range(rng.randint(1, 40)))
    else:  # a length that claims more than the message holds
        data = bytearray(b"\x0a\xff\xff\xff\x0f") + data
    method = rng.choice(["ModelInfer", "ModelInfer", "ServerLive", "ModelMetadata", "ModelConfig",
                         "ModelStatistics", "RepositoryModelLoad", "SystemSharedMemoryRegister", "TraceSetting",
                         "LogSettings"])
    return GrpcCase("protobuf-bytes", method, bytes(data))


def mutate_control(rng: random.Random, model: str) -> GrpcCase:
    """The other RPCs with odd but well-formed fields."""
    name = rng.choice((model,) + ODD_NAMES)
    version = rng.choice(ODD_VERSIONS)
    choice = rng.randrange(9)
    if choice == 0:
        return GrpcCase("control", "ModelMetadata", pb.ModelMetadataRequest(name=name, version=version)
                        .SerializeToString())
    if choice == 1:
        return GrpcCase("control", "ModelConfig", pb.ModelConfigRequest(name=name, version=version)
                        .SerializeToString())
    if choice == 2:
        return GrpcCase("control", "ModelStatistics", pb.ModelStatisticsRequest(name=name, version=version)
                        .SerializeToString())
    if choice == 3:
        return GrpcCase("control", "ModelReady", pb.ModelReadyRequest(name=name, version=version).SerializeToString())
    if choice == 4:
        message = pb.RepositoryModelLoadRequest(model_name=name)
        for key in rng.sample(["config", "file:1/model.py", "other"], rng.randint(0, 2)):
            message.parameters[key].string_param = "x"
        return GrpcCase("control", rng.choice(["RepositoryModelLoad", "RepositoryModelUnload"]),
                        message.SerializeToString())
    if choice == 5:
        message = pb.SystemSharedMemoryRegisterRequest(
            name=rng.choice(["", "r", "r" * 500]), key=rng.choice(["", "/no-such-naiad-fuzz-region", "x"]),
            offset=rng.choice([0, 2**63]), byte_size=rng.choice([0, 16, 2**64 - 1]))
        return GrpcCase("control", "SystemSharedMemoryRegister", message.SerializeToString())
    if choice == 6:
        return GrpcCase("control", rng.choice(["SystemSharedMemoryStatus", "SystemSharedMemoryUnregister",
                                               "CudaSharedMemoryStatus", "CudaSharedMemoryUnregister"]),
                        pb.SystemSharedMemoryStatusRequest(name=rng.choice(["", "nope", "\u00e9"])).SerializeToString())
    if choice == 7:
        message = pb.TraceSettingRequest(model_name=rng.choice(["", model, "nope"]))
        for key in rng.sample(["trace_level", "trace_rate", "trace_count", "log_frequency", "trace_file", "x"],
                              rng.randint(0, 3)):
            message.settings[key].value.extend(rng.choice([[], ["x"], ["-1"], ["TIMESTAMPS", "OFF"], ["99999999999"]]))
        return GrpcCase("control", "TraceSetting", message.SerializeToString())
    message = pb.LogSettingsRequest()
    for key in rng.sample(["log_file", "log_info", "log_warning", "log_error", "log_verbose_level", "log_format",
                           "x"], rng.randint(0, 3)):
        _log_value(message.settings[key], rng)
    return GrpcCase("control", "LogSettings", message.SerializeToString())


def _log_value(value: Any, rng: random.Random) -> None:
    kind = rng.randrange(4)
    if kind == 0:
        value.bool_param = rng.random() < 0.5
    elif kind == 1:
        value.uint32_param = rng.choice([0, 1, 2**32 - 1])
    elif kind == 2:
        value.string_param = rng.choice(["", "ISO8601", "default", "/nonexistent/dir/file"])


def mutate_method(rng: random.Random, _: str) -> GrpcCase:
    return GrpcCase("method", rng.choice(["Nope", "modelinfer", "", "ModelInfer/extra", "../ServerLive"]), b"")


def mutate_stream(rng: random.Random, model: str) -> GrpcCase:
    """A ModelStreamInfer stream of good and bad requests (well-formed protobuf: the stream must go on)."""
    messages = []
    model = model if model != "decoupled" else "echo"  # one response per request, so they can be counted
    for _ in range(rng.randint(1, 5)):
        if rng.random() < 0.5:
            messages.append(valid_infer(rng, rng.choice(("echo", "bytes", "batched", "onnx_add_sub")))
                            .SerializeToString())
        else:
            case = mutate_infer(rng, model)
            messages.append(case.payload)  # type: ignore[arg-type]
    if rng.random() < 0.15:  # one message that does not parse: the stream ends with INTERNAL, as Triton's does
        messages.insert(rng.randrange(len(messages) + 1), mutate_protobuf_bytes(rng, model).payload)  # type: ignore
        return GrpcCase("stream-bytes", "ModelStreamInfer", messages)
    return GrpcCase("stream", "ModelStreamInfer", messages)


MUTATIONS: list[tuple[Callable[[random.Random, str], GrpcCase], int]] = [
    (mutate_infer, 50), (mutate_protobuf_bytes, 15), (mutate_control, 20), (mutate_method, 2), (mutate_stream, 10),
]


def generate(seed: int, count: int) -> list[GrpcCase]:
    rng = random.Random(seed)
    functions = [f for f, _ in MUTATIONS]
    weights = [w for _, w in MUTATIONS]
    return [rng.choices(functions, weights)[0](rng, rng.choice(MODELS)) for _ in range(count)]


# --- the oracle and the runner --------------------------------------------------------------------------------------

def judge(case: GrpcCase, code: grpc.StatusCode | None, details: str, seconds: float, timeout: float,
          answers: int | None = None) -> GrpcOutcome:
    problem = None
    if code is None or code == grpc.StatusCode.DEADLINE_EXCEEDED:
        problem = f"no end within {timeout:.0f} s"
    elif code in CLIENT_CODES:
        if code != grpc.StatusCode.OK and code != grpc.StatusCode.UNIMPLEMENTED and not details.strip():
            problem = f"{code.name} without a message"
    elif code == grpc.StatusCode.INTERNAL and explained(details, TRITON_INTERNAL):
        pass
    elif code == grpc.StatusCode.UNAVAILABLE and explained(details, TRITON_UNAVAILABLE):
        pass
    else:
        problem = f"{code.name}: {details}"
    if problem is None and answers is not None and isinstance(case.payload, list) and code == grpc.StatusCode.OK:
        if answers != len(case.payload):
            problem = f"the stream answered {answers} of its {len(case.payload)} requests"
    return GrpcOutcome(case, code, details, seconds, problem)


class GrpcFuzzer:
    def __init__(self, target: str, timeout: float = 10.0) -> None:
        self.target = target
        self.timeout = timeout
        self.channel = grpc.insecure_channel(target)
        self._calls: dict[str, Any] = {}

    def close(self) -> None:
        self.channel.close()

    def _unary(self, method: str) -> Any:
        call = self._calls.get(method)
        if call is None:
            # No serializers: the payload's bytes go out as they are, and the answer's come back unparsed.
            call = self._calls[method] = self.channel.unary_unary(SERVICE + method, request_serializer=None,
                                                                  response_deserializer=None)
        return call

    def send(self, case: GrpcCase) -> GrpcOutcome:
        started = time.monotonic()
        answers = None
        try:
            if isinstance(case.payload, list):
                stream = self.channel.stream_stream(SERVICE + case.method, request_serializer=None,
                                                    response_deserializer=None)
                answers = sum(1 for _ in stream(iter(case.payload), timeout=self.timeout))
            else:
                self._unary(case.method)(case.payload, timeout=self.timeout)
            code, details = grpc.StatusCode.OK, ""
        except grpc.RpcError as exc:
            code, details = exc.code(), exc.details() or ""
        return judge(case, code, details, time.monotonic() - started, self.timeout, answers)


def healthy(target: str, timeout: float = 10.0) -> str | None:
    """None if live, ready and still echoing a tensor correctly, as tritonclient's gRPC client sees it."""
    try:
        with grpcclient.InferenceServerClient(target) as client:
            if not client.is_server_live(client_timeout=timeout):
                return "not live"
            if not client.is_server_ready(client_timeout=timeout):
                return "not ready"
            tensor = grpcclient.InferInput("INPUT0", [2], "FP32")
            tensor.set_data_from_numpy(np.array([1, 2], dtype=np.float32))
            result = client.infer("echo", [tensor], client_timeout=timeout)
            if result.as_numpy("OUTPUT0").tolist() != [1.0, 2.0]:
                return f"echo answered {result.get_response()}"
    except InferenceServerException as exc:
        return f"health check failed: {exc}"
    return None


def run(target: str, cases: list[GrpcCase], batch: int = 50, timeout: float = 10.0,
        alive: Callable[[], bool] = lambda: True, parallel: int = 1) -> tuple[list[GrpcOutcome], list[str]]:
    """Every case's outcome, and what went wrong between batches; ``parallel`` channels send each batch at once."""
    return in_batches([GrpcFuzzer(target, timeout) for _ in range(parallel)], cases, batch, alive,
                      lambda: healthy(target, timeout))
