"""What a model's own code sees in its worker, as in Triton's stub (L0_backend_python): BLS only from execute()
(bls_init_error: a request made in initialize() fails the load with Triton's words, one made in finalize() is
refused too, the same call from execute() works), arguments checked as Triton's binding checks them
(argument_validation), and no command-line arguments (custom_metrics and others run
``unittest.main("model", exit=False)`` inside execute); and Python-based backends (python_based_backends: a
model whose backend is NAME runs ``--backend-directory``/NAME/model.py). Driven by tritonclient against a
running server. Also request_rescheduling's wrong_return_type: a request released with RESCHEDULE for which
execute still returns a response is answered with Triton's error, not run again."""

from __future__ import annotations

import textwrap
import time
from pathlib import Path

import numpy as np
import tritonclient.http as httpclient

from tests.models import IDENTITY_FP32, IDENTITY_PY, write_model
from tests.server import RunningServer

BLS_IN_INITIALIZE = """
    import numpy as np
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def initialize(self, args):
            request = pb_utils.InferenceRequest(model_name="identity", requested_output_names=["OUTPUT0"],
                                                inputs=[pb_utils.Tensor("INPUT0", np.ones(2, np.float32))])
            request.exec(decoupled={decoupled})

        def execute(self, requests):
            return [pb_utils.InferenceResponse([]) for _ in requests]
"""

# Forwards to "identity" from execute; on finalize, writes what a BLS call there raised to a file.
BLS_IN_EXECUTE = """
    import numpy as np
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def _request(self, data):
            return pb_utils.InferenceRequest(model_name="identity", requested_output_names=["OUTPUT0"],
                                             inputs=[pb_utils.Tensor("INPUT0", data)])

        def execute(self, requests):
            out = []
            for r in requests:
                answer = self._request(pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()).exec()
                out.append(pb_utils.InferenceResponse([pb_utils.get_output_tensor_by_name(answer, "OUTPUT0")]))
            return out

        def finalize(self):
            try:
                self._request(np.ones(1, np.float32)).exec()
                said = "no error"
            except pb_utils.TritonModelException as exc:
                said = str(exc)
            with open({path!r}, "w") as f:
                f.write(said)
"""


