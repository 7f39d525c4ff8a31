"""The Python-backend equivalent of a pytorch_libtorch model, as a user writes one: ``gpu.py`` copies this file as
``<model>/1/model.py`` beside the same ``model.pt``. It loads the TorchScript on its instance's device, joins the
requests the dynamic batcher hands it into one batch, runs it, and splits the result back; an execute that fails
fails each of its requests with the framework's message."""

import json
import os
import warnings

import numpy as np
import torch

import triton_python_backend_utils as pb_utils

warnings.filterwarnings("ignore", message="The given NumPy array is not writable")


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.input = config["input"][0]["name"]
        self.output = config["output"][0]["name"]
        if args["model_instance_kind"] == "GPU":
            self.device = torch.device("cuda", int(args["model_instance_device_id"]))
        else:
            self.device = torch.device("cpu")
        path = os.path.join(args["model_repository"], args["model_version"], "model.pt")
        self.module = torch.jit.load(path, map_location=self.device).eval()

    def execute(self, requests):
        arrays = [pb_utils.get_input_tensor_by_name(r, self.input).as_numpy() for r in requests]
        batch = np.concatenate(arrays) if len(arrays) > 1 else arrays[0]
        try:
            with torch.inference_mode():
                result = self.module(torch.from_numpy(batch).to(self.device)).cpu().numpy()
        except Exception as exc:  # noqa: BLE001 - the request's answer, as the pytorch backend gives it
            error = pb_utils.TritonError(f"PyTorch execute failure: {exc}")
            return [pb_utils.InferenceResponse(error=error) for _ in requests]
        responses, start = [], 0
        for array in arrays:
            end = start + len(array)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor(self.output, result[start:end])]))
            start = end
        return responses
