"""``naiad recommend``: SageMaker Inference Recommender's load tests and Model Analyzer's config sweep, locally.

variants (configs to try) -> serving (a fresh server per variant) + resources (what its process tree uses) ->
sweep (the traffic pattern through ``naiad.bench.api``) -> select (SLA, cost) -> report (HTML, PNG, CSV, JSON).
"""
