"""kill -9 of a Python model's worker process under load: the other models keep answering every request, the
model's own requests fail cleanly (an error answer, never a hang past the client's timeout), and its worker is
restarted and serves again."""

from __future__ import annotations

import http.client
import json
import os
import signal
import time
from pathlib import Path

import psutil

from tests.reliability import procs
from tests.reliability.load import Load, fp32_body, infer_once
from tests.reliability.repo import write_echo_pid, write_onnx_add_sub
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
