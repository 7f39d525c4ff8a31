"""What the ingress answers, over HTTP and gRPC alike, when a model's replica can't be reached and when a client
asks for model control that Ray's residency does instead."""

from __future__ import annotations

import logging

from naiad.core.errors import unavailable

log = logging.getLogger("naiad.ray")

AUTOMATIC = ("models are loaded on first use by the replica a request is routed to and unloaded when a replica "
             "needs room (--max-models-per-replica): explicit {} is not available on Ray Serve")


def lost(exc: Exception, name: str) -> Exception:
    """What a failed call to a model replica answers: ``InferError`` UNAVAILABLE when the replica died or every
    queue is full (a retry can succeed), else ``exc`` itself."""
    from ray import exceptions
    from ray.serve.exceptions import BackPressureError

    if isinstance(exc, (exceptions.RayActorError, exceptions.ActorUnavailableError)):
        # The replica died (or became unreachable) with this request on it; Ray replaces the replica, and a retry
        # goes to a live one.
        log.warning("model '%s': replica lost: %s", name, exc)
        return unavailable(f"the replica serving model '{name}' stopped while handling this request; retry (Ray "
                           "Serve is replacing it)")
    if isinstance(exc, BackPressureError):
        return unavailable(f"model '{name}' is overloaded: every replica's queue is full; retry later")
    return exc
