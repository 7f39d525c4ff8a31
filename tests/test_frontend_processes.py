"""``naiad serve --frontend-processes 2``: a model host and two front-end processes on the same ports, driven by real
clients. Which front end a connection landed on is read from the operating system (psutil), so each test can
check that what one front end did is seen through the other."""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import threading
import time
from collections import Counter

import numpy as np
import psutil
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm

from naiad.service.remote import host_lost_line
from tests.http2_frames import PREFACE, frame
from tests.server import EXAMPLES, RunningServer

ADD_SUB = "/v2/models/add_sub/infer"


def _frontends(server: RunningServer) -> list[psutil.Process]:
    return [p for p in psutil.Process(server.proc.pid).children() if "naiad.processes" in p.cmdline()]


def _owner(server: RunningServer, client_port: int) -> int:
    """The pid of the front end that accepted the connection from ``client_port``."""
    for _ in range(50):
        for child in _frontends(server):
            for c in child.net_connections(kind="tcp"):
                if c.raddr and c.raddr.port == client_port:
                    return child.pid
        time.sleep(0.02)
    raise AssertionError(f"no front end holds the connection from port {client_port}")


def _connection_on_each(server: RunningServer) -> dict[int, http.client.HTTPConnection]:
    """One open HTTP connection per front end (connections land where the kernel hashes them)."""
    by_pid: dict[int, http.client.HTTPConnection] = {}
    for _ in range(64):
        conn = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=10)
        conn.connect()
        pid = _owner(server, conn.sock.getsockname()[1])
        if pid in by_pid:
            conn.close()
        else:
            by_pid[pid] = conn
        if len(by_pid) == 2:
            return by_pid
    raise AssertionError("64 connections all landed on one front end")


def _request(conn: http.client.HTTPConnection, method: str, path: str, body: object = None) -> tuple[int, dict]:
    conn.request(method, path, None if body is None else json.dumps(body))
    response = conn.getresponse()
    data = response.read()
    return response.status, (json.loads(data) if data else {})


def _add_sub(a: list[float], b: list[float]) -> dict:
    return {"inputs": [{"name": "INPUT0", "shape": [4], "datatype": "FP32", "data": a},
                       {"name": "INPUT1", "shape": [4], "datatype": "FP32", "data": b}]}


@pytest.fixture(scope="module")
def server():
    s = RunningServer([EXAMPLES], "--frontend-processes", "2")
    yield s
    s.stop()


def test_two_frontends_serve_http_and_grpc(server: RunningServer) -> None:
    assert len(_frontends(server)) == 2
    a = np.arange(4, dtype=np.float32)
    for module, url in ((httpclient, server.url), (grpcclient, server.grpc_url)):
        clients = [module.InferenceServerClient(url) for _ in range(8)]
        for client in clients:
            inputs = [module.InferInput("INPUT0", [4], "FP32"), module.InferInput("INPUT1", [4], "FP32")]
            inputs[0].set_data_from_numpy(a)
            inputs[1].set_data_from_numpy(np.ones(4, np.float32))
            result = client.infer("add_sub", inputs)
            assert result.as_numpy("OUTPUT0").tolist() == (a + 1).tolist()
            assert result.as_numpy("OUTPUT1").tolist() == (a - 1).tolist()
            assert client.is_server_ready() and client.is_model_ready("add_sub")
    # Each front end served HTTP: the same request answered the same way through either.
    for conn in _connection_on_each(server).values():
        status, body = _request(conn, "POST", ADD_SUB, _add_sub([1, 2, 3, 4], [1, 1, 1, 1]))
        assert status == 200, body
        assert body["outputs"][0]["data"] == [2, 3, 4, 5]
        status, body = _request(conn, "GET", "/v2/models/add_sub")
        assert status == 200 and body["inputs"][0]["name"] == "INPUT0"
        conn.close()


def test_connections_opened_at_once_spread_over_the_front_ends(server: RunningServer) -> None:
    """A client pool opening 16 connections at once: both front ends take their share from the port's one accept
    queue (libuv alone would take every queued connection in whichever woke first: 16 / 0 seen; with
    naiad/frontends/acceptor.py 7 / 9 or 8 / 8)."""
    for port in (server.http_port, server.grpc_port):
        conns = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(16)]
        try:
            owners = Counter(_owner(server, conn.getsockname()[1]) for conn in conns)
        finally:
            for conn in conns:
                conn.close()
        assert len(owners) == 2 and min(owners.values()) >= 4, owners
        time.sleep(0.2)  # (their closes counted before the next port's)


