"""Golden-capture model: OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 - INPUT1.

If the environment variable NAIAD_GOLDEN_ARGS_DIR is set, initialize() dumps
the `args` dict it receives into that directory, one file per instance, so
the capture script can record exactly what the server passes to models.
"""

import json
import os

import triton_python_backend_utils as pb_utils


def dump_initialize_args(args):
    out_dir = os.environ.get("NAIAD_GOLDEN_ARGS_DIR")
    if not out_dir:
        return
    file_name = "{}__{}__v{}.json".format(
        args.get("model_name", "unknown"),
        args.get("model_instance_name", "unknown"),
        args.get("model_version", "unknown"),
    )
    with open(os.path.join(out_dir, file_name), "w") as handle:
        handle.write(json.dumps(args))


class TritonPythonModel:
    def initialize(self, args):
        dump_initialize_args(args)

    def execute(self, requests):
        responses = []
        for request in requests:
            in0 = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            in1 = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
            out0 = pb_utils.Tensor("OUTPUT0", (in0 + in1).astype(in0.dtype))
            out1 = pb_utils.Tensor("OUTPUT1", (in0 - in1).astype(in0.dtype))
            responses.append(pb_utils.InferenceResponse(output_tensors=[out0, out1]))
        return responses
