"""naiad: a Triton-compatible inference server written in Python."""

__version__ = "0.1.0"
