"""Answer: a unary request's future, resolved synchronously, as the model, the face and the host use it."""

from __future__ import annotations

import asyncio
import logging

import pytest

from naiad.core.answer import Answer


def test_callbacks_run_within_set_result_in_order_and_a_failing_one_is_logged(caplog: pytest.LogCaptureFixture
                                                                             ) -> None:
    answer, seen = Answer(), []
    answer.add_done_callback(lambda a: seen.append(("first", a.result())))
    answer.add_done_callback(lambda a: 1 / 0)
    answer.add_done_callback(lambda a: seen.append(("last", a.done(), a.cancelled())))
    with caplog.at_level(logging.ERROR):
        answer.set_result("r")
    assert seen == [("first", "r"), ("last", True, False)]  # no loop turn needed, and the error stopped nothing
    assert "an answer's callback failed" in caplog.text
    answer.add_done_callback(lambda a: seen.append("late"))  # added once done: runs at once
    assert seen[-1] == "late"
    with pytest.raises(asyncio.InvalidStateError):
        answer.set_result("again")
    assert not answer.cancel()


def test_cancel_runs_the_callbacks_and_result_raises() -> None:
    answer, seen = Answer(), []
    answer.add_done_callback(lambda a: seen.append(a.cancelled()))
    dropped = seen.append
    answer.add_done_callback(dropped)
    assert answer.remove_done_callback(dropped) == 1 and answer.remove_done_callback(dropped) == 0
    with pytest.raises(asyncio.InvalidStateError):
        answer.result()
    assert answer.cancel() and seen == [True]
    with pytest.raises(asyncio.CancelledError):
        answer.result()
