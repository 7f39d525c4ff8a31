"""naiad on Ray Serve: an ingress that speaks KServe v2 and SageMaker through naiad's own routers, and model
replicas that each run naiad's core service, with Ray's multiplexing routing each model to the replica holding it.

``naiad.ray:app`` is a Serve application builder (``serve run naiad.ray:app model_repository=...``, or
``import_path: naiad.ray:app`` in a Serve config file). Ray is imported only when it is used.
"""

from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> Any:
    if name == "app":
        from naiad.ray.application import app

        return app
    raise AttributeError(name)
