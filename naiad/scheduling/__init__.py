"""Schedulers: how queued requests reach a model's instances."""
