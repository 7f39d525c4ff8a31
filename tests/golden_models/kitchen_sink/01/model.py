"""Golden-capture model for the many-config-fields case.

OUTPUT0 = INPUT0 * SCALE + OPTIONAL0 (OPTIONAL0 defaults to 0 when absent).
SCALE is declared dims [1] with reshape [], so the model sees shape [batch].
VERSION = the version number of the model that served the request.
initialize() args are dumped like add_sub's when NAIAD_GOLDEN_ARGS_DIR is set.
"""

import json
import os

import numpy as np
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
        self.version = int(args["model_version"])

    def execute(self, requests):
        responses = []
        for request in requests:
            in0 = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            scale = pb_utils.get_input_tensor_by_name(request, "SCALE").as_numpy()
            opt = pb_utils.get_input_tensor_by_name(request, "OPTIONAL0")
            result = in0 * scale.reshape(-1, 1)
            if opt is not None:
                result = result + opt.as_numpy()
            version = np.full((in0.shape[0], 1), self.version, dtype=np.int32)
            responses.append(
                pb_utils.InferenceResponse(
                    output_tensors=[
                        pb_utils.Tensor("OUTPUT0", result.astype(np.float32)),
                        pb_utils.Tensor("VERSION", version),
                    ]
                )
            )
        return responses
