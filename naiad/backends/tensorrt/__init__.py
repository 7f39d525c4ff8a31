"""Triton's tensorrt backend: ``model.plan`` engines through the ``tensorrt`` package, GPU hosts only."""
