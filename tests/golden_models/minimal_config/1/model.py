"""Golden-capture model for version policies: OUTPUT0 = INPUT0 + version."""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.version = int(args["model_version"])

    def execute(self, requests):
        responses = []
        for request in requests:
            in0 = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            out0 = pb_utils.Tensor("OUTPUT0", (in0 + self.version).astype(np.float32))
            responses.append(pb_utils.InferenceResponse(output_tensors=[out0]))
        return responses
