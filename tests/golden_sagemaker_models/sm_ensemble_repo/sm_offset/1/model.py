"""Ensemble step 2 of the SageMaker golden captures: OUTPUT = INPUT + 1."""

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT").as_numpy()
            out = pb_utils.Tensor("OUTPUT", (x + 1).astype(x.dtype))
            responses.append(pb_utils.InferenceResponse(output_tensors=[out]))
        return responses
