"""kill -9 of a Python model's worker process under load: the other models keep answering every request, the
model's own requests fail cleanly (an error answer, never a hang past the client's timeout), and its worker is
restarted and serves again. Requests queued behind the killed one, that the worker never began, wait for the
restart and are served (issue 19, item 8), for a bounded time."""

from __future__ import annotations

import http.client
import json
import os
import signal
import threading
import time
from pathlib import Path

import psutil

from tests.reliability import procs
from tests.reliability.load import Load, fp32_body, infer_once
from tests.reliability.repo import write_echo_pid, write_gated, write_onnx_add_sub
from tests.server import RunningServer

TIMEOUT = 10.0


def _pid(port: int, model: str) -> tuple[int, dict]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=TIMEOUT)
    try:
        status, doc = infer_once(conn, model, fp32_body([1.0]))
    finally:
        conn.close()
    assert status == 200, doc
    outputs = {o["name"]: o["data"] for o in doc["outputs"]}
    return int(outputs["PID"][0]), outputs


def test_killed_worker_is_restarted_and_others_never_fail(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    write_echo_pid(repo, "victim")
    write_echo_pid(repo, "bystander")
    write_onnx_add_sub(repo, "onnx")
    server = RunningServer([repo])
    try:
        onnx_body = json.dumps({"inputs": [{"name": name, "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}
                                           for name in ("INPUT0", "INPUT1")]}).encode()
        load = Load(server.http_port, ["victim", "bystander", "victim", "bystander"], clients=4, timeout=TIMEOUT)
        onnx_load = Load(server.http_port, ["onnx"], clients=1, timeout=TIMEOUT, body=lambda n: onnx_body)
        old_pid, _ = _pid(server.http_port, "victim")
        bystander_pid, _ = _pid(server.http_port, "bystander")
        load.start()
        onnx_load.start()
        time.sleep(0.7)
        killed_at = time.monotonic()
        os.kill(old_pid, signal.SIGKILL)
        new_pid = old_pid
        deadline = killed_at + 20
        while new_pid == old_pid and time.monotonic() < deadline:
            time.sleep(0.1)
            try:
                new_pid, outputs = _pid(server.http_port, "victim")
            except AssertionError:
                continue  # an error answer while it restarts
        recovered = time.monotonic() - killed_at
        time.sleep(0.7)  # keep the load on the restarted worker for a while
        results = load.stop() + onnx_load.stop()
        assert new_pid != old_pid, f"the victim's worker did not come back within 20 s:\n{server.log()[-3000:]}"
        assert outputs["OUTPUT0"] == [1.0]
        assert not psutil.pid_exists(old_pid) or psutil.Process(old_pid).status() != psutil.STATUS_ZOMBIE
        assert _pid(server.http_port, "bystander")[0] == bystander_pid  # untouched

        by_model: dict[str, list] = {}
        for r in results:
            by_model.setdefault(r.model, []).append(r)
        for model in ("bystander", "onnx"):
            failed = [r for r in by_model[model] if r.status != 200]
            assert by_model[model] and not failed, f"{model}: {len(failed)} failed, e.g. {failed[:3]}"
        victim = by_model["victim"]
        hung = [r for r in results if r.status is None or r.seconds >= TIMEOUT]
        assert not hung, f"requests past the client's timeout: {hung[:3]}"
        errors = [r for r in victim if r.status != 200]
        # Those that failed did so with an answer that says why.
        assert all(r.error for r in errors), errors[:3]
        after = [r for r in victim if r.started > killed_at + recovered]
        assert after and all(r.status == 200 for r in after), [r for r in after if r.status != 200][:3]
        assert not procs.zombies(server.proc.pid)
    finally:
        server.stop()


def _post(port: int, model: str, parameters: dict, into: list, index: int) -> None:
    body = json.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1], "data": [float(index)]}],
                       "parameters": parameters}).encode()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=TIMEOUT)
    started = time.monotonic()
    try:
        status, doc = infer_once(conn, model, body)
    finally:
        conn.close()
    into[index] = (status, doc, time.monotonic() - started)


def _kill_behind_a_queue(server: RunningServer, model: str, hold: Path, queued: int,
                         parameters: dict | None = None) -> tuple[int, list]:
    """One request held inside execute, ``queued`` more sent behind it (into the worker's pipeline), then the
    worker killed: every request's (status, body, seconds)."""
    pid, _ = _pid(server.http_port, model)
    results: list = [None] * (queued + 1)
    threads = [threading.Thread(target=_post, args=(server.http_port, model, {"hold": str(hold)}, results, 0))]
    threads[0].start()
    for _ in range(1000):
        if hold.exists():
            break
        time.sleep(0.01)
    assert hold.exists(), server.log()[-2000:]
    for i in range(1, queued + 1):
        threads.append(threading.Thread(target=_post, args=(server.http_port, model, parameters or {}, results, i)))
        threads[-1].start()
    time.sleep(0.3)  # they reach the worker's queue (its socket): sent, but never begun
    os.kill(pid, signal.SIGKILL)
    for thread in threads:
        thread.join(TIMEOUT + 5)
    return pid, results


def test_requests_queued_behind_a_killed_worker_run_on_its_replacement(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    write_gated(repo, "gated")
    server = RunningServer([repo])
    try:
        old_pid, results = _kill_behind_a_queue(server, "gated", tmp_path / "held", queued=4)
        status, doc, _ = results[0]
        assert status == 500 and "is not healthy (its process was killed by SIGKILL)" in doc["error"], doc
        for index, (status, doc, seconds) in enumerate(results[1:], 1):
            assert status == 200, (index, doc, server.log()[-2000:])
            outputs = {o["name"]: o["data"] for o in doc["outputs"]}
            assert outputs["OUTPUT0"] == [float(index)]  # each its own answer
            assert outputs["PID"][0] != old_pid  # from the replacement
            assert seconds < 5 + 1  # the wait for a restart is bounded (restart-wait-seconds, 5 by default)
        assert not procs.zombies(server.proc.pid)
    finally:
        server.stop()


def test_the_wait_for_a_slow_restart_is_bounded_by_the_request_timeout(tmp_path: Path) -> None:
    """The replacement takes 3 s to initialize; queued requests with a 0.8 s timeout fail UNAVAILABLE in time
    (a 503 that says why), and the model serves again once it is back."""
    repo = tmp_path / "repo"
    version = write_gated(repo, "gated")
    server = RunningServer([repo])
    try:
        (version / "slow_init").touch()  # for the replacement only: this one has initialized
        _, results = _kill_behind_a_queue(server, "gated", tmp_path / "held", queued=2,
                                          parameters={"timeout": 800_000})
        assert results[0][0] == 500
        for status, doc, seconds in results[1:]:
            assert status == 503, doc
            assert "is not healthy and was not restarted within" in doc["error"], doc
            assert seconds < 2.5  # 0.8 s from arrival, not the 3 s restart
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                _pid(server.http_port, "gated")
                break
            except AssertionError:
                time.sleep(0.1)
        else:
            raise AssertionError(f"the model did not come back:\n{server.log()[-3000:]}")
    finally:
        server.stop()
