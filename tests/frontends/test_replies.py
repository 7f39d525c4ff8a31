"""replies.Answer: the HTTP front end's synchronous future, as the model, the face and an awaiting caller use it."""

from __future__ import annotations

import asyncio
import logging

import pytest

from naiad.frontends.replies import Answer, Deferred, Reply
from naiad.ray.asgi import resolve


def test_callbacks_run_within_set_result_in_order_and_a_failing_one_is_logged(caplog: pytest.LogCaptureFixture
                                                                             ) -> None:
    answer, seen = Answer(), []
    answer.add_done_callback(lambda a: seen.append(("first", a.result())))
    answer.add_done_callback(lambda a: 1 / 0)
    answer.add_done_callback(lambda a: seen.append(("last", a.done(), a.cancelled())))
    with caplog.at_level(logging.ERROR):
        answer.set_result("r")
    assert seen == [("first", "r"), ("last", True, False)]  # no loop turn needed, and the error stopped nothing
    assert "a reply's completion failed" in caplog.text
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


def test_an_awaiting_caller_gets_the_answer_and_cancelling_it_cancels_the_answer() -> None:
    async def main() -> None:
        answer = Answer()
        asyncio.get_running_loop().call_later(0.01, answer.set_result, "r")
        reply = await resolve(Deferred(answer, lambda f: Reply(200, f.result().encode())))  # Ray's ASGI bridge
        assert isinstance(reply, Reply) and reply.body == b"r"

        pending = Answer()
        task = asyncio.ensure_future(resolve(Deferred(pending, lambda f: Reply(200))))
        await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert pending.cancelled()  # the client went away: so does its request

    asyncio.run(main())
