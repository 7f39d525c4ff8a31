"""The service face (``face.Service``) and the plain values that cross it; front ends import only from here,
from ``naiad.core`` and, for SageMaker, from its contract (``naiad.sagemaker.contract``, the errors the multi-model
API raises). The consent value is re-exported so that front ends can name it without reaching into the
repository."""

from naiad.core.model_view import ModelView
from naiad.repository.consent import CodeConsent
from naiad.repository.control import decode_files
from naiad.service.face import EXTENSIONS, Service

__all__ = ["EXTENSIONS", "CodeConsent", "ModelView", "Service", "decode_files"]
