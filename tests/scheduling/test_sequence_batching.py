"""The sequence batcher through a live server and tritonclient.http's sequence_id / sequence_start /
sequence_end: per-sequence implicit state (Triton's simple_sequence semantics: a running sum per correlation id),
the control inputs the model sees (START / END / READY / CORRID with their configured types), string ids,
direct padding rows, the backlog, idle release, the oldest strategy, and Triton's errors."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.models import write_model
from tests.server import RunningServer

# OUTPUT = the sequence's running sum (kept in the implicit state ACC); INFO = what the model saw: the batch
# size, and for this request its controls (value and dtype).
ACCUMULATE = """
    import asyncio
    import json
    import numpy as np
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        async def execute(self, requests):
            await asyncio.sleep({pause})
            out = []
            for r in requests:
                x = pb_utils.get_input_tensor_by_name(r, "INPUT").as_numpy()
                acc = pb_utils.get_input_tensor_by_name(r, "ACC_IN").as_numpy()
                total = acc + x
                ready = [pb_utils.get_input_tensor_by_name(q, "READY").as_numpy() for q in requests]
                info = {{"batch": len(requests), "ready": [float(t.reshape(-1)[0]) for t in ready]}}
                for name in ("START", "END", "READY", "CORRID"):
                    t = pb_utils.get_input_tensor_by_name(r, name).as_numpy()
                    v = t.reshape(-1)[0]
                    info[name] = [v.decode() if isinstance(v, bytes) else v.item(), str(t.dtype), list(t.shape)]
                text = np.array([json.dumps(info).encode()], dtype=object).reshape(x.shape)
                out.append(pb_utils.InferenceResponse([
                    pb_utils.Tensor("OUTPUT", total), pb_utils.Tensor("INFO", text),
                    pb_utils.Tensor("ACC_OUT", total)]))
            return out
