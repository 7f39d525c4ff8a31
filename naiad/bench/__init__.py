"""naiad bench: a perf_analyzer-compatible load generator, and Inference Recommender's traffic patterns.

Layers, bottom up: control (the server's control plane), inputs (request bytes), transport + worker (the load
processes), load (the parent's handle on them), stats (perf_analyzer's arithmetic), session (windows and
stability), traffic (patterns and stopping conditions), api (the Python API), report / progress / cli."""
