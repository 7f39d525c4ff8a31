"""A Python model's auto_complete_config never runs in the server: models without the hook are read from their
source and skipped, the rest run in a process of their own."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from naiad.backends.python.autocomplete import defines_hook, run_isolated
from naiad.backends.python.backend import _own_env
from naiad.core.errors import InferError


@pytest.mark.parametrize("source, asked", [
    ("class TritonPythonModel:\n    def execute(self, requests):\n        return []\n", False),
    ("class TritonPythonModel:\n    @staticmethod\n    def auto_complete_config(c):\n        return c\n", True),
    ("class TritonPythonModel(Base):\n    pass\n", True),  # may inherit it
    ("from helpers import TritonPythonModel\n", True),  # made elsewhere
    ("class TritonPythonModel:\n    auto_complete_config = staticmethod(lambda c: c)\n", True),
    ("class TritonPythonModel(:\n", True),  # a syntax error: the process reports it
])
def test_defines_hook_reads_the_source(tmp_path: Path, source: str, asked: bool) -> None:
    model = tmp_path / "model.py"
    model.write_text(source)
    assert defines_hook(model) is asked


def test_a_model_that_exits_while_imported_fails_only_its_own_run(tmp_path: Path) -> None:
    model = tmp_path / "model.py"
    model.write_text("import os\nos._exit(3)\n")
    with pytest.raises(InferError) as caught:
        run_isolated(sys.executable, _own_env(), model, "quitter", {"name": "quitter"})
    assert caught.value.message == ("auto_complete_config of model 'quitter' failed: its process ended with exit "
                                    "code 3")


def test_the_hook_runs_in_its_process(tmp_path: Path) -> None:
    model = tmp_path / "model.py"
    model.write_text(
        "import os\n"
        "class TritonPythonModel:\n"
        "    @staticmethod\n"
        "    def auto_complete_config(config):\n"
        "        config.set_max_batch_size(os.getpid())\n"
        "        return config\n")
    completed = run_isolated(sys.executable, _own_env(), model, "m", {"name": "m"})
    assert completed is not None and completed["max_batch_size"] not in (0, __import__("os").getpid())
