"""Used by tools/run_triton_qa.py: runs a QA test script the way its ``test.sh`` does (``python x_test.py
[Class[.test]]``, i.e. ``unittest.main``), and records each test's outcome in a JUnit file beside it."""

from __future__ import annotations

import itertools
import os
import runpy
import signal
import sys
import time
import unittest
import xml.etree.ElementTree as ET


# Scripts that cannot run here whatever the server; their tests are recorded as skipped, and the script
# succeeds so that the test.sh around it goes on.
SKIPPED_SCRIPTS = {
    "http_basic_auth_test.py": "needs nginx in front of the server as a basic-auth proxy",
    "grpc_basic_auth_test.py": "needs nginx in front of the server as a basic-auth proxy",
}


def _tests(suite: unittest.TestSuite):  # type: ignore[no-untyped-def]
    for item in suite:
        if isinstance(item, unittest.TestSuite):
            yield from _tests(item)
        else:
            yield item


class _Recorder(unittest.TextTestResult):
    records: list[tuple[str, str, str, str]] = []

    def _add(self, test: unittest.TestCase, status: str, why: str = "") -> None:
        cls = type(test)
        self.records.append((f"{cls.__module__}.{cls.__name__}", getattr(test, "_testMethodName", str(test)),
                             status, why))

    def addSuccess(self, test):  # type: ignore[no-untyped-def]
        super().addSuccess(test)
        self._add(test, "pass")

    def addFailure(self, test, err):  # type: ignore[no-untyped-def]
        super().addFailure(test, err)
        self._add(test, "failure", str(err[1]).splitlines()[0][:300] if str(err[1]) else err[0].__name__)

    def addError(self, test, err):  # type: ignore[no-untyped-def]
        super().addError(test, err)
        text = str(err[1]).splitlines()[0][:300] if str(err[1]) else err[0].__name__
        self._add(test, "error", f"{err[0].__name__}: {text}")

    def addSkip(self, test, reason):  # type: ignore[no-untyped-def]
        super().addSkip(test, reason)
        self._add(test, "skipped", reason)

    def addExpectedFailure(self, test, err):  # type: ignore[no-untyped-def]
        super().addExpectedFailure(test, err)
        self._add(test, "pass")

    def addUnexpectedSuccess(self, test):  # type: ignore[no-untyped-def]
        super().addUnexpectedSuccess(test)
        self._add(test, "failure", "unexpected success")


def _skip_listed(script: str) -> None:
    """The harness's GPU-only tests (``file::Class::test`` in QA_SKIP_TESTS) are not run: their methods are
    hidden from the loader (the harness reports them as skipped, with the reason)."""
    module = sys.modules["__main__"]
    for node in filter(None, os.environ.get("QA_SKIP_TESTS", "").splitlines()):
        parts = node.split("::")
        if len(parts) == 3 and parts[0] == script and hasattr(module, parts[1]):
            setattr(getattr(module, parts[1]), parts[2], None)  # not callable: the loader passes it by


def _write(path: str) -> None:
    suite = ET.Element("testsuite")
    for classname, name, status, why in _Recorder.records:
        case = ET.SubElement(suite, "testcase", classname=classname, name=name)
        if status != "pass":
            ET.SubElement(case, status, message=why)
    ET.ElementTree(suite).write(path)


def run(args: list[str]) -> None:
    script = args[0]
    n = next(i for i in itertools.count() if not os.path.exists(f"__qa_{i}.xml"))
    out = f"__qa_{n}.xml"
    timeout = int(os.environ.get("QA_SCRIPT_TIMEOUT", "900"))

    def expired(signum, frame):  # type: ignore[no-untyped-def]
        _Recorder.records.append((os.path.basename(script), "(script)", "error", f"timed out after {timeout} s"))
        _write(out)
        os._exit(1)

    signal.signal(signal.SIGALRM, expired)
    signal.alarm(timeout)
    original = unittest.main

    def main(*a, **kw):  # type: ignore[no-untyped-def]
        reason = SKIPPED_SCRIPTS.get(os.path.basename(script))
        if reason:
            for test in _tests(unittest.defaultTestLoader.loadTestsFromModule(sys.modules["__main__"])):
                _Recorder.records.append((f"{type(test).__module__}.{type(test).__name__}",
                                          test._testMethodName, "skipped", reason))
            _write(out)
            sys.exit(0)
        kw.setdefault("testRunner", unittest.TextTestRunner(resultclass=_Recorder, verbosity=2))
        _skip_listed(os.path.basename(script))
        kw["exit"] = False
        result = original(*a, **kw)
        _write(out)
        sys.exit(0 if result.result.wasSuccessful() else 1)

    unittest.main = main  # type: ignore[assignment]
    sys.argv = args
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    started = time.time()
    try:
        runpy.run_path(script, run_name="__main__")
    finally:
        if not os.path.exists(out) or os.path.getmtime(out) < started:
            _write(out)
