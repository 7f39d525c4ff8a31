"""A model version's signature in a front-end process (``--frontend-processes N``): the front end checks a request as
the host would, and the host, told which version it was checked against, skips its own check when that version
serves it. Validation is serial work at the host otherwise; here it runs on every front end's core.
"""

from __future__ import annotations

from naiad.config import ModelConfig
from naiad.config.signature import Signature
from naiad.core.request import InferRequest


class Precheck:
    """Kept as a front end's ``ModelView.handle`` (only the service reads a view's handle)."""

    __slots__ = ("number", "reshapes", "signature")

    def __init__(self, number: int, config: bytes) -> None:
        message = ModelConfig()
        message.ParseFromString(config)
        self.number = number  # the host's number for the version (wire.Request's ``checked``)
        self.signature = Signature(message)
        self.reshapes = any(spec.reshape is not None for spec in self.signature.inputs.values())

    def run(self, request: InferRequest) -> int:
        """The version's number if ``request`` passes, checked as the host would check it (raw input deduced,
        reshapes applied, ``batch_size`` set); 0 if it doesn't, with the request left as it came, so that the host
        checks it again, refuses it in its own words and counts the refusal in its statistics."""
        inputs, raw_input, batch_size = request.inputs, request.raw_input, request.batch_size
        if self.reshapes:
            request.inputs = dict(inputs)  # (a reshape replaces entries: the host may need them as they came)
        try:
            self.signature.check(request)
        except Exception:  # noqa: BLE001 - whatever it was, the host meets it again
            request.inputs, request.raw_input, request.batch_size = inputs, raw_input, batch_size
            return 0
        return self.number
