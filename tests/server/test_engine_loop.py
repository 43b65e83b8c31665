"""The server's engine thread in process: a bounded queue, cancellation, shutdown."""

import asyncio

import pytest

import swajax
from swajax.server.engine_loop import EngineLoop, Job, QueueFull, ShuttingDown


def job(prompt: bytes, max_tokens: int, loop) -> Job:
    params = swajax.SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    return Job([list(prompt)], params, keep_logits=False, loop=loop)


async def finish(j: Job) -> list:
    messages = []
    while not messages or messages[-1][0] not in ("done", "error"):
        messages.append(await j.queue.get())
    return messages


def test_queue_bound_cancel_and_shutdown():
    llm = swajax.LLM("tiny", max_model_len=512)

    async def scenario():
        loop = asyncio.get_running_loop()
        engine_loop = EngineLoop(llm, max_waiting=2)
        first, second = job(b"def f():", 4, loop), job(b"class A:", 4, loop)
        engine_loop.submit(first)
        engine_loop.submit(second)
        with pytest.raises(QueueFull, match="2 sequences wait and this request adds 1; the limit"):
            engine_loop.submit(job(b"x", 4, loop))
        engine_loop.start()
        done = await asyncio.gather(finish(first), finish(second))
        assert all(m[0][0] == "accepted" and m[-1][0] == "done" for m in done)
        tokens = sum(
            len(e) for m in done for kind, *rest in m if kind == "tokens" for e in [rest[1]]
        )
        assert tokens == 8
        long = engine_loop.submit(job(b"import os\n", 400, loop))
        assert (await long.queue.get())[0] == "accepted"
        await long.queue.get()  # its first tokens: it is running
        engine_loop.cancel(long)
        messages = await finish(long)
        (_, ends) = messages[-1]
        assert ends[0][1] == "abort: client disconnected"
        assert engine_loop.shutdown() == 0
        with pytest.raises(ShuttingDown):
            engine_loop.submit(job(b"y", 4, loop))

    asyncio.run(scenario())
    engine = llm.engine
    assert not engine.scheduler.running and not engine.scheduler.waiting
    assert engine.cache.full_protected == 0  # nothing locked: the cancelled request let go