def test_bls_outside_execute_is_refused(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    write_model(repo, "identity", IDENTITY_FP32.format(name="identity"), IDENTITY_PY)
    for name, decoupled in (("bls_init", False), ("bls_init_decoupled", True)):
        write_model(repo, name, IDENTITY_FP32.format(name=name), BLS_IN_INITIALIZE.format(decoupled=decoupled))
    said = tmp_path / "finalize.txt"
    write_model(repo, "forward", IDENTITY_FP32.format(name="forward"), BLS_IN_EXECUTE.format(path=str(said)))
    server = RunningServer([repo], "--exit-on-error=false", "--strict-readiness=false",
                           "--model-control-mode=explicit", "--load-model=*")
    try:
        with httpclient.InferenceServerClient(server.url) as client:
            for name in ("bls_init", "bls_init_decoupled"):
                assert not client.is_model_ready(name)
                index = {m["name"]: m for m in client.get_model_repository_index()}
                assert "BLS is only supported during the 'execute' function." in index[name]["reason"]
            data = np.arange(3, dtype=np.float32)
            inp = httpclient.InferInput("INPUT0", [3], "FP32")
            inp.set_data_from_numpy(data)
            np.testing.assert_array_equal(client.infer("forward", [inp]).as_numpy("OUTPUT0"), data)
            client.unload_model("forward")
        deadline = time.monotonic() + 30
        while not said.exists() and time.monotonic() < deadline:  # the unload's finalize runs after its answer
            time.sleep(0.05)
        time.sleep(0.1)
        assert said.read_text() == "BLS is only supported during the 'execute' function."
    finally:
        server.stop()


# Runs its own unittest suite inside execute, as Triton's QA models do, and answers whether it passed.
SELF_TEST = """
    import sys
    import unittest

    import numpy as np
    import triton_python_backend_utils as pb_utils

    class Checks(unittest.TestCase):
        def test_arithmetic(self):
            self.assertEqual(1 + 1, 2)

        def test_arguments_checked_as_tritons_binding(self):  # argument_validation's cases
            ok = [pb_utils.Tensor("IN", np.ones(2, np.int32))]
            for kwargs in ({"inputs": None}, {"model_name": None}, {"requested_output_names": None},
                           {"requested_output_names": [None]}, {"correlation_id": None}, {"request_id": None},
                           {"model_version": None}, {"flags": None}):
                args = {"inputs": ok, "model_name": "m", "requested_output_names": ["OUT"], **kwargs}
                with self.assertRaises(TypeError):
                    pb_utils.InferenceRequest(**args)
            with self.assertRaises(pb_utils.TritonModelException):
                pb_utils.InferenceRequest(inputs=[None], model_name="m", requested_output_names=["OUT"])
            self.assertEqual(pb_utils.InferenceRequest(inputs=ok, model_name="m", requested_output_names=[],
                                                       correlation_id="s-5").correlation_id(), "s-5")
            with self.assertRaises(TypeError):
                pb_utils.InferenceResponse(output_tensors=None)
            with self.assertRaises(pb_utils.TritonModelException):
                pb_utils.InferenceResponse(output_tensors=[None])
            pb_utils.InferenceResponse(output_tensors=[])
            for name, array in ((None, np.ones(1)), ("OUT", None)):
                with self.assertRaises(TypeError):
                    pb_utils.Tensor(name, array)
            with self.assertRaises(pb_utils.TritonModelException):
                pb_utils.Tensor.from_dlpack("OUT", None)
            for call in (lambda: pb_utils.Logger.log("m", None), lambda: pb_utils.Logger.log("m", 1),
                         lambda: pb_utils.Logger.log_info(None), lambda: pb_utils.Logger.log_error(None)):
                with self.assertRaises(TypeError):
                    call()
            pb_utils.Logger.log("fine", pb_utils.Logger.WARNING)

    class TritonPythonModel:
        def execute(self, requests):
            result = unittest.main("model", exit=False, verbosity=0).result
            ok = result.wasSuccessful() and result.testsRun == 2 and sys.argv[1:] == []
            return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", np.array([float(ok)], np.float32))])
                    for _ in requests]
"""


def test_unittest_main_inside_execute_finds_the_models_tests(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    write_model(repo, "self_test", IDENTITY_FP32.format(name="self_test"), SELF_TEST)
    server = RunningServer([repo])
    try:
        with httpclient.InferenceServerClient(server.url) as client:
            inp = httpclient.InferInput("INPUT0", [1], "FP32")
            inp.set_data_from_numpy(np.zeros(1, np.float32))
            assert client.infer("self_test", [inp]).as_numpy("OUTPUT0").tolist() == [1.0]
    finally:
        server.stop()


# A Python-based backend: its config comes from auto_complete_config, its operation from the model's folder.
ADD_SUB_BACKEND = """
    import json
    import os

    import numpy as np
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        @staticmethod
        def auto_complete_config(config):
            for name in ("INPUT0", "INPUT1"):
                config.add_input({"name": name, "data_type": "TYPE_FP32", "dims": [4]})
            config.add_output({"name": "OUTPUT", "data_type": "TYPE_FP32", "dims": [4]})
            config.set_max_batch_size(0)
            return config

        def initialize(self, args):
            folder = pb_utils.get_model_dir()  # the model's version folder, not the backend's
            assert folder == os.path.join(args["model_repository"], args["model_version"]), folder
            with open(os.path.join(folder, "model.json")) as f:
                self.sign = 1.0 if json.load(f)["operation"] == "add" else -1.0

        def execute(self, requests):
            out = []
            for r in requests:
                a, b = (pb_utils.get_input_tensor_by_name(r, n).as_numpy() for n in ("INPUT0", "INPUT1"))
                out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT", a + self.sign * b)]))
            return out
"""


def test_python_based_backend_serves_the_models_that_name_it(tmp_path: Path) -> None:
    backends = tmp_path / "backends"
    (backends / "add_sub").mkdir(parents=True)
    (backends / "add_sub" / "model.py").write_text(textwrap.dedent(ADD_SUB_BACKEND))
    repo = tmp_path / "repo"
    for name, operation in (("add", "add"), ("sub", "sub")):
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "1" / "model.json").write_text(f'{{ "operation": "{operation}" }}')
        (repo / name / "config.pbtxt").write_text('backend: "add_sub"\n')
    (repo / "other" / "1").mkdir(parents=True)
    (repo / "other" / "config.pbtxt").write_text('backend: "no_such_backend"\n')
    server = RunningServer([repo], f"--backend-directory={backends}", "--exit-on-error=false",
                           "--strict-readiness=false")
    try:
        with httpclient.InferenceServerClient(server.url) as client:
            a, b = np.arange(4, dtype=np.float32), np.full(4, 10, np.float32)
            inputs = [httpclient.InferInput("INPUT0", [4], "FP32"), httpclient.InferInput("INPUT1", [4], "FP32")]
            inputs[0].set_data_from_numpy(a)
            inputs[1].set_data_from_numpy(b)
            np.testing.assert_array_equal(client.infer("add", inputs).as_numpy("OUTPUT"), a + b)
            np.testing.assert_array_equal(client.infer("sub", inputs).as_numpy("OUTPUT"), a - b)
            config = client.get_model_config("add")
            assert (config["backend"], config["runtime"]) == ("add_sub", "model.py")
            assert [i["name"] for i in config["input"]] == ["INPUT0", "INPUT1"]
            assert not client.is_model_ready("other")
            index = {m["name"]: m for m in client.get_model_repository_index()}
            assert "unable to find backend library for backend 'no_such_backend'" in index["other"]["reason"]
    finally:
        server.stop()


WRONG_RETURN_CONFIG = """
    name: "wrong_return"
    backend: "python"
    max_batch_size: 0
    input [{ name: "INPUT0", data_type: TYPE_FP32, dims: [ -1 ] }]
    output [{ name: "OUTPUT0", data_type: TYPE_FP32, dims: [ -1 ] }]
    sequence_batching { iterative_sequence: true }
"""

WRONG_RETURN = """
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def execute(self, requests):
            out = []
            for r in requests:
                r.set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)
                out.append(pb_utils.InferenceResponse([pb_utils.get_input_tensor_by_name(r, "INPUT0")]))
            return out  # should hold None for a rescheduled request
"""


def test_rescheduled_request_with_a_response_is_an_error_not_a_loop(tmp_path: Path) -> None:
    from tritonclient.utils import InferenceServerException

    repo = tmp_path / "repo"
    write_model(repo, "wrong_return", WRONG_RETURN_CONFIG, WRONG_RETURN)
    server = RunningServer([repo])
    try:
        with httpclient.InferenceServerClient(server.url, network_timeout=30) as client:
            inp = httpclient.InferInput("INPUT0", [2], "FP32")
            inp.set_data_from_numpy(np.ones(2, np.float32))
            started = time.monotonic()
            try:
                client.infer("wrong_return", [inp])
                raise AssertionError("the request was answered without an error")
            except InferenceServerException as exc:
                assert "Expected a None object in the execute function return list for reschduled request" in \
                    exc.message()
            assert time.monotonic() - started < 20
            stats = client.get_inference_statistics("wrong_return")["model_stats"][0]
            assert stats["execution_count"] == 1  # executed once, not rescheduled
    finally:
        server.stop()
