"""A front end's check of a request against the model's signature (``Precheck``): a request that passes leaves as
the host would have made it (raw input deduced, reshapes applied, batch size set) with the version's number and what
the check changed, which ``undo`` reverts; one that fails leaves exactly as it came, unchecked, so the host checks it
and refuses it in its own words."""

from __future__ import annotations

import numpy as np

from naiad.config.loader import parse_config_text
from naiad.config.signature import Signature
from naiad.core.errors import InferError
from naiad.core.request import InferRequest
from naiad.service.precheck import Precheck, undo

RESHAPED = """
    name: "reshaped"
    max_batch_size: 4
    input [{ name: "A", data_type: TYPE_FP32, dims: [ 4 ], reshape { shape: [ 2, 2 ] } },
           { name: "B", data_type: TYPE_INT32, dims: [ 2 ] }]
    output [{ name: "OUT", data_type: TYPE_FP32, dims: [ 4 ] }]
"""

RAW = """
    name: "raw"
    max_batch_size: 0
    input [{ name: "IN", data_type: TYPE_FP32, dims: [ -1 ] }]
    output [{ name: "OUT", data_type: TYPE_FP32, dims: [ -1 ] }]
"""


def _precheck(config: str, number: int = 7) -> Precheck:
    return Precheck(number, parse_config_text(config).SerializeToString())


def _host_error(config: str, request: InferRequest) -> str:
    """What the host's own check says of ``request``."""
    try:
        Signature(parse_config_text(config)).check(request)
    except InferError as exc:
        return exc.message
    raise AssertionError("the host's check passed")


def test_a_request_that_passes_is_as_the_host_would_make_it() -> None:
    check = _precheck(RESHAPED)
    a, b = np.arange(12, dtype=np.float32).reshape(3, 4), np.zeros((3, 2), np.int32)
    request = InferRequest("reshaped", "", "r", {"A": a, "B": b})
    number, changes = check.run(request)
    assert (number, changes) == (7, ("", (("A", (3, 4)),)))  # what the check changed, for the host to undo
    assert request.batch_size == 3
    assert request.inputs["A"].shape == (3, 2, 2) and request.inputs["B"] is b
    assert changes is not None
    undo(request, changes)
    assert request.inputs["A"].shape == (3, 4) and request.inputs["B"] is b and request.batch_size == 0

    raw = np.arange(5, dtype=np.float32).tobytes()
    request = InferRequest("raw", "", "r")
    request.raw_input = raw
    assert _precheck(RAW, 9).run(request) == (9, ("IN", ()))
    assert request.raw_input is None and request.batch_size == 0
    assert request.inputs["IN"].tolist() == [0, 1, 2, 3, 4]
    undo(request, ("IN", ()))
    assert request.raw_input == raw and request.inputs == {}

    # Nothing but the batch size changed: nothing to undo.
    request = InferRequest("raw", "", "r", {"IN": np.zeros(3, np.float32)})
    assert _precheck(RAW, 9).run(request) == (9, None)


def test_a_request_that_fails_leaves_as_it_came_and_the_host_refuses_it_as_before() -> None:
    check = _precheck(RESHAPED)
    # Inputs are checked newest first: A passes (and would be reshaped), then B's datatype fails.
    a, b = np.zeros((1, 4), np.float32), np.zeros((1, 2), np.float32)
    inputs = {"B": b, "A": a}
    request = InferRequest("reshaped", "", "r", inputs)
    assert check.run(request) == (0, None)
    assert request.inputs is inputs and inputs["A"] is a and inputs["B"] is b and request.batch_size == 0
    assert _host_error(RESHAPED, request) == ("[request id: r] inference input 'B' data-type is 'FP32', but model "
                                              "'reshaped' expects 'INT32'")

    # Raw input of the wrong size: the body is sent again, not the check's leftovers.
    request = InferRequest("raw", "", "r")
    request.raw_input = b"\0" * 6
    assert _precheck(RAW).run(request) == (0, None)
    assert request.raw_input == b"\0" * 6 and request.inputs == {}
    assert "input byte size mismatch for input 'IN'" in _host_error(RAW, request)

    # A batch over the model's maximum.
    request = InferRequest("reshaped", "", "r", {"A": np.zeros((5, 4), np.float32), "B": np.zeros((5, 2), np.int32)})
    assert check.run(request) == (0, None) and request.batch_size == 0 and request.inputs["A"].shape == (5, 4)
    assert "inference request batch-size must be <= 4 for 'reshaped'" in _host_error(RESHAPED, request)
