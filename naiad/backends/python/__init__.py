"""Triton's python backend: ``model.py`` with ``TritonPythonModel`` and ``triton_python_backend_utils``."""
