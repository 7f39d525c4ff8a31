"""MLServer equivalent of the Triton python-backend add_sub model (OUTPUT0 = a + b, OUTPUT1 = a - b).

Used only by benchmarks/http_add_sub.py so MLServer answers the same V2 request with the same work.
"""
import numpy as np
from mlserver import MLModel
from mlserver.codecs import NumpyCodec
from mlserver.types import InferenceRequest, InferenceResponse


class AddSubModel(MLModel):
    async def load(self) -> bool:
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        by_name = {inp.name: NumpyCodec.decode_input(inp) for inp in payload.inputs}
        in0 = by_name["INPUT0"].astype(np.float32)
        in1 = by_name["INPUT1"].astype(np.float32)
        return InferenceResponse(
            model_name=self.name,
            outputs=[
                NumpyCodec.encode_output("OUTPUT0", in0 + in1),
                NumpyCodec.encode_output("OUTPUT1", in0 - in1),
            ],
        )
