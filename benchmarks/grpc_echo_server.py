#!/usr/bin/env python3
"""A bare grpc.aio server that does no work: the floor for any Python gRPC server.

It answers ``inference.GRPCInferenceService/ModelInfer`` with a fixed, pre-serialized add_sub response and
never parses the request (identity (de)serializers), on uvloop like naiad. ``grpc_add_sub.py`` runs it
as the "echo" peer.

    python benchmarks/grpc_echo_server.py PORT
"""
from __future__ import annotations

import sys

import grpc
import numpy as np
import uvloop
from grpc import aio
from tritonclient.grpc import service_pb2 as pb


def canned_response() -> bytes:
    a = np.array([1, 2, 3, 4], dtype=np.float32)
    b = np.ones(4, dtype=np.float32)
    tensor = pb.ModelInferResponse.InferOutputTensor
    return pb.ModelInferResponse(
        model_name="add_sub", model_version="1",
        outputs=[tensor(name="OUTPUT0", datatype="FP32", shape=[4]), tensor(name="OUTPUT1", datatype="FP32", shape=[4])],
        raw_output_contents=[(a + b).tobytes(), (a - b).tobytes()],
    ).SerializeToString()


async def main(port: int) -> None:
    response = canned_response()

    async def infer(request: bytes, context: aio.ServicerContext) -> bytes:
        return response

    server = aio.server()
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
        "inference.GRPCInferenceService", {"ModelInfer": grpc.unary_unary_rpc_method_handler(infer)}),))
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    await server.wait_for_termination()


if __name__ == "__main__":
    uvloop.run(main(int(sys.argv[1])))
