"""A model version's signature in a front-end process (``--frontend-processes N``): the front end checks a request as
the host would, and the host, told which version it was checked against, skips its own check when that version
serves it. Validation is serial work at the host otherwise; here it runs on every front end's core.

A check keyed to a version is good for that version only (its config: reshapes, raw input, batch limits). A reload
may change which version serves before the request arrives, so what the check changed travels with the request
(``undo``) and the host puts the request back as the client sent it when another version serves it, then checks it
(``hosting.settle``): a request checked against anything else arrives as if it were unchecked.
"""

from __future__ import annotations

import numpy as np

from naiad.config import ModelConfig
from naiad.config.signature import Signature
from naiad.core.request import InferRequest

# What a front end's check changed in a request (``wire.Request.undo``): None, nothing but ``batch_size``; else
# (the raw input's deduced name, "" when the request had named inputs; ((input name, the client's shape), ...)).
Undo = tuple[str, tuple[tuple[str, tuple[int, ...]], ...]]


class Precheck:
    """Kept as a front end's ``ModelView.handle`` (only the service reads a view's handle)."""

    __slots__ = ("number", "reshapes", "signature")

    def __init__(self, number: int, config: bytes) -> None:
        message = ModelConfig()
        message.ParseFromString(config)
        self.number = number  # the host's number for the version (wire.Request's ``checked``)
        self.signature = Signature(message)
        self.reshapes = any(spec.reshape is not None for spec in self.signature.inputs.values())

    def run(self, request: InferRequest) -> tuple[int, Undo | None]:
        """(the version's number, what the check changed) if ``request`` passes, checked as the host would check it
        (raw input deduced, reshapes applied, ``batch_size`` set); (0, None) if it doesn't, with the request left as
        it came, so that the host checks it again, refuses it in its own words and counts the refusal."""
        inputs, raw_input, batch_size = request.inputs, request.raw_input, request.batch_size
        if self.reshapes:
            request.inputs = dict(inputs)  # (a reshape replaces entries: the host may need them as they came)
        try:
            self.signature.check(request)
        except Exception:  # noqa: BLE001 - whatever it was, the host meets it again
            request.inputs, request.raw_input, request.batch_size = inputs, raw_input, batch_size
            return 0, None
        if raw_input is not None:
            (name,) = request.inputs  # (the deduction leaves the model's one input)
            return self.number, (name, ())
        if not self.reshapes:
            return self.number, None
        reshaped = tuple((name, array.shape) for name, array in inputs.items() if request.inputs[name] is not array)
        return self.number, (("", reshaped) if reshaped else None)


def undo(request: InferRequest, changes: Undo) -> None:
    """Put ``request`` back as its client sent it, from what a front end's check (``Precheck.run``) changed."""
    raw, reshaped = changes
    inputs = request.inputs
    if raw:
        array = inputs.pop(raw)
        # The deduction's array holds the body's bytes in order: the body itself for BYTES, else the buffer.
        request.raw_input = bytes(array.flat[0]) if array.dtype == np.object_ else array.tobytes()
        return
    for name, shape in reshaped:
        inputs[name] = inputs[name].reshape(shape)
    request.batch_size = 0

