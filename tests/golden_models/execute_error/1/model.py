"""Golden-capture model for model-side failures.

MODE 0: echo MODE to OUT.
MODE 1: return an InferenceResponse carrying a TritonError.
MODE 2: raise an exception from execute() (fails the whole batch of requests).
"""

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            mode_tensor = pb_utils.get_input_tensor_by_name(request, "MODE")
            mode = int(mode_tensor.as_numpy().reshape(-1)[0])
            if mode == 1:
                responses.append(
                    pb_utils.InferenceResponse(
                        output_tensors=[],
                        error=pb_utils.TritonError("golden: error response from execute"),
                    )
                )
            elif mode == 2:
                raise ValueError("golden: execute raised on purpose")
            else:
                out = pb_utils.Tensor("OUT", mode_tensor.as_numpy())
                responses.append(pb_utils.InferenceResponse(output_tensors=[out]))
        return responses
