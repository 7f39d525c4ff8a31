"""Backends turn a model version plus its config into instances that execute requests."""