def test_statistics_are_the_same_totals_through_either(server: RunningServer) -> None:
    conns = list(_connection_on_each(server).values())
    before = [_request(c, "GET", "/v2/models/add_sub/stats")[1]["model_stats"][0]["inference_stats"]["success"]
              for c in conns]
    assert before[0] == before[1]
    for n, conn in zip((3, 5), conns):
        for _ in range(n):
            assert _request(conn, "POST", ADD_SUB, _add_sub([1, 2, 3, 4], [0, 0, 0, 0]))[0] == 200
    for conn in conns:
        stats = _request(conn, "GET", "/v2/models/add_sub/stats")[1]["model_stats"][0]["inference_stats"]
        assert stats["success"]["count"] == before[0]["count"] + 8
        conn.close()


def test_shared_memory_region_registered_through_one_used_through_the_other(server: RunningServer) -> None:
    first, second = _connection_on_each(server).values()
    key = f"/naiad-test-procs-{os.getpid()}"
    handle = shm.create_shared_memory_region("procs_in", key, 32)
    try:
        shm.set_shared_memory_region(handle, [np.array([1, 2, 3, 4], np.float32), np.array([4, 3, 2, 1], np.float32)])
        status, body = _request(first, "POST", "/v2/systemsharedmemory/region/procs_in/register",
                                {"key": key, "offset": 0, "byte_size": 32})
        assert status == 200, body
        status, body = _request(second, "GET", "/v2/systemsharedmemory/region/procs_in/status")
        assert status == 200 and body[0]["key"] == key
        request = {"inputs": [
            {"name": "INPUT0", "shape": [4], "datatype": "FP32",
             "parameters": {"shared_memory_region": "procs_in", "shared_memory_offset": 0, "shared_memory_byte_size": 16}},
            {"name": "INPUT1", "shape": [4], "datatype": "FP32",
             "parameters": {"shared_memory_region": "procs_in", "shared_memory_offset": 16, "shared_memory_byte_size": 16}}]}
        status, body = _request(second, "POST", ADD_SUB, request)
        assert status == 200, body
        assert body["outputs"][0]["data"] == [5, 5, 5, 5]
        # Unregistered through the second, it is gone for the first as well.
        assert _request(second, "POST", "/v2/systemsharedmemory/region/procs_in/unregister")[0] == 200
        status, body = _request(first, "POST", ADD_SUB, request)
        assert status == 404 and "Unable to find shared memory region: 'procs_in'" in body["error"], body
    finally:
        shm.destroy_shared_memory_region(handle)
        first.close()
        second.close()


def test_model_control_through_one_seen_from_the_other() -> None:
    s = RunningServer([EXAMPLES], "--frontend-processes", "2", "--model-control-mode", "explicit",
                      "--load-model", "add_sub", wait_ready=False)
    try:
        s._wait(True)
        first, second = _connection_on_each(s).values()
        assert _request(second, "GET", "/v2/models/add_sub/ready")[0] == 200
        assert _request(second, "POST", ADD_SUB, _add_sub([1, 1, 1, 1], [1, 1, 1, 1]))[0] == 200
        assert _request(first, "POST", "/v2/repository/models/add_sub/unload")[0] == 200
        assert _request(second, "GET", "/v2/models/add_sub/ready")[0] == 400
        status, body = _request(second, "POST", ADD_SUB, _add_sub([1, 1, 1, 1], [1, 1, 1, 1]))
        assert status != 200, body
        index = _request(second, "POST", "/v2/repository/index")[1]
        assert next(r for r in index if r["name"] == "add_sub")["state"] in ("UNLOADING", "UNAVAILABLE")
        assert _request(second, "POST", "/v2/repository/models/add_sub/load")[0] == 200
        assert _request(first, "GET", "/v2/models/add_sub/ready")[0] == 200
        status, body = _request(first, "POST", ADD_SUB, _add_sub([1, 1, 1, 1], [1, 1, 1, 1]))
        assert status == 200 and body["outputs"][0]["data"] == [2, 2, 2, 2]
    finally:
        s.stop()


