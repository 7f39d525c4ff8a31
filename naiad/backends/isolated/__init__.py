"""Framework instances (onnxruntime, pytorch, TensorRT) run in a worker process of their own, on the Python
backend's shared-memory channel: ``version.py`` is the server's side, ``model.py`` what the worker runs."""

SWITCH = "instance-process"  # the --backend-config key (version.py)
# The worker's setup rides in the args its initialize() gets, under this key (version.py writes it, model.py reads it).
SETUP_ARG = "naiad_framework"
