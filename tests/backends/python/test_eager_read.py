"""The server reads a worker's answer right after sending it the execution when it is already there (the worker
preempted the server on their shared core), and otherwise leaves it to the loop for a while (router.py,
``Router._flush_turn``): answers on one connection stay right whichever way each one is read."""

from __future__ import annotations

import http.client
import json
import os
import subprocess
from collections.abc import Iterator

import pytest

from tests.backends.python import models as m
from tests.server import RunningServer

FP32_IO = [("INPUT0", "TYPE_FP32", "[ 4 ]"), ("INPUT1", "TYPE_FP32", "[ 4 ]")]
FP32_OUT = [("OUTPUT0", "TYPE_FP32", "[ 4 ]"), ("OUTPUT1", "TYPE_FP32", "[ 4 ]")]
SLOW_ADD_SUB = m.ADD_SUB.replace("    def execute(self, requests):\n",
                                 "    def execute(self, requests):\n        import time; time.sleep(0.002)\n")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    repo = tmp_path_factory.mktemp("eager")
    m.write(repo, "add_sub", m.io_config("add_sub", FP32_IO, FP32_OUT), m.ADD_SUB)
    m.write(repo, "slow_add_sub", m.io_config("slow_add_sub", FP32_IO, FP32_OUT), SLOW_ADD_SUB)
    running = RunningServer([repo])
    # The server and its workers on one core, as at one connection on a small host: a quick worker answers
    # within the server's send.
    core = min(os.sched_getaffinity(0))
    children = subprocess.run(["pgrep", "-P", str(running.proc.pid)], capture_output=True, text=True,
                              check=False).stdout
    for pid in [running.proc.pid, *map(int, children.split())]:
        os.sched_setaffinity(pid, {core})
    yield running
    running.stop()


def _infer(conn: http.client.HTTPConnection, model: str, i: int) -> None:
    a, b = [i, i + 1.5, -i, 0.25], [1.0, 2.0, 3.0, float(i)]
    body = json.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [4], "data": a},
                                  {"name": "INPUT1", "datatype": "FP32", "shape": [4], "data": b}]})
    conn.request("POST", f"/v2/models/{model}/infer", body, {"Content-Type": "application/json"})
    response = conn.getresponse()
    doc = json.loads(response.read())
    assert response.status == 200, doc
    outputs = {o["name"]: o["data"] for o in doc["outputs"]}
    assert outputs == {"OUTPUT0": [x + y for x, y in zip(a, b)], "OUTPUT1": [x - y for x, y in zip(a, b)]}


def test_answers_read_at_once_or_by_the_loop_stay_right(server: RunningServer) -> None:
    # Quick executions (answered within the send), slow ones (not there yet: the loop reads them, and the next
    # sends don't look), and quick ones again past the back-off, one request at a time on one connection.
    conn = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=30)
    for i in range(300):
        _infer(conn, "slow_add_sub" if 100 <= i < 110 else "add_sub", i)
    conn.close()
