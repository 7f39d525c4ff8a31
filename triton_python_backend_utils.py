"""Lets an unmodified Triton ``model.py`` do ``import triton_python_backend_utils as pb_utils``."""

from naiad.backends.python.pb_utils import *  # noqa: F401,F403
from naiad.backends.python.pb_utils import __all__  # noqa: F401
