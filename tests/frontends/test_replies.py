"""A Deferred reply on an Answer, awaited as Ray's ASGI bridge awaits one."""

from __future__ import annotations

import asyncio

import pytest

from naiad.core.answer import Answer
from naiad.frontends.replies import Deferred, Reply
from naiad.ray.asgi import resolve


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
