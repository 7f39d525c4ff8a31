"""What every SageMaker route shares: the target-model header and the replies the multi-model API answers with
(here, apart from ``routes.py``, so the runtime front door can use them without importing its router). The
header's name, the mismatch wording and which errors are a 507 are SageMaker's contract (``naiad.sagemaker``)."""

from __future__ import annotations

import logging

import orjson

from naiad.core.errors import InferError
from naiad.frontends.replies import Reply
from naiad.sagemaker.contract import MISMATCH, TARGET_MODEL, exhausted_budget, is_out_of_memory

log = logging.getLogger("naiad.sagemaker")

def target_model(headers: dict[bytes, bytes]) -> str:
    """The target-model header as text; bytes that aren't UTF-8 name no model (they were a 500 before)."""
    return headers.get(TARGET_MODEL, b"").decode("utf-8", "replace")


def mismatched(headers: dict[bytes, bytes], resident: dict[str, str], action: str) -> Reply | None:
    """The 400 for a target-model header that names another model than ``resident``'s (as the service lists
    it: key, url, target), else None."""
    if TARGET_MODEL not in headers:
        return None
    named = target_model(headers)
    if named == resident["target"]:
        return None
    log.error("SageMaker %s rejected: X-Amzn-SageMaker-Target-Model '%s' does not match the model registered under "
              "URL hash '%s'", action, named, resident["key"])
    return Reply(400, orjson.dumps({"error": MISMATCH}))


def bare(status: int) -> Reply:
    """A status with no body and no content type."""
    return Reply(status, b"", b"")


def sagemaker_error(error: InferError) -> Reply:
    """How Triton's multi-model handlers answer a failure: 507 when it reads as out of memory, else 400."""
    if is_out_of_memory(error.message):
        log.warning("answering 507: %s ran out: %s", exhausted_budget(error.message), error.message)
        return Reply(507, orjson.dumps({"error": error.message}))
    return Reply(400, orjson.dumps({"error": error.message}))
