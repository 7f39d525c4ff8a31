"""Front-end processes attacked (issue 31), each with two front ends (``--frontend-processes 2``) and real clients:

- reloads with a changed config under load: a front end's check keyed to the old version must not reach the new one
  (before: the old reshape was applied and the host refused a shape the client never sent, 400);
- shared memory too short for the tensors (every shared-memory file capped at 48 MiB by RLIMIT_FSIZE, which bounds
  memfds and /dev/shm files alike, as a full /dev/shm or a memory limit does): large answers still cross, inline
  and in parts (before: the host's send failed and the clients hung);
- a model host stopped (SIGSTOP) for seconds: health answers at once, "not ready"; requests with a timeout are
  answered when it runs out; the rest when the host is back (before: health, and everything else on its front end,
  waited for the host);
- a front end stopped: a shared-memory unregister through the other doesn't wait for it (before: until it ran again);
- a burst of 6,000 requests after a host stall, under ``ulimit -n 1024``: every one answered (before: some were
  lost to a scheduler recursion and hung until the clients' deadline);
- large tensors, then idle: the shared memory they took comes back within seconds (before: held until the next
  message, which never came).
"""

from __future__ import annotations

import asyncio
import http.client
import json
import os
import resource
import signal
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import psutil
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as grpcaio
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from onnx import helper, numpy_helper
from tritonclient.utils import InferenceServerException

from tests import onnx_graphs as g
from tests.server import RunningServer

FRONT_ENDS = ("--frontend-processes", "2")

IDENTITY = """
    name: "identity"
    platform: "onnxruntime_onnx"
    max_batch_size: 0
    input [{ name: "INPUT0", data_type: TYPE_FP32, dims: [ -1 ] }]
    output [{ name: "OUTPUT0", data_type: TYPE_FP32, dims: [ -1 ] }]
"""

# OUTPUT0 is INPUT0 repeated 16 times: a small request makes a large answer, which the host must send.
TILED = """
    name: "tiled"
    platform: "onnxruntime_onnx"
    max_batch_size: 0
    input [{ name: "INPUT0", data_type: TYPE_FP32, dims: [ -1 ] }]
    output [{ name: "OUTPUT0", data_type: TYPE_FP32, dims: [ -1 ] }]
"""


def _models(repo: Path) -> Path:
    g.write(repo, "identity", g.identity("TYPE_FP32", ["n"]), IDENTITY)
    reps = numpy_helper.from_array(np.array([16], np.int64), "reps")
    g.write(repo, "tiled", g.model([helper.make_node("Tile", ["INPUT0", "reps"], ["OUTPUT0"])],
                                   [g.tensor("INPUT0", "TYPE_FP32", ["n"])], [g.tensor("OUTPUT0", "TYPE_FP32", ["m"])],
                                   [reps]), TILED)
    return repo


def _binary(model: str, array: np.ndarray, timeout_us: int = 0) -> tuple[bytes, dict[str, str]]:
    """An infer request with ``array`` as INPUT0 and OUTPUT0 asked for in binary."""
    document: dict[str, Any] = {
        "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": list(array.shape),
                    "parameters": {"binary_data_size": array.nbytes}}],
        "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}]}
    if timeout_us:
        document["parameters"] = {"timeout": timeout_us}
    header = json.dumps(document).encode()
    return header + array.tobytes(), {"Inference-Header-Content-Length": str(len(header))}


def _post(port: int, model: str, array: np.ndarray, timeout_us: int = 0, client_timeout: float = 60
          ) -> tuple[int, bytes, float]:
    """(status, body, seconds taken)."""
    body, headers = _binary(model, array, timeout_us)
    started = time.monotonic()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=client_timeout)
    try:
        conn.request("POST", f"/v2/models/{model}/infer", body, headers)
        response = conn.getresponse()
        return response.status, response.read(), time.monotonic() - started
    finally:
        conn.close()


def _timed(server: RunningServer, path: str) -> tuple[int, float]:
    """A GET on a fresh connection (the kernel picks its front end): (status, seconds taken)."""
    started = time.monotonic()
    status, _, _ = server.request("GET", path)
    return status, time.monotonic() - started


def _front_ends(server: RunningServer) -> list[psutil.Process]:
    return [p for p in psutil.Process(server.proc.pid).children() if "naiad.processes" in " ".join(p.cmdline())]


def _tree(server: RunningServer) -> list[psutil.Process]:
    return [psutil.Process(server.proc.pid), *_front_ends(server)]


def _shmem(server: RunningServer) -> int:
    """Shared memory resident in the host and its front ends (RssShmem: their channels' segments), bytes."""
    total = 0
    for proc in _tree(server):
        with open(f"/proc/{proc.pid}/status") as status:
            for line in status:
                if line.startswith("RssShmem:"):
                    total += int(line.split()[1]) * 1024
    return total


