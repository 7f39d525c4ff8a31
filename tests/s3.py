"""An S3-compatible store on loopback for tests: moto's server mode in a subprocess.

naiad talks to it exactly as it talks to AWS (boto3 with ``AWS_ENDPOINT_URL``); nothing is mocked in-process.
"""

from __future__ import annotations

import http.client
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REGION = "us-east-1"


def _free_port() -> int:
    from naiad.core.free_ports import free_port as pick  # NAIAD_PORT_RANGE confines it

    return pick()


class S3Server:
    """``python -m moto.server`` on 127.0.0.1 and a free port, answering when the constructor returns."""

    def __init__(self, timeout: float = 30.0) -> None:
        self.log_path = Path(tempfile.gettempdir()) / f"naiad-moto-{os.getpid()}.log"
        self.process: subprocess.Popen[bytes] | None = None
        self._client: Any = None
        for _ in range(3):  # the free port may be taken between finding it and binding it
            self.port = _free_port()
            if self._start(timeout):
                return
        raise RuntimeError(f"moto server did not start: {self._log_tail()}")

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _start(self, timeout: float) -> bool:
        env = {**os.environ, **self.env()}
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                return False
            if self._answers():
                return True
            time.sleep(0.05)
        self.stop()
        return False

    def _answers(self) -> bool:
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=1)
        try:
            connection.request("GET", "/moto-api/data.json")
            return connection.getresponse().status == 200
        except OSError:
            return False
        finally:
            connection.close()

    def _log_tail(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-2000:]
        except OSError:
            return "(no log)"

    def env(self) -> dict[str, str]:
        """What boto3 needs to use this server, and nothing from the user's own AWS setup."""
        missing = str(self.log_path.with_suffix(".no-aws-config"))
        return {
            "AWS_ENDPOINT_URL": self.endpoint_url,
            "AWS_ENDPOINT_URL_S3": self.endpoint_url,  # a user's S3-specific endpoint would win over the one above
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": REGION,
            "AWS_CONFIG_FILE": missing,
            "AWS_SHARED_CREDENTIALS_FILE": missing,
            "AWS_EC2_METADATA_DISABLED": "true",
        }

    def client(self) -> Any:
        """A boto3 S3 client of this server (one, made on first use; boto3 clients are thread-safe), for tests
        to create buckets and objects; its endpoint and keys are explicit, whatever a test set in the environment."""
        if self._client is None:
            import boto3

            self._client = boto3.session.Session().client(
                "s3", endpoint_url=self.endpoint_url, region_name=REGION,
                aws_access_key_id="testing", aws_secret_access_key="testing")
        return self._client

    def reset(self) -> None:
        """Forget every bucket and object."""
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        try:
            connection.request("POST", "/moto-api/reset")
            connection.getresponse().read()
        finally:
            connection.close()

    def stop(self) -> None:
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        process.terminate()
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        self.log_path.unlink(missing_ok=True)
