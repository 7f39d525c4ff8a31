"""Front-end processes attacked (issue 31), each with two front ends (``--frontend-processes 2``) and real clients:

- reloads with a changed config under load: a front end's check keyed to the old version must not reach the new one
  (before: the old reshape was applied and the host refused a shape the client never sent, 400);
"""

from __future__ import annotations

import http.client
import json
import threading
from pathlib import Path

import numpy as np
from onnx import helper, numpy_helper

from tests import onnx_graphs as g
from tests.server import RunningServer

FRONT_ENDS = ("--frontend-processes", "2")

# INPUT0 [4] reshaped for the model; reloads alternate the reshape, which the graph takes either way.
RESHAPED = """
    name: "reshaped"
    platform: "onnxruntime_onnx"
    max_batch_size: 4
    input [{{ name: "INPUT0", data_type: TYPE_FP32, dims: [ 4 ], reshape {{ shape: [ {shape} ] }} }}]
    output [{{ name: "OUTPUT0", data_type: TYPE_FP32, dims: [ 4 ] }}]
"""


def _flatten() -> object:
    """OUTPUT0 = INPUT0 [batch, a, b] as [batch, 4], whatever a and b are."""
    shape = numpy_helper.from_array(np.array([-1, 4], np.int64), "shape")
    return g.model([helper.make_node("Reshape", ["INPUT0", "shape"], ["OUTPUT0"])],
                   [g.tensor("INPUT0", "TYPE_FP32", ["batch", "a", "b"])],
                   [g.tensor("OUTPUT0", "TYPE_FP32", ["batch", 4])], [shape])


def test_a_reload_with_another_reshape_under_load_refuses_nothing(tmp_path: Path) -> None:
    g.write(tmp_path, "reshaped", _flatten(), RESHAPED.format(shape="2, 2"))
    server = RunningServer([tmp_path], "--model-control-mode", "explicit", "--load-model", "reshaped", *FRONT_ENDS)
    body = json.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}]})
    answers: dict[int, int] = {}
    wrong: list[bytes] = []
    stop = threading.Event()

    def hammer() -> None:
        conn = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=30)
        try:
            while not stop.is_set():
                conn.request("POST", "/v2/models/reshaped/infer", body)
                response = conn.getresponse()
                data = response.read()
                answers[response.status] = answers.get(response.status, 0) + 1
                if response.status != 200 or json.loads(data)["outputs"][0]["data"] != [1, 2, 3, 4]:
                    wrong.append(data)
        finally:
            conn.close()

    threads = [threading.Thread(target=hammer) for _ in range(4)]
    try:
        for thread in threads:
            thread.start()
        reshapes = []
        for i in range(30):
            shape = "4, 1" if i % 2 == 0 else "2, 2"
            (tmp_path / "reshaped" / "config.pbtxt").write_text(RESHAPED.format(shape=shape))
            status, _, reply = server.request("POST", "/v2/repository/models/reshaped/load")
            assert status == 200, reply
            _, _, config = server.request("GET", "/v2/models/reshaped/config")
            reshapes.append(json.loads(config)["input"][0]["reshape"]["shape"])
    finally:
        stop.set()
        for thread in threads:
            thread.join()
        server.stop()
    assert reshapes[:2] == [[4, 1], [2, 2]]  # each reload served the changed config
    assert not wrong, (answers, wrong[:3])
    assert answers.get(200, 0) > 100  # requests met the reloads
