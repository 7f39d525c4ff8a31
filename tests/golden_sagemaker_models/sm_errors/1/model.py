"""SageMaker golden-capture model for model-side failures.

MODE 0: echo MODE to OUT.
MODE 1: return an InferenceResponse carrying a TritonError.
MODE 2: raise ValueError from execute().
MODE 3: raise MemoryError from execute() (an out-of-memory message for
        Triton's SageMaker server, which answers 507 for those).
MODE 4: return a TritonError whose message says "out of memory".
"""

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            mode_tensor = pb_utils.get_input_tensor_by_name(request, "MODE")
            mode = int(mode_tensor.as_numpy().reshape(-1)[0])
            if mode == 1:
                error = pb_utils.TritonError("sagemaker golden: error response from execute")
                responses.append(pb_utils.InferenceResponse(output_tensors=[], error=error))
            elif mode == 2:
                raise ValueError("sagemaker golden: execute raised on purpose")
            elif mode == 3:
                raise MemoryError("sagemaker golden: execute ran out of memory on purpose")
            elif mode == 4:
                error = pb_utils.TritonError("sagemaker golden: out of memory in execute")
                responses.append(pb_utils.InferenceResponse(output_tensors=[], error=error))
            else:
                out = pb_utils.Tensor("OUT", mode_tensor.as_numpy())
                responses.append(pb_utils.InferenceResponse(output_tensors=[out]))
        return responses
