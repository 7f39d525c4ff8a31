"""Golden-capture bad model: initialize() raises."""


class TritonPythonModel:
    def initialize(self, args):
        raise ValueError("golden: initialize failed on purpose")

    def execute(self, requests):
        return []
