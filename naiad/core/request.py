"""The server's own request and response: what every front end decodes into and encodes from.

Tensors are NumPy arrays (BYTES: object arrays of ``bytes``). Plain ``__slots__`` classes keep
construction cheap on the hot path; nothing here validates, the model's signature does that once.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from naiad.core.errors import InferError

if TYPE_CHECKING:
    from naiad.core.tracing import Trace


class InferRequest:
    __slots__ = (
        "model_name",
        "model_version",
        "id",
        "inputs",
        "requested_outputs",
        "parameters",
        "correlation_id",
        "flags",
        "priority",
        "timeout_us",
        "batch_size",
        "arrival_ns",
        "raw_input",
        "responder",
        "cache_key",
        "cache_ns",
        "trace",
        "cancelled",
        "checked",
    )

    def __init__(
        self,
        model_name: str,
        model_version: str = "",
        id: str = "",
        inputs: dict[str, np.ndarray] | None = None,
        requested_outputs: list[str] | None = None,
        parameters: dict[str, Any] | None = None,
    ) -> None:
        self.model_name = model_name
        self.model_version = model_version  # "" = the model's newest ready version
        self.id = id
        self.inputs: dict[str, np.ndarray] = inputs if inputs is not None else {}
        # None = every output in the config, in config order.
        self.requested_outputs = requested_outputs
        self.parameters: dict[str, Any] = parameters if parameters is not None else {}
        self.correlation_id: int | str = 0
        self.flags = 0
        self.priority = 0
        self.timeout_us = 0
        self.batch_size = 0  # set by the signature: 0 for models without a batch dimension
        self.arrival_ns = 0
        # A body sent without a JSON header (Inference-Header-Content-Length: 0): the model's only input,
        # whose name, datatype and shape the signature deduces, as Triton's raw-input path does.
        self.raw_input: bytes | None = None
        # Where a decoupled model's responses go, each as it is produced (``final`` marks the last);
        # set by ``Service.stream``.
        self.responder: Callable[[InferResponse], None] | None = None
        # Set by a model with the response cache on a miss: where to store the response, and the lookup time.
        self.cache_key: bytes | None = None
        self.cache_ns = 0
        self.trace: Trace | None = None  # set when the request is sampled for tracing (naiad.core.tracing)
        # The client went away (its front end cancelled the request's future): a scheduler drops it unrun.
        self.cancelled = False
        # The loaded version whose signature already checked this request (a front-end process did, as the host
        # would: reshapes applied, batch_size set); that version's ``submit`` skips the check, any other checks.
        self.checked: object = None


def log_prefix(request: InferRequest) -> str:
    """How Triton starts a message about a request: ``[request id: <id_unknown>] ``."""
    return f"[request id: {request.id or '<id_unknown>'}] "


class InferResponse:
    """One response. ``final`` is False on all but the last response of a decoupled model's stream; a final
    response of a decoupled model may carry no outputs (Triton's ``triton_final_response`` with nothing else)."""

    __slots__ = ("model_name", "model_version", "id", "outputs", "parameters", "error", "final")

    def __init__(
        self,
        model_name: str,
        model_version: str,
        id: str = "",
        outputs: dict[str, np.ndarray] | None = None,
        parameters: dict[str, Any] | None = None,
        error: InferError | None = None,
    ) -> None:
        self.model_name = model_name
        self.model_version = model_version
        self.id = id
        self.outputs: dict[str, np.ndarray] = outputs if outputs is not None else {}
        self.parameters: dict[str, Any] = parameters if parameters is not None else {}
        self.error = error
        self.final = True
