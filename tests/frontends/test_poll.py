"""Polling after an answer (naiad/frontends/poll.py): bounded, stopped by work in flight, adapting to the client."""

from __future__ import annotations

import asyncio
import http.client
import json
import os
import time
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from naiad.frontends import poll
from naiad.frontends.poll import IdlePoll
from tests.server import EXAMPLES, RunningServer

BODY = json.dumps({"inputs": [
    {"name": "INPUT0", "shape": [4], "datatype": "FP32", "data": [1.0, 2.0, 3.0, 4.0]},
    {"name": "INPUT1", "shape": [4], "datatype": "FP32", "data": [10.0, 20.0, 30.0, 40.0]}]})


def _cpu_ns(pid: int) -> int:
    """CPU time of every thread of ``pid`` and of its children (the Python workers), in ns."""
    total = 0
    pids = [pid]
    for task in Path(f"/proc/{pid}/task").iterdir():
        children = task / "children"
        if children.exists():
            pids += [int(p) for p in children.read_text().split()]
    for one in pids:
        for task in Path(f"/proc/{one}/task").iterdir():
            total += int((task / "schedstat").read_text().split()[0])
    return total


def test_polls_only_while_idle_and_for_its_window() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        idle = IdlePoll(max_us=4000)  # a 1 ms window to start with
        in_flight = [1]
        idle.watch(lambda: in_flight[0])
        idle.answered(loop)
        assert not idle.polling  # a request is still in flight: its worker may need the core
        in_flight[0] = 0
        idle.answered(loop)
        assert idle.polling
        turns = 0
        started = time.perf_counter()
        while idle.polling and time.perf_counter() - started < 1:
            turns += 1
            await asyncio.sleep(0)
        assert 0.0009 < time.perf_counter() - started < 0.5
        assert turns > 10  # the loop kept turning rather than sleeping
        idle.answered(loop)
        await asyncio.sleep(0)
        in_flight[0] = 1  # a request came in: polling ends at the next turn
        for _ in range(3):
            await asyncio.sleep(0)
        assert not idle.polling

    asyncio.run(main())


def test_window_adapts_to_the_client(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [1_000_000_000]
    monkeypatch.setattr(poll, "_now", lambda: clock[0])
    idle = IdlePoll(max_us=200)
    idle.watch(lambda: 0)
    assert idle.window_ns == 50_000

    def pause(ns: int) -> None:
        idle.idle_since = clock[0]  # as answered() notes it
        clock[0] += ns
        idle.arrived()

    pause(30_000)  # caught by the window: unchanged
    assert idle.window_ns == 50_000
    pause(80_000)  # a longer window would have caught it
    assert idle.window_ns == 100_000
    pause(150_000)
    assert idle.window_ns == 200_000
    pause(190_000)
    assert idle.window_ns == 200_000  # at most the maximum
    pause(5_000_000)  # a client that pauses longer than any window: polling is wasted, so less of it
    assert idle.window_ns == 100_000
    pause(5_000_000)
    assert idle.window_ns == 50_000
    pause(5_000_000)
    assert idle.window_ns == 0  # off until requests come quickly again
    pause(5_000_000)
    assert idle.window_ns == 0
    pause(60_000)
    assert idle.window_ns == 50_000
    idle.arrived()  # bytes of a request already counted: nothing to learn
    assert idle.window_ns == 50_000


def test_off() -> None:
    idle = IdlePoll(max_us=0)
    idle.watch(lambda: 0)
    idle.answered(asyncio.new_event_loop())
    assert not idle.polling


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="reads the server's CPU time from /proc")
def test_a_served_client_costs_no_polling_once_it_stops() -> None:
    """Answers over HTTP and gRPC are right with polling on, and the server sleeps once its client stops: the
    polling after the last answer is bounded by the window (a loop that kept polling would burn a core)."""
    server = RunningServer([EXAMPLES], "--idle-poll-us", "200")
    try:
        a = np.array([1, 2, 3, 4], dtype=np.float32)
        b = np.array([10, 20, 30, 40], dtype=np.float32)
        connection = http.client.HTTPConnection(server.url)
        for _ in range(50):
            connection.request("POST", "/v2/models/add_sub/infer", BODY, {"Content-Type": "application/json"})
            answer = json.loads(connection.getresponse().read())
            assert answer["outputs"][0]["data"] == [11.0, 22.0, 33.0, 44.0]
        with grpcclient.InferenceServerClient(server.grpc_url) as client:
            inputs = [grpcclient.InferInput("INPUT0", [4], "FP32"), grpcclient.InferInput("INPUT1", [4], "FP32")]
            inputs[0].set_data_from_numpy(a)
            inputs[1].set_data_from_numpy(b)
            for _ in range(50):
                result = client.infer("add_sub", inputs)
                np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
        connection.close()
        time.sleep(0.2)
        before = _cpu_ns(server.proc.pid)
        time.sleep(1.0)
        spent = _cpu_ns(server.proc.pid) - before
        assert spent < 100_000_000, f"the idle server used {spent / 1e6:.0f} ms of CPU in 1 s"
    finally:
        server.stop()


