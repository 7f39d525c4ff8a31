"""The service face, by concern (``faces.py``: ``Inference``, ``Models``, ``SageMaker``, ``Administration``; all four:
``Face``), its in-process implementation (``face.Service``) and the plain values that cross it; front ends import
only from here,
from ``naiad.core`` and, for SageMaker, from its contract (``naiad.sagemaker.contract``, the errors the multi-model
API raises). The consent value is re-exported so that front ends can name it without reaching into the
repository."""

from naiad.core.model_view import ModelView
from naiad.repository.consent import CodeConsent
from naiad.repository.control import decode_files
from naiad.service.face import EXTENSIONS, Service
from naiad.service.faces import Administration, Face, Inference, Models, SageMaker

__all__ = ["EXTENSIONS", "Administration", "CodeConsent", "Face", "Inference", "ModelView", "Models", "SageMaker",
           "Service", "decode_files"]
