"""Triton's pytorch backend: TorchScript ``model.pt`` through torch (an optional dependency)."""