def test_a_frontend_killed_under_load_is_restarted_and_the_server_keeps_serving() -> None:
    s = RunningServer([EXAMPLES], "--frontend-processes", "2")
    try:
        stop = threading.Event()
        counts = {"ok": 0, "failed": 0}

        def load() -> None:
            while not stop.is_set():
                try:
                    conn = http.client.HTTPConnection("127.0.0.1", s.http_port, timeout=5)
                    for _ in range(5):
                        ok = _request(conn, "POST", ADD_SUB, _add_sub([1, 2, 3, 4], [1, 1, 1, 1]))[0] == 200
                        counts["ok" if ok else "failed"] += 1
                    conn.close()
                except (OSError, http.client.HTTPException):
                    counts["failed"] += 1  # a connection the killed front end held

        threads = [threading.Thread(target=load) for _ in range(4)]
        for t in threads:
            t.start()
        time.sleep(0.5)
        victim, survivor = _frontends(s)
        os.kill(victim.pid, signal.SIGKILL)
        time.sleep(0.3)
        served = counts["ok"]
        time.sleep(0.5)
        assert counts["ok"] > served  # the other front end went on serving meanwhile
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            pids = {p.pid for p in _frontends(s)}
            if len(pids) == 2 and victim.pid not in pids:
                break
            time.sleep(0.1)
        else:
            raise AssertionError(f"the killed front end was not started again: {pids}")
        assert survivor.pid in pids
        stop.set()
        for t in threads:
            t.join()
        assert s.proc.poll() is None
        # Both, the new one too, serve every connection.
        for conn in _connection_on_each(s).values():
            assert _request(conn, "POST", ADD_SUB, _add_sub([1, 2, 3, 4], [1, 1, 1, 1]))[0] == 200
            conn.close()
        assert counts["failed"] <= 4 * 5, counts  # only what the killed one held
        assert "front-end process" in s.log() and "starting it again" in s.log()
    finally:
        s.stop()


def test_sigterm_drains_every_process_and_a_dead_host_takes_the_frontends_with_it() -> None:
    s = RunningServer([EXAMPLES], "--frontend-processes", "2")
    children = _frontends(s)
    s.proc.send_signal(signal.SIGTERM)
    assert s.proc.wait(30) == 0
    gone, alive = psutil.wait_procs(children, timeout=10)
    assert not alive
    s.stop()

    s = RunningServer([EXAMPLES], "--frontend-processes", "2")
    children = _frontends(s)
    os.kill(s.proc.pid, signal.SIGKILL)
    gone, alive = psutil.wait_procs(children, timeout=10)
    assert not alive  # (their exit codes are the host's to read, and it is gone)
    s.proc.wait(10)
    assert s.log().count("the model host") == 1, s.log()
    # The last line says what happened, not as a front end's own crash.
    assert s.log().strip().splitlines()[-1] == host_lost_line(s.proc.pid, alive=False), s.log()
    s.stop()


# --- connection caps: counted across the front ends, as one process counts them -------------------------------

CAPS = ("--http-max-connections=5", "--http-max-connections-per-address=3", "--grpc-engine=lean",
        "--grpc-max-connections=5", "--grpc-max-connections-per-address=3")


