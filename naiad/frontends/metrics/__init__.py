"""Prometheus metrics with Triton's names on the metrics port."""
