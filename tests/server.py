"""Start a real naiad server in a subprocess on free ports, for tests that drive it with real clients."""

from __future__ import annotations

import http.client
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from naiad.core.free_ports import free_port as pick_port

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples" / "model_repository"


def free_port() -> int:
    return pick_port()  # (NAIAD_PORT_RANGE confines it)


class RunningServer:
    def __init__(self, repositories: list[Path], *extra: str, env: dict[str, str] | None = None,
                 wait_ready: bool = True, wait_port: bool = False, preexec_fn: Callable[[], None] | None = None
                 ) -> None:
        for attempt in range(3):
            try:
                self._start(repositories, extra, env, wait_ready, wait_port, preexec_fn)
                return
            except RuntimeError as exc:
                # A free port another process took between free_port() and the server's bind (ports come from
                # the ephemeral range clients use too): pick new ones. A test's own busy port fails at once.
                if attempt == 2 or "already in use" not in str(exc) or any("-port" in arg for arg in extra):
                    raise

    def _start(self, repositories: list[Path], extra: tuple[str, ...], env: dict[str, str] | None, wait_ready: bool,
               wait_port: bool, preexec_fn: Callable[[], None] | None) -> None:
        self.repos = list(repositories)
        self.http_port = free_port()
        self.grpc_port = free_port()
        self.metrics_port = free_port()
        self.sagemaker_port = free_port()  # used when the test passes --allow-sagemaker=true
        self.url = f"127.0.0.1:{self.http_port}"
        self.sagemaker_url = f"http://127.0.0.1:{self.sagemaker_port}"
        self.grpc_url = f"127.0.0.1:{self.grpc_port}"
        args = [sys.executable, "-m", "naiad", "serve", "--http-port", str(self.http_port),
                "--http-address", "127.0.0.1", "--grpc-port", str(self.grpc_port), "--grpc-address", "127.0.0.1",
                "--metrics-port", str(self.metrics_port), "--metrics-address", "127.0.0.1",
                "--sagemaker-port", str(self.sagemaker_port)]
        for repo in repositories:
            args += ["--model-repository", str(repo)]
        if not any(arg.startswith("--exit-on-error") for arg in extra):
            # Many tests serve broken models beside good ones on purpose; Triton's default would exit.
            args.append("--exit-on-error=false")
        args += list(extra)
        # NAIAD_TEST_FRONTEND_PROCESSES=2 runs every live-server test against front-end processes; otherwise one
        # process, whatever the default (auto) makes of the machine's cores.
        processes = os.environ.get("NAIAD_TEST_FRONTEND_PROCESSES") or "1"
        if not any(arg.startswith("--frontend-processes") for arg in extra):
            args += ["--frontend-processes", processes]
        self.log_path = Path(os.environ.get("TMPDIR", "/tmp")) / f"naiad-test-{self.http_port}.log"
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(args, stdout=self._log, stderr=subprocess.STDOUT, cwd=ROOT,
                                     env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})},
                                     preexec_fn=preexec_fn)  # e.g. a lower open-file limit
        try:
            self._wait(wait_ready, wait_port)
        except RuntimeError:
            self.stop(signal.SIGKILL)  # a server that never came up must not outlive the test that started it
            raise

    def _wait(self, ready: bool, any_answer: bool = False, timeout: float = 60.0) -> None:
        """Until health says live (or ready); with ``any_answer``, until the HTTP port answers at all."""
        deadline = time.monotonic() + timeout
        path = "/v2/health/ready" if ready else "/v2/health/live"
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"naiad exited with {self.proc.returncode}:\n{self.log()}")
            try:
                status, _, _ = self.request("GET", path)
                if status == 200 or any_answer:
                    return
            except OSError:
                pass
            time.sleep(0.05)
        raise RuntimeError(f"naiad did not become {'ready' if ready else 'live'}:\n{self.log()}")

    def request(self, method: str, path: str, body: bytes | str | None = None,
                headers: dict[str, str] | None = None, port: int | None = None) -> tuple[int, dict[str, str], bytes]:
        conn = http.client.HTTPConnection("127.0.0.1", port or self.http_port, timeout=60)
        try:
            conn.request(method, path, body=body, headers=headers or {})
            resp = conn.getresponse()
            return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
        finally:
            conn.close()

    def sagemaker(self, method: str, path: str, body: bytes | str | None = None,
                  headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
        """A request on the SageMaker port, as the platform sends it."""
        return self.request(method, path, body, headers, self.sagemaker_port)

    def log(self) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        return self.proc.returncode
