"""Golden-capture identity model: the i-th input of the model config is echoed
unchanged to the i-th output. Inputs that are absent (optional inputs) produce
no output."""

import json

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.pairs = [
            (inp["name"], out["name"])
            for inp, out in zip(config["input"], config["output"])
        ]

    def execute(self, requests):
        responses = []
        for request in requests:
            outputs = []
            for in_name, out_name in self.pairs:
                tensor = pb_utils.get_input_tensor_by_name(request, in_name)
                if tensor is not None:
                    outputs.append(pb_utils.Tensor(out_name, tensor.as_numpy()))
            responses.append(pb_utils.InferenceResponse(output_tensors=outputs))
        return responses
