"""What every SageMaker route shares: the target-model header and the replies the multi-model API answers with
(here, apart from ``routes.py``, so the runtime front door can use them without importing its router)."""

from __future__ import annotations

import orjson

from naiad.core.errors import InferError
from naiad.frontends.replies import Reply
from naiad.service import is_out_of_memory

TARGET_MODEL = b"x-amzn-sagemaker-target-model"


def target_model(headers: dict[bytes, bytes]) -> str:
    """The target-model header as text; bytes that aren't UTF-8 name no model (they were a 500 before)."""
    return headers.get(TARGET_MODEL, b"").decode("utf-8", "replace")


def bare(status: int) -> Reply:
    """A status with no body and no content type."""
    return Reply(status, b"", b"")


def sagemaker_error(error: InferError) -> Reply:
    """How Triton's multi-model handlers answer a failure: 507 when it reads as out of memory, else 400."""
    return Reply(507 if is_out_of_memory(error.message) else 400, orjson.dumps({"error": error.message}))
