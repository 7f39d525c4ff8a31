"""The two models of ``gpu.py``, written in plain torch.nn with random weights (no downloads, no torchvision), and
their in-process limit.

- ``Encoder``: a BERT-base-sized encoder (token + position embeddings, 12 post-norm layers of hidden 768, 12 heads,
  GELU feed-forward of 3072, a tanh pooler over the first token). Input: INT64 token ids ``[seq]``; output: the pooled
  ``[hidden]`` vector, so a reply is 1.5 KB in fp16 rather than the whole ``[seq, hidden]`` state.
- ``ResNet50``: ResNet-50 v1.5 (stride on the 3x3 convolution of a bottleneck), the same 25,557,032 parameters as
  torchvision's ``resnet50``. Input: ``[3, H, W]`` images; output: ``[1000]`` logits.

Both are traced to TorchScript on the device they run on (fp16 on a GPU), so the served model and the in-process
limit run the very same file.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn


@dataclass(frozen=True)
class Spec:
    """What a served model looks like from outside: its one input and one output, Triton datatypes."""

    name: str
    input_name: str
    input_dtype: str      # TYPE_INT64, TYPE_FP16, TYPE_FP32
    input_dims: tuple[int, ...]
    output_name: str
    output_dtype: str
    output_dims: tuple[int, ...]
    vocab: int = 0        # the encoder's vocabulary: token ids at or above it are out of range

    def sample(self, batch: int, rng: np.random.Generator) -> np.ndarray:
        if self.input_dtype == "TYPE_INT64":
            return rng.integers(0, self.vocab, size=(batch, *self.input_dims), dtype=np.int64)
        dtype = np.float16 if self.input_dtype == "TYPE_FP16" else np.float32
        return rng.standard_normal((batch, *self.input_dims)).astype(dtype)


class Encoder(nn.Module):
    def __init__(self, vocab: int = 30522, hidden: int = 768, layers: int = 12, heads: int = 12, seq: int = 128) -> None:
        super().__init__()
        self.tokens = nn.Embedding(vocab, hidden)
        self.positions = nn.Parameter(torch.randn(seq, hidden) * 0.02)
        self.norm = nn.LayerNorm(hidden)
        layer = nn.TransformerEncoderLayer(hidden, heads, 4 * hidden, dropout=0.0, activation="gelu",
                                           batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.pooler = nn.Linear(hidden, hidden)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = self.norm(self.tokens(input_ids) + self.positions)
        x = self.encoder(x)
        return torch.tanh(self.pooler(x[:, 0]))


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, inplanes: int, planes: int, stride: int) -> None:
        super().__init__()
        width = planes
        out = planes * self.expansion
        self.conv1 = nn.Conv2d(inplanes, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, out, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(out)
        self.relu = nn.ReLU(inplace=True)
        self.downsample: nn.Module = nn.Identity()
        if stride != 1 or inplanes != out:
            self.downsample = nn.Sequential(nn.Conv2d(inplanes, out, 1, stride=stride, bias=False),
                                            nn.BatchNorm2d(out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.relu(self.bn1(self.conv1(x)))
        y = self.relu(self.bn2(self.conv2(y)))
        y = self.bn3(self.conv3(y))
        return self.relu(y + self.downsample(x))


class ResNet50(nn.Module):
    def __init__(self, width: int = 64, classes: int = 1000, blocks: tuple[int, ...] = (3, 4, 6, 3)) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, width, 7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)
        stages: list[nn.Module] = []
        inplanes = width
        for index, count in enumerate(blocks):
            planes = width * 2 ** index
            stage = []
            for block in range(count):
                stage.append(Bottleneck(inplanes, planes, 2 if block == 0 and index > 0 else 1))
                inplanes = planes * Bottleneck.expansion
            stages.append(nn.Sequential(*stage))
        self.layers = nn.Sequential(*stages)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(inplanes, classes)
        # Random weights, but sane activations: BatchNorm in eval mode uses these running statistics.
        for module in self.modules():
            if isinstance(module, nn.Conv2d):
                nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous(memory_format=torch.channels_last)  # cuDNN's fast layout for fp16 convolutions
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layers(x)
        return self.fc(torch.flatten(self.pool(x), 1))


def specs(small: bool, fp16: bool) -> dict[str, Spec]:
    """Model name -> its outside shape; ``small``: the tiny sizes of a CPU smoke run."""
    seq, hidden, vocab = (16, 64, 1000) if small else (128, 768, 30522)
    image = 32 if small else 224
    real = "TYPE_FP16" if fp16 else "TYPE_FP32"
    return {
        "bert": Spec("bert", "INPUT__0", "TYPE_INT64", (seq,), "OUTPUT__0", real, (hidden,), vocab=vocab),
        "resnet50": Spec("resnet50", "INPUT__0", real, (3, image, image), "OUTPUT__0", real, (1000,)),
    }


def build(name: str, small: bool) -> nn.Module:
    if name == "bert":
        return Encoder(vocab=1000, hidden=64, layers=2, heads=4, seq=16) if small else Encoder()
    if name == "resnet50":
        return ResNet50(width=8) if small else ResNet50()
    raise ValueError(f"unknown model {name!r}")


def save_torchscript(name: str, spec: Spec, small: bool, device: torch.device, half: bool, path: Path) -> None:
    """Build ``name`` with random weights on ``device`` (in fp16 if ``half``), trace it, save it to ``path``."""
    torch.manual_seed(0)
    module = build(name, small).eval().to(device)
    if half:
        module = module.half()
    if name == "resnet50":
        module = module.to(memory_format=torch.channels_last)  # type: ignore[call-overload]  # (not in the stubs)
    example = torch.from_numpy(spec.sample(2, np.random.default_rng(0))).to(device)
    with torch.no_grad():
        traced = torch.jit.trace(module, example, check_trace=False)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.jit.save(traced, str(path))


def in_process_limit(path: Path, spec: Spec, device: torch.device, batch_sizes: list[int],
                     seconds: float) -> dict[int, float]:
    """Items/s of the saved TorchScript run in this process, one batch at a time, NumPy in and NumPy out: what a
    server adds nothing to. Loaded as naiad's pytorch backend loads it, run under inference_mode as it runs it."""
    module = torch.jit.load(str(path), map_location=device).eval()
    rng = np.random.default_rng(1)
    limits: dict[int, float] = {}
    for batch in batch_sizes:
        x = spec.sample(batch, rng)
        runs, start, elapsed = 0, 0.0, 0.0
        with torch.inference_mode():
            # the first 5 runs are warm-up: the profiling executor specializes on the first runs of each shape
            while runs < 8 or elapsed < seconds:
                module(torch.from_numpy(x).to(device)).cpu().numpy()
                runs += 1
                if runs == 5:
                    start = time.perf_counter()
                elif runs > 5:
                    elapsed = time.perf_counter() - start
        limits[batch] = batch * (runs - 5) / elapsed
    del module
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return limits
