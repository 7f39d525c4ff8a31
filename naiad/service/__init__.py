"""The service face (``face.Service``) and the plain values that cross it; front ends import only from here and
from ``naiad.core``. The residency's exceptions and the consent value are re-exported so that front ends can
name them without reaching into the repository."""

from naiad.core.model_view import ModelView
from naiad.repository.consent import CodeConsent
from naiad.repository.control import decode_files
from naiad.repository.model_cache import ArchiveError, UrlRefused, exhausted_budget, is_out_of_memory
from naiad.service.face import EXTENSIONS, Service

__all__ = ["EXTENSIONS", "ArchiveError", "CodeConsent", "ModelView", "Service", "UrlRefused", "decode_files", "exhausted_budget",
           "is_out_of_memory"]
