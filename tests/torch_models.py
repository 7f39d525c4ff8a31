"""Small TorchScript models for tests (scripting needs their source in a file, hence this module)."""

from __future__ import annotations

from pathlib import Path

import torch


class AddSub(torch.nn.Module):
    """Inputs by forward argument name; two outputs."""

    def forward(self, INPUT0: torch.Tensor, INPUT1: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return INPUT0 + INPUT1, INPUT0 - INPUT1


class Ordered(torch.nn.Module):
    """``x - y``: shows which config input reached which argument."""

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return x - y


class DictInput(torch.nn.Module):
    def forward(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        return inputs["A"] * 10 + inputs["B"]


class Upper(torch.nn.Module):
    """List[str] in, List[str] out: Triton's string support for TorchScript."""

    def forward(self, words: list[str]) -> list[str]:
        return [w.upper() for w in words]


class Halve(torch.nn.Module):
    """Returns float64 whatever it gets: a model whose output type differs from the config."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.to(torch.float64) / 2


class Casts(torch.nn.Module):
    """One input and output per datatype torch shares with Triton, each passed through."""

    def forward(self, b: torch.Tensor, u8: torch.Tensor, i8: torch.Tensor, i16: torch.Tensor, i32: torch.Tensor,
                i64: torch.Tensor, f16: torch.Tensor, f32: torch.Tensor, f64: torch.Tensor):
        return ~b, u8 + 1, i8 + 1, i16 + 1, i32 + 1, i64 + 1, f16 * 2, f32 * 2, f64 * 2


class Fragile(torch.nn.Module):
    """``INPUT0 * 2``, until a request sets FLAG: from then on every call raises what torch raises after a
    device-side assert (the state lives in the loaded module, so only a fresh process heals it)."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("broken", torch.zeros(1, dtype=torch.bool))

    def forward(self, INPUT0: torch.Tensor, FLAG: torch.Tensor) -> torch.Tensor:
        if bool(FLAG.any()):
            self.broken.fill_(True)
        if bool(self.broken.any()):
            raise RuntimeError("CUDA error: device-side assert triggered")
        return INPUT0 * 2


def save(module: torch.nn.Module, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.jit.save(torch.jit.script(module), str(path))