def _fds(server: RunningServer) -> int:
    return sum(p.num_fds() for p in _tree(server))

# INPUT0 [4] reshaped for the model; reloads alternate the reshape, which the graph takes either way.
RESHAPED = """
    name: "reshaped"
    platform: "onnxruntime_onnx"
    max_batch_size: 4
    input [{{ name: "INPUT0", data_type: TYPE_FP32, dims: [ 4 ], reshape {{ shape: [ {shape} ] }} }}]
    output [{{ name: "OUTPUT0", data_type: TYPE_FP32, dims: [ 4 ] }}]
"""


def _flatten() -> onnx.ModelProto:
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


def _cap_files() -> None:
    limit = 48 << 20
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))


def test_large_answers_cross_when_shared_memory_runs_short(tmp_path: Path) -> None:
    server = RunningServer([_models(tmp_path)], *FRONT_ENDS, preexec_fn=_cap_files)
    answers: list[tuple[int, int, float]] = []
    try:
        def one(megabytes: int) -> None:
            array = np.arange((megabytes << 20) // 4, dtype=np.float32)
            status, body, seconds = _post(server.http_port, "tiled", array, client_timeout=60)
            ok = status == 200 and np.array_equal(np.frombuffer(body[-array.nbytes:], np.float32), array)
            answers.append((status if ok else -status, megabytes, seconds))

        # 32 MiB and 64 MiB answers: the host's arena would need segments past the cap (twice the block).
        threads = [threading.Thread(target=one, args=(mb,)) for mb in (2, 2, 2, 4, 4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert sorted(a[:2] for a in answers) == [(200, 2), (200, 2), (200, 2), (200, 4), (200, 4)], answers
        assert _post(server.http_port, "identity", np.ones(4, np.float32))[0] == 200  # and all is well after
        assert "ran short" in server.log()  # (not vacuous: the cap was met)
    finally:
        server.stop()


def test_a_stalled_host_leaves_health_answering_at_once_and_requests_with_a_timeout_answered(tmp_path: Path) -> None:
    server = RunningServer([_models(tmp_path)], *FRONT_ENDS)
    host = server.proc.pid
    small = np.ones(8, np.float32)
    late: list[tuple[int, bytes, float]] = []
    timed_out: list[tuple[int, bytes, float]] = []
    metadata: list[int] = []
    try:
        assert _post(server.http_port, "identity", small)[0] == 200
        assert _timed(server, "/v2/health/ready")[0] == 200
        os.kill(host, signal.SIGSTOP)
        stopped = time.monotonic()
        # During the stall: requests without a timeout wait for the host; those with one are answered when it expires;
        # a call that needs the host (metadata) waits without holding up anything else on its front end.
        waiting = [threading.Thread(target=lambda: late.append(_post(server.http_port, "identity", small)))
                   for _ in range(4)]
        waiting += [threading.Thread(target=lambda: timed_out.append(
            _post(server.http_port, "identity", small, timeout_us=300_000))) for _ in range(6)]
        waiting += [threading.Thread(target=lambda: metadata.append(server.request("GET", "/v2/models/identity")[0]))
                    for _ in range(2)]
        for thread in waiting:
            thread.start()
        time.sleep(1.5)  # past STALL_SECONDS: the front ends have heard no beat for that long
        health = [_timed(server, path) for _ in range(4)
                  for path in ("/v2/health/ready", "/v2/health/live", "/v2/models/identity/ready")]
        time.sleep(max(0.0, 4.0 - (time.monotonic() - stopped)))
        answered_in_stall = list(timed_out)
    finally:
        os.kill(host, signal.SIGCONT)
    try:
        for thread in waiting:
            thread.join(30)
        # Health, at once, every time: not ready (server and model) while the host is stopped, live all along.
        assert [status for status, _ in health] == [400, 200, 400] * 4, health
        assert max(seconds for _, seconds in health) < 0.5, health
        # Each request with a timeout answered as its timeout ran out, in Triton's words, before the host was back.
        assert len(answered_in_stall) == 6, answered_in_stall
        for status, body, seconds in answered_in_stall:
            assert status == 503 and json.loads(body) == {"error": "Request timeout expired"}, (status, body)
            assert seconds < 3.0
        # The others, once it was.
        assert [status for status, _, _ in late] == [200] * 4 and metadata == [200, 200]
        deadline = time.monotonic() + 5
        while _timed(server, "/v2/health/ready")[0] != 200 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _timed(server, "/v2/health/ready")[0] == 200
        assert _post(server.http_port, "identity", small, timeout_us=300_000)[0] == 200
    finally:
        server.stop()


def _owner(server: RunningServer, port: int) -> int:
    """The pid of the front end that holds the connection from local ``port``."""
    for _ in range(100):
        for proc in _front_ends(server):
            if any(c.raddr and c.raddr.port == port for c in proc.net_connections(kind="tcp")):
                return proc.pid
        time.sleep(0.02)
    raise AssertionError(f"no front end holds the connection from port {port}")


def test_a_stopped_front_end_does_not_hold_up_an_unregister_through_another(tmp_path: Path) -> None:
    server = RunningServer([_models(tmp_path)], *FRONT_ENDS)
    key = f"/naiad_chaos_{os.getpid()}"
    region = shm.create_shared_memory_region("chaos", key, 64)
    stopped = None
    try:
        client = httpclient.InferenceServerClient(server.url, concurrency=1)
        client.register_system_shared_memory("chaos", key, 64)
        conn = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=30)
        conn.connect()
        mine = _owner(server, conn.sock.getsockname()[1])
        (stopped,) = [p.pid for p in _front_ends(server) if p.pid != mine]
        os.kill(stopped, signal.SIGSTOP)
        started = time.monotonic()
        conn.request("POST", "/v2/systemsharedmemory/region/chaos/unregister", b"")
        response = conn.getresponse()
        response.read()
        seconds = time.monotonic() - started
        conn.request("GET", "/v2/systemsharedmemory/status")
        regions = json.loads(conn.getresponse().read())
        conn.close()
        # Answered within the host's wait for front ends (2 s), not when the stopped one runs again (10 s here).
        assert response.status == 200 and seconds < 4.0, (response.status, seconds)
        assert regions == []
    finally:
        if stopped is not None:
            time.sleep(max(0.0, 10.0 - (time.monotonic() - started)))
            try:
                os.kill(stopped, signal.SIGCONT)
            except ProcessLookupError:
                pass  # the host killed it meanwhile (silent past processes.STOPPED_SECONDS) and reaped it
        shm.destroy_shared_memory_region(region)
        server.stop()


def _low_nofile() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (1024, 1024))


async def _burst(url: str, channels: int, each: int, stall: Any) -> dict[Any, int]:
    """``channels`` gRPC channels with ``each`` ModelInfer calls in flight on each, 32 KiB each way; what came back."""
    clients = [grpcaio.InferenceServerClient(url) for _ in range(channels)]
    array = np.arange(8192, dtype=np.float32)

    async def one(client: grpcaio.InferenceServerClient) -> Any:
        tensor = grpcclient.InferInput("INPUT0", [8192], "FP32")
        tensor.set_data_from_numpy(array)
        try:
            result = await client.infer("identity", [tensor], client_timeout=30)
        except InferenceServerException as exc:
            return exc.status()
        return 200 if np.array_equal(result.as_numpy("OUTPUT0"), array) else "wrong"

    calls = [asyncio.ensure_future(one(client)) for client in clients for _ in range(each)]
    stall()
    answers: dict[Any, int] = {}
    for answer in await asyncio.gather(*calls):
        answers[answer] = answers.get(answer, 0) + 1
    for client in clients:
        await client.close()
    return answers


def test_a_burst_after_a_host_stall_under_a_low_descriptor_limit_is_answered(tmp_path: Path) -> None:
    server = RunningServer([_models(tmp_path)], *FRONT_ENDS, preexec_fn=_low_nofile)
    host = server.proc.pid
    try:
        assert _post(server.http_port, "identity", np.ones(8192, np.float32))[0] == 200
        time.sleep(2)
        fds = _fds(server)

        def stall() -> None:  # the host stops as the calls go out, and runs again 3 s later
            os.kill(host, signal.SIGSTOP)
            threading.Timer(3.0, os.kill, (host, signal.SIGCONT)).start()

        answers = asyncio.run(_burst(server.grpc_url, 150, 40, stall))
        assert answers == {200: 6000}, answers
        time.sleep(3)
        assert _fds(server) <= fds + 4  # (the burst's segments went at idle)
        assert "Traceback" not in server.log()
    finally:
        os.kill(host, signal.SIGCONT)
        server.stop()


def test_shared_memory_comes_back_at_idle_after_large_tensors(tmp_path: Path) -> None:
    server = RunningServer([_models(tmp_path)], *FRONT_ENDS)
    try:
        assert _post(server.http_port, "tiled", np.ones(1024, np.float32))[0] == 200
        time.sleep(2)
        before = _shmem(server)
        for _ in range(3):  # 8 MiB in, 128 MiB out: both sides' arenas grow to carry them
            assert _post(server.http_port, "tiled", np.ones(2 << 20, np.float32))[0] == 200
        during = _shmem(server)
        deadline = time.monotonic() + 6
        while _shmem(server) > before + (16 << 20) and time.monotonic() < deadline:
            time.sleep(0.25)
        after = _shmem(server)
        assert during > before + (128 << 20)  # (not vacuous: the tensors did take shared memory)
        assert after <= before + (16 << 20), (before >> 20, during >> 20, after >> 20)
    finally:
        server.stop()
