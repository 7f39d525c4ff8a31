"""SageMaker golden-capture model: initialize() raises an ordinary error
(Triton's SageMaker server answers 400 to such a load)."""


class TritonPythonModel:
    def initialize(self, args):
        raise ValueError("sagemaker golden: initialize failed on purpose")

    def execute(self, requests):
        return []
