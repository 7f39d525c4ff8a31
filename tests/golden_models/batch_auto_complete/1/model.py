"""Golden-capture model without config.pbtxt: the whole config comes from
auto_complete_config (batching enabled, max_batch_size 4, dynamic batching)."""

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    @staticmethod
    def auto_complete_config(auto_complete_model_config):
        for name in ("INPUT0", "INPUT1"):
            auto_complete_model_config.add_input(
                {"name": name, "data_type": "TYPE_FP32", "dims": [4]}
            )
        for name in ("OUTPUT0", "OUTPUT1"):
            auto_complete_model_config.add_output(
                {"name": name, "data_type": "TYPE_FP32", "dims": [4]}
            )
        auto_complete_model_config.set_max_batch_size(4)
        auto_complete_model_config.set_dynamic_batching()
        return auto_complete_model_config

    def execute(self, requests):
        responses = []
        for request in requests:
            in0 = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            in1 = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
            out0 = pb_utils.Tensor("OUTPUT0", in0 + in1)
            out1 = pb_utils.Tensor("OUTPUT1", in0 - in1)
            responses.append(pb_utils.InferenceResponse(output_tensors=[out0, out1]))
        return responses