def test_no_polling_while_the_cgroup_runs_out_of_its_cpu_quota(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                                                ) -> None:
    """Under a CPU quota polling is paid from it: after a period the cgroup was throttled in, answers don't poll
    for HOLD_NS; cpu.stat is read at most once per CHECK_NS."""
    clock = [1_000_000_000]
    monkeypatch.setattr(poll, "_now", lambda: clock[0])
    stat = tmp_path / "cpu.stat"
    stat.write_text("nr_periods 10\nnr_throttled 3\nthrottled_usec 100\n")
    loop = asyncio.new_event_loop()
    try:
        idle = IdlePoll()
        idle.configure(200, quota=tmp_path)
        idle.watch(lambda: 0)

        def polls() -> bool:
            idle.polling = False  # (no loop runs here: each answer starts polling anew, or doesn't)
            idle.answered(loop)
            clock[0] += 1_000_000
            return idle.polling

        assert polls()  # throttled before, not since
        stat.write_text("nr_periods 11\nnr_throttled 4\nthrottled_usec 200\n")
        assert polls()  # not read again within the period
        clock[0] += poll.CHECK_NS
        assert not polls()  # read: throttled since
        clock[0] += poll.HOLD_NS // 2
        assert not polls()  # still within the hold
        clock[0] += poll.HOLD_NS
        assert polls()  # a second with no throttling: polling again
        stat.unlink()
        clock[0] += poll.CHECK_NS
        assert polls() and idle.quota is None  # the cgroup is gone: nothing more is read
    finally:
        loop.close()


def test_no_quota_no_cpu_stat(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(poll.cores, "quota_cgroup", lambda: None)
    idle = IdlePoll()
    idle.configure(200)
    assert idle.quota is None
    idle.configure(0, quota=tmp_path)  # polling off: no cgroup is watched
    assert idle.quota is None


def _quota_cgroup(share: float) -> Path | None:
    """A cgroup of this test's own holding what runs in it to ``share`` of a CPU (v1's cpu controller or v2's),
    or None where this process can't make one (not root, no writable cgroup file system)."""
    name = f"naiad-test-poll-{os.getpid()}"
    for root, v2 in ((Path("/sys/fs/cgroup/cpu"), False), (Path("/sys/fs/cgroup"), True)):
        try:
            if v2 and "cpu" not in (root / "cgroup.subtree_control").read_text().split():
                continue
            group = root / name
            group.mkdir()
        except OSError:
            continue
        try:
            if v2:
                (group / "cpu.max").write_text(f"{int(share * 100_000)} 100000")
            else:
                (group / "cpu.cfs_period_us").write_text("100000")
                (group / "cpu.cfs_quota_us").write_text(str(int(share * 100_000)))
            return group
        except OSError:
            group.rmdir()
    return None


def test_a_server_short_of_its_cpu_quota_pauses_polling(tmp_path: Path) -> None:
    """A server started in a cgroup with a small CPU quota, kept busy by one connection, runs out of its quota;
    its front end then says it paused idle polling, and every answer stays right."""
    group = _quota_cgroup(0.25)
    if group is None:
        pytest.skip("needs a cgroup of its own with a CPU quota (root, a writable cgroup file system)")
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "add_sub").symlink_to(EXAMPLES / "add_sub")

    def enter() -> None:  # (in the server's process, before it starts: its workers follow it)
        (group / "cgroup.procs").write_text(str(os.getpid()))

    server = None
    try:
        server = RunningServer([repo], "--idle-poll-us", "200", "--log-verbose", "1", preexec_fn=enter)
        connection = http.client.HTTPConnection(server.url)
        deadline = time.monotonic() + 30
        while "idle polling paused" not in server.log() and time.monotonic() < deadline:
            for _ in range(100):
                connection.request("POST", "/v2/models/add_sub/infer", BODY, {"Content-Type": "application/json"})
                answer = json.loads(connection.getresponse().read())
                assert answer["outputs"][0]["data"] == [11.0, 22.0, 33.0, 44.0]
        connection.close()
        assert f"idle polling paused: cgroup {group} ran out of its CPU quota" in server.log()
    finally:
        if server is not None:
            server.stop()
        time.sleep(0.2)
        try:
            group.rmdir()
        except OSError:
            pass
