"""`swajax.LLM` used carelessly: streams abandoned every way a script abandons them, calls from
several threads, wrong argument types, failing calls. Each leaves the LLM serving exactly what
it would have served alone, with nothing of the careless call held."""

import gc
import threading

import pytest
from helpers.engine_checks import check_clean

import swajax
from swajax import SamplingParams

PROMPTS = ["def fibonacci(n):", "import numpy as np\n", "class Tree:", "# sort a list"]


@pytest.fixture(scope="module")
def llm():
    return swajax.LLM("tiny", max_model_len=256)


def sampled(i):
    return SamplingParams(max_tokens=12, temperature=0.8, seed=i, ignore_eos=True)


@pytest.fixture(scope="module")
def alone(llm):
    """Each prompt's tokens when its call runs alone."""
    return [llm.generate(p, sampled(i))[0].outputs[0].token_ids for i, p in enumerate(PROMPTS)]


def nothing_held(llm):
    check_clean(llm.engine)


def test_calls_from_several_threads_give_what_each_gives_alone(llm, alone):
    got = [None] * len(PROMPTS)
    barrier = threading.Barrier(len(PROMPTS))

    def call(i):
        barrier.wait()
        got[i] = llm.generate(PROMPTS[i], sampled(i))[0].outputs[0].token_ids

    threads = [threading.Thread(target=call, args=(i,)) for i in range(len(PROMPTS))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert got == alone
    nothing_held(llm)


def abandon_by_close(llm):
    stream = llm.stream(PROMPTS, sampled(0))
    next(stream)
    stream.close()


def abandon_by_dropping(llm):
    stream = llm.stream(PROMPTS, sampled(0))
    next(stream)
    del stream
    gc.collect()


def abandon_by_error(llm):
    with pytest.raises(KeyError):
        for _ in llm.stream(PROMPTS, sampled(0)):
            raise KeyError("the consumer failed")


@pytest.mark.parametrize("abandon", [abandon_by_close, abandon_by_dropping, abandon_by_error])
def test_an_abandoned_stream_aborts_its_requests(llm, alone, abandon):
    before = len(llm.engine.requests)
    abandon(llm)
    mine = list(llm.engine.requests.values())[before:]
    assert mine and all(r.done for r in mine)
    assert any(r.finish_reason == "abort: the caller stopped reading" for r in mine)
    nothing_held(llm)
    assert llm.generate(PROMPTS[1], sampled(1))[0].outputs[0].token_ids == alone[1]


def test_a_second_call_inside_an_open_stream_is_refused_with_the_reason(llm):
    stream = llm.stream(PROMPTS[0], sampled(0))
    next(stream)
    with pytest.raises(swajax.InputError, match="finish or close"):
        llm.generate(PROMPTS[1], sampled(1))
    stream.close()
    nothing_held(llm)


@pytest.mark.parametrize(
    "prompts, sampling, needle",
    [
        ("x", {"max_tokens": 4}, "must be a SamplingParams, got dict"),
        (b"abc", None, "prompts is bytes"),
        ([[1, 2], b"ab"], None, "prompt 1 must be text"),
        ([[True, 2]], None, "prompt 0 must be text"),
        (
            [[1, 2]],
            SamplingParams(temperature=0.0, top_k=100000, ignore_eos=True),
            "exceeds the vocabulary",
        ),
    ],
)
def test_wrong_arguments_are_clear_errors(llm, alone, prompts, sampling, needle):
    with pytest.raises(swajax.InputError, match=needle):
        llm.generate(prompts, sampling)
    nothing_held(llm)
    assert llm.generate(PROMPTS[2], sampled(2))[0].outputs[0].token_ids == alone[2]


def test_a_call_failing_half_way_leaves_nothing_queued(llm, alone):
    """The third prompt is over the context limit: the two queued before it are aborted, not
    left to run in the next call."""
    with pytest.raises(swajax.InputError, match="context limit"):
        llm.generate([PROMPTS[0], PROMPTS[1], "x" * 300], sampled(0))
    nothing_held(llm)
    assert llm.generate(PROMPTS[3], sampled(3))[0].outputs[0].token_ids == alone[3]


def test_sampling_values_beyond_the_steps_types_are_refused():
    for kwargs, needle in [
        (dict(top_k=10**12), "top_k"),
        (dict(max_tokens=2**31), "max_tokens"),
        (dict(presence_penalty=1e39), "presence_penalty"),
        (dict(stop_token_ids=(2**31,)), "stop_token_ids"),
        (dict(n=True), "n"),
        (dict(n=10_000), "n must be at most 64"),  # as the server caps it
        (dict(n=2, best_of=65), "best_of must be at most 64"),
        (dict(temperature=True), "temperature"),
        (dict(max_tokens=True), "max_tokens"),
        (dict(seed=True), "seed"),
        (dict(temperature=float("nan")), "temperature must be a finite number"),
    ]:
        with pytest.raises(swajax.RequestError, match=needle):
            SamplingParams(**kwargs)
