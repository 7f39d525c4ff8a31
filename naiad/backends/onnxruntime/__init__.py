"""Triton's onnxruntime backend: ``model.onnx`` through onnxruntime, auto-complete from the graph."""
