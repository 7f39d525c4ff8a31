"""What a front end may know of a model to decode a request and encode its answers, as one immutable value.

The host builds one per loaded version (``ModelVersion.view``) and the service hands it out: a front end never sees
the repository's objects, so the service can sit behind a function call (one process) or a channel (several).
"""

from __future__ import annotations

from typing import Any, NamedTuple


class ModelView(NamedTuple):
    name: str
    version: str  # the version number as text, as responses carry it
    platform: str
    decoupled: bool  # answers only through a stream
    batching: bool  # max_batch_size > 0: tensors carry a batch dimension
    labels: dict[str, list[str]]  # output name -> class labels (classification extension)
    inputs: list[dict[str, Any]]  # Triton's metadata rows: name, datatype, shape
    outputs: list[dict[str, Any]]
    input_datatypes: dict[str, str]  # input name -> the datatype the model expects, as error messages name it
    handle: Any = None  # the host's own object for this version: only the service reads it (None across processes)