def _open_http(server: RunningServer, port: int, source: str) -> tuple[object, int, bytes | None]:
    """A connection from ``source`` that asked once: (it, the pid of the front end that took it, the refusal's
    body or None: held)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10, source_address=(source, 0))
    conn.connect()
    pid = _owner(server, conn.sock.getsockname()[1])  # (before a refusal's close)
    conn.request("GET", "/v2/health/live")
    response = conn.getresponse()
    body = response.read()
    return conn, pid, None if response.status == 200 else body


def _open_grpc(server: RunningServer, port: int, source: str) -> tuple[object, int, bytes | None]:
    """The same over HTTP/2: one ServerLive call, read up to its trailers (or the close)."""
    from hpack import Encoder

    sock = socket.socket()
    sock.bind((source, 0))
    sock.settimeout(10)
    sock.connect(("127.0.0.1", port))
    pid = _owner(server, sock.getsockname()[1])
    block = Encoder().encode([(":method", "POST"), (":scheme", "http"), (":authority", "x"),
                              (":path", "/inference.GRPCInferenceService/ServerLive"),
                              ("content-type", "application/grpc"), ("te", "trailers")])
    sock.sendall(PREFACE + frame(4, 0, 0, b"") + frame(1, 0x4, 1, block) + frame(0, 0x1, 1, b"\0\0\0\0\0"))
    data = b""
    while True:
        at, ended = 0, False
        while len(data) >= at + 9:  # whole frames: a HEADERS one (1) on stream 1 with END_STREAM ends the call
            size = int.from_bytes(data[at:at + 3], "big")
            kind, flags, stream = data[at + 3], data[at + 4], int.from_bytes(data[at + 5:at + 9], "big")
            at += 9 + size
            ended = ended or (at <= len(data) and kind == 1 and flags & 0x1 and stream == 1)
        if ended:
            break
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    return sock, pid, data if b"too many open connections" in data else None


def _hold(server: RunningServer, opener, port: int, source: str, n: int) -> list[tuple[object, int]]:
    """``n`` connections from ``source``, held, on both front ends (the kernel picks one for each: where all land
    on one, the last is opened again). Each with the pid of the front end that holds it."""
    held: list[tuple[object, int]] = []
    for _ in range(100):
        if len(held) == n:
            if len({pid for _, pid in held}) == 2:
                return held
            held.pop()[0].close()
        conn, pid, refused = opener(server, port, source)
        if refused is None:
            held.append((conn, pid))
        else:  # (a place just closed here is freed once its front end reads the close)
            conn.close()
            time.sleep(0.1)
    raise AssertionError(f"{n} connections from {source} were not held across both front ends")


def _refusals(server: RunningServer, opener, port: int, source: str) -> set[bytes]:
    """Connections from ``source`` until each front end has refused one; what the refusals said.

    The front ends share one accept queue per port, where the one behind its share takes each new connection first
    (acceptor.py), so the same one would refuse every time: the one that refused is stopped while the next
    connection is made."""
    said, by = set(), set()
    for _ in range(60):
        stopped = next(iter(by)) if by else None
        if stopped is not None:
            os.kill(stopped, signal.SIGSTOP)
        try:
            conn, pid, refused = opener(server, port, source)
        finally:
            if stopped is not None:
                os.kill(stopped, signal.SIGCONT)
        conn.close()
        assert refused is not None, f"a connection from {source} was served past the cap"
        said.add(refused)
        by.add(pid)
        if len(by) == 2:
            return said
    raise AssertionError("every refusal came from one front end")


def _reason(said: set[bytes], flag: bytes) -> bool:
    return all(flag + b")" in message and b"too many open connections" in message for message in said)


def test_connection_caps_hold_for_all_front_ends_together() -> None:
    s = RunningServer([EXAMPLES], "--frontend-processes", "2", *CAPS)
    try:
        for opener, port, flag in ((_open_http, s.http_port, b"--http-max-connections"),
                                   (_open_grpc, s.grpc_port, b"--grpc-max-connections")):
            first = _hold(s, opener, port, "127.0.0.2", 3)  # the address's 3, on both front ends
            assert _reason(_refusals(s, opener, port, "127.0.0.2"), flag + b"-per-address")
            second = _hold(s, opener, port, "127.0.0.3", 2)  # the port's 5
            assert _reason(_refusals(s, opener, port, "127.0.0.4"), flag)
            second.pop()[0].close()  # a place frees up, whichever front end held it
            for _ in range(50):
                conn, _, refused = opener(s, port, "127.0.0.4")
                if refused is None:
                    break
                conn.close()
                time.sleep(0.1)
            else:
                raise AssertionError("no place freed up")
            for held, _ in first + second + [(conn, 0)]:
                held.close()  # type: ignore[attr-defined]
    finally:
        s.stop()


def test_a_frontend_killed_leaves_no_counts_behind() -> None:
    s = RunningServer([EXAMPLES], "--frontend-processes", "2", *CAPS)
    try:
        kinds = ((_open_http, s.http_port), (_open_grpc, s.grpc_port))
        held = {port: (_hold(s, opener, port, "127.0.0.2", 3), _hold(s, opener, port, "127.0.0.3", 2))
                for opener, port in kinds}  # each port at its cap, on both front ends
        victim = held[s.http_port][0][0][1]
        os.kill(victim, signal.SIGKILL)
        deadline = time.monotonic() + 20
        while True:  # (until the host has read its exit, the victim is a zombie)
            try:
                pids = {p.pid for p in _frontends(s)}
            except psutil.ZombieProcess:
                pids = set()
            if len(pids) == 2 and victim not in pids:
                break
            assert time.monotonic() < deadline, "the killed front end was not started again"
            time.sleep(0.1)
        for opener, port in kinds:
            first, second = held[port]
            lost = [sum(pid == victim for _, pid in group) for group in (first, second)]
            assert lost[0] >= 1
            # What the killed one held is free again, and no more: the address's and the port's.
            fresh = [opener(s, port, "127.0.0.2") for _ in range(lost[0])]
            assert all(refused is None for _, _, refused in fresh), "a dead front end's count was kept"
            conn, _, refused = opener(s, port, "127.0.0.2")
            assert refused is not None and b"too many open connections" in refused
            conn.close()  # type: ignore[attr-defined]
            fresh += [opener(s, port, "127.0.0.4") for _ in range(lost[1])]
            assert all(refused is None for _, _, refused in fresh)
            conn, _, refused = opener(s, port, "127.0.0.4")
            assert refused is not None and b"connections)" in refused  # the port's cap: 5 again
            conn.close()  # type: ignore[attr-defined]
            for conn, _ in first + second:
                conn.close()  # type: ignore[attr-defined]
            for conn, _, _ in fresh:
                conn.close()  # type: ignore[attr-defined]
        assert s.proc.poll() is None
    finally:
        s.stop()
