"""SageMaker golden-capture model: initialize() raises MemoryError.

Triton's SageMaker server answers 507 to a load whose error message holds an
out-of-memory phrase ("MemoryError" is one of them)."""


class TritonPythonModel:
    def initialize(self, args):
        raise MemoryError("sagemaker golden: initialize ran out of memory on purpose")

    def execute(self, requests):
        return []