"""


def _config(name: str, max_batch_size: int, strategy: str = "direct { }", corrid: str = "TYPE_UINT64",
            idle: int = 0, initial: str = "") -> str:
    return f"""
        name: "{name}"
        backend: "python"
        max_batch_size: {max_batch_size}
        input [{{ name: "INPUT", data_type: TYPE_INT32, dims: [ 1 ] }}]
        output [{{ name: "OUTPUT", data_type: TYPE_INT32, dims: [ 1 ] }},
                {{ name: "INFO", data_type: TYPE_STRING, dims: [ 1 ] }}]
        sequence_batching {{
          {strategy}
          max_sequence_idle_microseconds: {idle}
          control_input [
            {{ name: "START", control [ {{ kind: CONTROL_SEQUENCE_START, int32_false_true: [ 0, 1 ] }} ] }},
            {{ name: "END", control [ {{ kind: CONTROL_SEQUENCE_END, bool_false_true: [ false, true ] }} ] }},
            {{ name: "READY", control [ {{ kind: CONTROL_SEQUENCE_READY, fp32_false_true: [ 0, 1 ] }} ] }},
            {{ name: "CORRID", control [ {{ kind: CONTROL_SEQUENCE_CORRID, data_type: {corrid} }} ] }}
          ]
          state [{{ input_name: "ACC_IN", output_name: "ACC_OUT", data_type: TYPE_INT32, dims: [ 1 ] {initial} }}]
        }}
        instance_group [{{ count: 1, kind: KIND_CPU }}]
    """


MODELS = {
    "accumulate": (_config("accumulate", 4), 0.0),
    "strings": (_config("strings", 0, corrid="TYPE_STRING"), 0.0),
    "single": (_config("single", 0), 0.0),
    "idle": (_config("idle", 2, idle=200_000), 0.0),
    "oldest": (_config("oldest", 4, strategy="oldest { max_candidate_sequences: 4 preferred_batch_size: [ 4 ] }"),
               0.05),
    "initial": (_config("initial", 2, initial='initial_state { name: "seed" data_type: TYPE_INT32 dims: [ 1 ] '
                                              'data_file: "seed.bin" }'), 0.0),
}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    repo: Path = tmp_path_factory.mktemp("sequences")
    for name, (cfg, pause) in MODELS.items():
        folder = write_model(repo, name, cfg, ACCUMULATE.format(pause=pause))
    (folder / "initial_state").mkdir()
    (folder / "initial_state" / "seed.bin").write_bytes(np.array([100], np.int32).tobytes())
    running = RunningServer([repo])
    yield running
    running.stop()


def _send(client: httpclient.InferenceServerClient, model: str, value: int, sequence: int | str,
          start: bool = False, end: bool = False, batched: bool = True) -> tuple[int, dict]:
    data = np.array([[value]] if batched else [value], np.int32)
    tensor = httpclient.InferInput("INPUT", list(data.shape), "INT32")
    tensor.set_data_from_numpy(data)
    result = client.infer(model, [tensor], sequence_id=sequence, sequence_start=start, sequence_end=end)
    assert [o["name"] for o in result.get_response()["outputs"]] == ["OUTPUT", "INFO"]  # the state stays inside
    return int(result.as_numpy("OUTPUT").reshape(-1)[0]), json.loads(result.as_numpy("INFO").reshape(-1)[0])



def test_interleaved_sequences_keep_their_own_state(client: httpclient.InferenceServerClient) -> None:
    assert _send(client, "accumulate", 1, 11, start=True)[0] == 1
    assert _send(client, "accumulate", 10, 22, start=True)[0] == 10
    assert _send(client, "accumulate", 2, 11)[0] == 3
    assert _send(client, "accumulate", 20, 22)[0] == 30
    total, info = _send(client, "accumulate", 3, 11, end=True)
    assert total == 6
    assert info["START"] == [0, "int32", [1, 1]]
    assert info["END"] == [True, "bool", [1, 1]]
    assert info["READY"] == [1.0, "float32", [1, 1]]
    assert info["CORRID"] == [11, "uint64", [1, 1]]
    # A new sequence with a used id starts from the initial state again.
    total, info = _send(client, "accumulate", 5, 11, start=True, end=True)
    assert total == 5 and info["START"][0] == 1 and info["END"][0] is True
    assert _send(client, "accumulate", 30, 22, end=True)[0] == 60


def test_sequences_over_grpc(server: RunningServer) -> None:
    import tritonclient.grpc as grpcclient

    def send(c: grpcclient.InferenceServerClient, value: int, sequence: int | str, **flags: bool) -> int:
        tensor = grpcclient.InferInput("INPUT", [1, 1], "INT32")
        tensor.set_data_from_numpy(np.array([[value]], np.int32))
        result = c.infer("accumulate", [tensor], sequence_id=sequence, sequence_start=flags.get("start", False),
                         sequence_end=flags.get("end", False))
        return int(result.as_numpy("OUTPUT")[0, 0])

    with grpcclient.InferenceServerClient(server.grpc_url) as c:
        assert send(c, 2, 31, start=True) == 2
        assert send(c, 5, "g-1", start=True) == 5
        assert send(c, 3, 31, end=True) == 5
        assert send(c, 5, "g-1", end=True) == 10
        with pytest.raises(grpcclient.InferenceServerException) as error:
            send(c, 1, 31)
        assert error.value.status() == "StatusCode.INVALID_ARGUMENT"
        assert "must specify the START flag" in error.value.message()


def test_direct_pads_empty_slots_with_not_ready_rows(server: RunningServer,
                                                     client: httpclient.InferenceServerClient) -> None:
    _send(client, "accumulate", 1, 101, start=True)  # slot 0
    _send(client, "accumulate", 1, 102, start=True)  # slot 1
    total, info = _send(client, "accumulate", 1, 102, end=True)  # only slot 1 has work: slot 0 is padding
    assert total == 2
    assert info["batch"] == 2 and info["ready"] == [0.0, 1.0]
    _send(client, "accumulate", 1, 101, end=True)
    with httpclient.InferenceServerClient(server.url) as c:
        stats = c.get_inference_statistics("accumulate")["model_stats"][0]
    # As in Triton: the padded execution shows as a batch of 2 but infers only the real request.
    assert stats["inference_count"] == stats["inference_stats"]["success"]["count"]
    assert 2 in {b["batch_size"] for b in stats["batch_stats"]}


def test_string_ids_reach_a_string_corrid(client: httpclient.InferenceServerClient) -> None:
    assert _send(client, "strings", 4, "user-a", start=True, batched=False)[0] == 4
    total, info = _send(client, "strings", 4, "user-a", end=True, batched=False)
    assert total == 8
    assert info["CORRID"] == ["user-a", "object", [1]]


def test_a_sequence_without_a_slot_waits_in_the_backlog(server: RunningServer,
                                                        client: httpclient.InferenceServerClient) -> None:
    _send(client, "single", 1, 1, start=True, batched=False)  # takes the only slot
    answered: list[tuple[float, int]] = []

    def other() -> None:
        with httpclient.InferenceServerClient(server.url) as c:
            total = _send(c, "single", 7, 2, start=True, end=True, batched=False)[0]
            answered.append((time.monotonic(), total))

    thread = threading.Thread(target=other)
    thread.start()
    time.sleep(0.3)
    assert not answered  # still waiting for the slot
    ended = time.monotonic()
    assert _send(client, "single", 1, 1, end=True, batched=False)[0] == 2
    thread.join()
    assert answered[0][1] == 7 and answered[0][0] >= ended


def test_an_idle_sequence_loses_its_slot(client: httpclient.InferenceServerClient) -> None:
    _send(client, "idle", 1, 5, start=True)
    time.sleep(0.5)
    with pytest.raises(InferenceServerException) as error:
        _send(client, "idle", 1, 5)
    assert error.value.status() == "400"
    assert "must specify the START flag on the first request of the sequence" in error.value.message()


def test_oldest_strategy_batches_sequences_without_padding(server: RunningServer) -> None:
    totals: dict[int, list[int]] = {}
    infos: list[dict] = []

    def run_sequence(sequence: int) -> None:
        with httpclient.InferenceServerClient(server.url) as c:
            got = []
            for step in range(4):
                total, info = _send(c, "oldest", sequence, sequence, start=step == 0, end=step == 3)
                got.append(total)
                infos.append(info)
            totals[sequence] = got

    threads = [threading.Thread(target=run_sequence, args=(s,)) for s in (1, 2, 3, 4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for sequence, got in totals.items():
        assert got == [sequence, 2 * sequence, 3 * sequence, 4 * sequence]
    assert all(set(info["ready"]) == {1.0} for info in infos)
    assert max(info["batch"] for info in infos) > 1


def test_initial_state_from_a_data_file(client: httpclient.InferenceServerClient) -> None:
    assert _send(client, "initial", 1, 9, start=True)[0] == 101
    assert _send(client, "initial", 1, 9, end=True)[0] == 102


@pytest.mark.parametrize("kwargs, message", [
    ({"sequence": 0}, "inference request to model 'accumulate' must specify a non-zero or non-empty correlation ID"),
    ({"sequence": 77}, "inference request for sequence 77 to model 'accumulate' must specify the START flag on the "
                       "first request of the sequence"),
])
def test_triton_errors(client: httpclient.InferenceServerClient, kwargs: dict, message: str) -> None:
    with pytest.raises(InferenceServerException) as error:
        _send(client, "accumulate", 1, **kwargs)
    assert error.value.status() == "400"
    assert error.value.message() == message


def test_batch_size_above_one_is_refused(client: httpclient.InferenceServerClient) -> None:
    tensor = httpclient.InferInput("INPUT", [2, 1], "INT32")
    tensor.set_data_from_numpy(np.ones((2, 1), np.int32))
    with pytest.raises(InferenceServerException) as error:
        client.infer("accumulate", [tensor], sequence_id=3, sequence_start=True)
    assert error.value.message() == ("inference request to model 'accumulate' must specify batch-size 1 due to "
                                     "requirements of sequence batcher")
