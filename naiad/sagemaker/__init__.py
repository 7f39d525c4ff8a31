"""SageMaker's platform side, in one place; its HTTP routes stay a front end (``naiad.frontends.sagemaker``).

Two layers, as tests/test_layers.py checks:

- shared by both sides of the service face, over ``naiad.core`` only: ``contract`` (the target-model header,
  the model key, the multi-model API's errors, which failures are answered 507 and what the log says about
  them), ``options`` (the flags and the environment Triton's SageMaker server reads), ``counters`` (the
  CloudWatch-style endpoint counters and their Prometheus families) and ``serve`` (``naiad sagemaker serve``,
  Triton's docker/sagemaker/serve script);
- below the face, the platform's model management: ``urls`` (which urls a load may name, and which folder becomes
  the target model) and ``residency`` (the multi-model API and on-demand archives over
  ``naiad.repository.model_cache``), which the service holds and front ends reach only through it.

Nothing is imported here, so importing one module does not import the others.
"""
