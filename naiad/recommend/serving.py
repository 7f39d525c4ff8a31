"""One server per variant: a fresh ``naiad serve`` subprocess on free ports, or a user's command (real Triton),
waited on until the model is ready, and stopped with its whole process group afterwards."""

from __future__ import annotations

import http.client
import os
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from naiad.core.free_ports import free_port

# Placeholders a --server-cmd may use.
PLACEHOLDERS = ("repo", "model", "http_port", "grpc_port", "metrics_port")


class ServerFailed(RuntimeError):
    """The server exited or never became ready; the message ends with the tail of its log."""


def python_command() -> str:
    """This interpreter, made to import naiad as this process did whatever the current folder holds: ``python
    -m naiad`` would put the current folder first on sys.path, and a clone's ``naiad/`` folder there (run from
    the folder that holds the clone) would shadow the installed package. -P (3.11+) leaves it out; before 3.11 the
    module is run by a -c line that drops that first entry."""
    python = shlex.quote(sys.executable)
    if sys.version_info >= (3, 11):
        return f"{python} -P -m naiad"
    return f"{python} -c 'import runpy, sys; sys.path.pop(0); runpy.run_module(\"naiad\", run_name=\"__main__\")'"


def naiad_root() -> str:
    """The folder the imported naiad package sits in."""
    import naiad

    return os.path.dirname(os.path.dirname(os.path.abspath(naiad.__file__)))


def naiad_env() -> dict[str, str]:
    """The environment for naiad's own server: the imported naiad first on PYTHONPATH (an editable install, a
    PYTHONPATH checkout and a wheel all resolve to it)."""
    path = os.environ.get("PYTHONPATH", "")
    return {**os.environ, "PYTHONPATH": naiad_root() + (os.pathsep + path if path else "")}


def naiad_command() -> str:
    """naiad itself, listening on loopback only."""
    return (f"{python_command()} serve --model-repository {{repo}} "
            "--http-address 127.0.0.1 --http-port {http_port} --grpc-address 127.0.0.1 --grpc-port {grpc_port} "
            "--metrics-address 127.0.0.1 --metrics-port {metrics_port}")


@dataclass
class Server:
    proc: subprocess.Popen[bytes]
    http_port: int
    grpc_port: int
    metrics_port: int
    log_path: Path
    setup_s: float = 0.0                  # spawn to model ready
    load_duration_s: float | None = None  # the server's own nv_model_load_duration_secs, when it has one

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM to the group the server leads (its model processes included), SIGKILL after ``timeout``."""
        if self.proc.poll() is None:
            _signal_group(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                pass
        _signal_group(self.proc.pid, signal.SIGKILL)  # stragglers of the group, if any
        if self.proc.poll() is None:
            self.proc.wait()


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _get(port: int, path: str, timeout: float = 5.0) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def start(command: str, repo: Path, model: str, log_path: Path, ready_timeout: float = 180.0,
          cpus: set[int] | None = None, env: dict[str, str] | None = None) -> Server:
    """Spawn ``command`` (placeholders filled), wait until ``model`` is ready over HTTP, and time it. ``cpus``
    pins the server (and the processes it starts, which inherit it) to those cores, as ``taskset -c`` would.
    ``env``: the server's environment (None: this one; naiad's own command gets ``naiad_env()``)."""
    if env is None and command == naiad_command():
        env = naiad_env()
    ports = {"http_port": free_port(), "grpc_port": free_port(), "metrics_port": free_port()}
    values = {"repo": shlex.quote(str(repo)), "model": shlex.quote(model), **{k: str(v) for k, v in ports.items()}}
    for name in PLACEHOLDERS:   # only these: other braces in a command (JSON, shell) stay as written
        command = command.replace("{" + name + "}", values[name])
    argv = shlex.split(command)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "wb") as log:
        began = time.monotonic()
        # A session of its own: stopping the group reaches the model processes the server spawned.
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, env=env,
                                preexec_fn=(lambda: os.sched_setaffinity(0, cpus)) if cpus else None)
    server = Server(proc, ports["http_port"], ports["grpc_port"], ports["metrics_port"], log_path)
    try:
        _wait_ready(server, model, began, began + ready_timeout)
    except BaseException:
        server.stop(timeout=10)
        raise
    server.setup_s = time.monotonic() - began
    # The metrics endpoint may open a moment after the model is ready; a server without the metric says so at once.
    for _ in range(20):
        server.load_duration_s, answered = load_duration(server.metrics_port, model)
        if answered:
            break
        time.sleep(0.1)
    return server


def _wait_ready(server: Server, model: str, began: float, deadline: float) -> None:
    while time.monotonic() < deadline:
        if server.proc.poll() is not None:
            tail = server.log_tail()
            last = next((line for line in reversed(tail.splitlines()) if line.strip()), "")
            raise ServerFailed(f"the server exited with code {server.proc.returncode} before '{model}' was "
                               f"ready: {last.strip()}\n{tail}")
        try:
            status, _ = _get(server.http_port, f"/v2/models/{model}/ready", timeout=2)
            if status == 200:
                return
        except OSError:
            pass
        time.sleep(0.05)
    raise ServerFailed(f"'{model}' was not ready in {deadline - began:.0f} s:\n{server.log_tail()}")


def load_duration(metrics_port: int, model: str) -> tuple[float | None, bool]:
    """``nv_model_load_duration_secs`` for ``model`` (its latest version listed), when the server exports it, and
    whether the metrics endpoint answered."""
    try:
        status, body = _get(metrics_port, "/metrics")
    except OSError:
        return None, False
    if status != 200:
        return None, False
    found: float | None = None
    for family in text_string_to_metric_families(body.decode(errors="replace")):
        if family.name != "nv_model_load_duration_secs":
            continue
        for sample in family.samples:
            if sample.labels.get("model") == model:
                found = float(sample.value)
    return found, True
