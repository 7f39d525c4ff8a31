"""``--model-load-gpu-limit <device>:<fraction>`` with Triton's meaning, on a live server in explicit mode driven
by tritonclient: a load onto a GPU whose used memory is above the fraction is refused in Triton's words, before it
loads and after (what the load itself took counts); under the limit it loads; a refused load gives its device
memory back."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from naiad.repository.devices import parse_gpu_limits
from tests import simulated_gpus
from tests.models import write_model
from tests.server import ROOT, RunningServer

TOTAL = 1000 * 1024 * 1024


def test_load_is_refused_over_the_limit_and_accepted_under_it(tmp_path: Path) -> None:
    devices = tmp_path / "gpus.json"
    simulated_gpus.write(devices, [{"uuid": "GPU-0", "memory_total": TOTAL, "memory_used": 600 << 20},
                                   {"uuid": "GPU-1", "memory_total": TOTAL, "memory_used": 900 << 20}])
    repo = tmp_path / "models"
    write_model(repo, "small", simulated_gpus.gpu_config("small", 100 << 20), simulated_gpus.GPU_MODEL_PY)
    write_model(repo, "large", simulated_gpus.gpu_config("large", 500 << 20), simulated_gpus.GPU_MODEL_PY)
    # GPU 1 has no limit: a load there is not refused, however full it is.
    write_model(repo, "other", simulated_gpus.gpu_config("other", 50 << 20, gpu=1), simulated_gpus.GPU_MODEL_PY)
    server = RunningServer([repo], "--model-control-mode=explicit", "--model-load-gpu-limit=0:0.5",
                           env={simulated_gpus.ENV: str(devices)})
    client = httpclient.InferenceServerClient(server.url)
    try:
        with pytest.raises(InferenceServerException) as refused:
            client.load_model("small")
        assert ("can not create model 'small_0_0': memory limit set for GPU 0 has exceeded, model loading is "
                "rejected.") in refused.value.message()
        assert not client.is_model_ready("small")
        assert simulated_gpus.used(devices) == 600 << 20  # refused before it took anything

        simulated_gpus.update(devices, 0, memory_used=100 << 20)  # now under 50 %
        client.load_model("small")
        assert client.is_model_ready("small")
        assert simulated_gpus.used(devices) == 200 << 20
        inputs = [httpclient.InferInput("INPUT0", [2], "FP32")]
        inputs[0].set_data_from_numpy(np.array([1.5, 2.5], dtype=np.float32))
        assert client.infer("small", inputs).as_numpy("OUTPUT0").tolist() == [1.5, 2.5]

        # 200 MiB in use loads it, but it leaves 700 MiB in use, over the limit: refused as Triton refuses it,
        # and its worker is gone, so the device has its memory back.
        with pytest.raises(InferenceServerException) as over:
            client.load_model("large")
        assert "can not create model 'large_0_0': memory limit set for GPU 0 has exceeded" in over.value.message()
        assert not client.is_model_ready("large")
        assert simulated_gpus.used(devices) == 200 << 20

        client.load_model("other")
        assert client.is_model_ready("other")
        client.unload_model("small")
        assert _settles(devices, 100 << 20)
    finally:
        server.stop()


def _settles(devices: Path, expected: int) -> bool:
    """An unload returns before the worker has exited; its memory goes with it."""
    import time

    deadline = time.monotonic() + 10
    while simulated_gpus.used(devices) != expected:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_the_flag_is_parsed_as_triton_parses_it() -> None:
    assert parse_gpu_limits(["0:0.8", "1:1", "0:0.5"]) == {0: 0.5, 1: 1.0}
    for value, message in (("0.8", "requires format <first>:<second>. Found: 0.8"),
                           ("0:1.5", "expects limit fraction to be in range [0.0, 1.0], got 1.500000"),
                           ("-1:0.5", "expects device ID >= 0, got -1")):
        with pytest.raises(ValueError, match=message.replace("[", r"\[").replace(".", r"\.")):
            parse_gpu_limits([value])
    done = subprocess.run([sys.executable, "-m", "naiad", "serve", "--model-repository", str(ROOT),
                           "--model-load-gpu-limit=0:2"], capture_output=True, text=True, cwd=ROOT, timeout=60,
                          check=False)
    assert done.returncode == 1
    assert "error: expects limit fraction to be in range [0.0, 1.0], got 2.000000" in done.stderr
