"""A variant's server: spawned from a command with placeholders, timed until ready, its process tree sampled,
stopped with its group."""

from __future__ import annotations

import shlex
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from naiad.recommend import serving
from naiad.recommend.resources import Sampler
from tests.server import EXAMPLES


def test_a_user_command_with_placeholders_is_served_and_stopped(tmp_path: Path) -> None:
    # the same naiad, but through --server-cmd's placeholders, as real Triton would be
    command = (f"{shlex.quote(sys.executable)} -m naiad serve --model-repository {{repo}} --http-address 127.0.0.1 "
               "--http-port {http_port} --grpc-address 127.0.0.1 --grpc-port {grpc_port} "
               "--metrics-address 127.0.0.1 --metrics-port {metrics_port} --load-model {model} "
               "--model-control-mode explicit")
    server = serving.start(command, EXAMPLES, "add_sub", tmp_path / "logs" / "s.log", ready_timeout=60, cpus={0})
    try:
        assert server.setup_s > 0
        assert server.load_duration_s is not None and 0 < server.load_duration_s < server.setup_s
        tree = [server.pid] + [p.pid for p in psutil.Process(server.pid).children(recursive=True)]
        assert len(tree) >= 2   # the python model runs in a process of its own
        assert all(psutil.Process(pid).cpu_affinity() == [0] for pid in tree)   # pinned, children included
        with Sampler(server.pid, interval_s=0.05) as sampler:
            time.sleep(0.3)
        assert sampler.usage.memory_mb_peak > 10 and sampler.usage.processes >= 2
        assert sampler.usage.samples
    finally:
        server.stop()
    assert server.proc.returncode is not None
    assert not any(psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
                   for pid in tree)


def test_a_server_that_exits_fails_with_its_log(tmp_path: Path) -> None:
    command = f"{shlex.quote(sys.executable)} -c \"print('no such model {{model}}'); raise SystemExit(3)\""
    with pytest.raises(serving.ServerFailed, match=r"exited with code 3[\s\S]*no such model add_sub"):
        serving.start(command, EXAMPLES, "add_sub", tmp_path / "fail.log", ready_timeout=30)


def test_cpu_is_counted_over_the_tree(tmp_path: Path) -> None:
    # a parent that idles and a child that spins: the child's CPU is the server's
    script = ("import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', "
              "'import time\\nend = time.time() + 3\\nwhile time.time() < end: pass']); time.sleep(3)")
    parent = subprocess.Popen([sys.executable, "-c", script])
    try:
        deadline = time.monotonic() + 10
        while not psutil.Process(parent.pid).children() and time.monotonic() < deadline:
            time.sleep(0.02)
        child = psutil.Process(parent.pid).children()[0]
        before, began = sum(child.cpu_times()[:2]), time.monotonic()
        with Sampler(parent.pid, interval_s=0.1) as sampler:
            time.sleep(1.0)
        spun = (sum(child.cpu_times()[:2]) - before) / (time.monotonic() - began)
        usage = sampler.usage
        # the child's own CPU time over the run, however busy the shared machine leaves it
        assert spun > 0.02 and usage.cpu_cores_avg == pytest.approx(spun, rel=0.25)
        assert usage.cpu_cores_peak >= usage.cpu_cores_avg * 0.5
        assert usage.processes == 2
        assert usage.cpu_percent == pytest.approx(100 * usage.cpu_cores_avg / psutil.cpu_count())
    finally:
        parent.kill()
        parent.wait()


def test_naiads_own_server_ignores_a_naiad_package_in_the_current_folder(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    # the folder that holds a clone: `python -m naiad` there imported the clone's folder, not the installed naiad
    (tmp_path / "naiad").mkdir()
    (tmp_path / "naiad" / "__init__.py").write_text("raise ImportError('the decoy naiad')\n")
    monkeypatch.chdir(tmp_path)
    plain = subprocess.run([sys.executable, "-m", "naiad", "--version"], capture_output=True, text=True)
    assert plain.returncode != 0 and "the decoy naiad" in plain.stderr   # the trap is real
    server = serving.start(serving.naiad_command(), EXAMPLES, "add_sub", tmp_path / "s.log", ready_timeout=60)
    try:
        assert "decoy" not in server.log_tail(200)
        # the load generator's workers too
        from naiad.bench.api import Target, measure

        result = measure(Target(f"127.0.0.1:{server.http_port}", "add_sub"), concurrency=1,
                         measurement_interval_ms=100, stability_percentage=1000, processes=1)
        assert result.requests > 0 and result.errors == 0
    finally:
        server.stop()
