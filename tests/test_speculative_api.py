"""Speculative decoding through the public API, as a user runs it: the demo with its own MTP
draft and its own generation_config (a repetition penalty, sampling), every sampling field
equal to plain decoding's under greedy, a stop string that lands inside a round (the tokens
after it and their KV are dropped, nothing after it is cached), best_of, bad words, min_tokens
and logit bias."""

import re

import numpy as np
import pytest
from helpers.engine_checks import check_clean

import swajax
from swajax import SamplingParams

PROMPT = "def fibonacci(n):"


@pytest.fixture(scope="module")
def plain():
    return swajax.LLM("tiny", max_model_len=512, dtype="float32")


@pytest.fixture(scope="module")
def mtp():
    return swajax.LLM("tiny", max_model_len=512, dtype="float32", draft_model="mtp")


def one(llm, params, prompt=PROMPT):
    (result,) = llm.generate(prompt, params, use_tqdm=False)
    return result


def test_the_demos_default_call_drafts_with_its_own_generation_config(mtp):
    """The README's line: the demo's generation_config sets repetition_penalty 1.1 and samples."""
    assert mtp.engine.sampling_defaults["repetition_penalty"] == 1.1
    result = one(mtp, SamplingParams(max_tokens=48))
    (out,) = result.outputs
    assert out.finish_reason in ("stop", "length") and out.token_ids
    assert 0 < result.num_accepted_tokens <= result.num_draft_tokens
    summary = mtp.summary()
    assert summary["draft_tokens_proposed"] >= result.num_draft_tokens
    assert 1 < summary["mean_acceptance_length"] <= 1 + mtp.engine.options.num_speculative_tokens


def test_greedy_with_the_checkpoints_penalty_and_logprobs_equals_plain_decoding(plain, mtp):
    params = SamplingParams(
        temperature=0.0,
        max_tokens=37,  # ends inside a round of 4
        logprobs=3,
        prompt_logprobs=2,
        presence_penalty=0.3,
        ignore_eos=True,
        n=2,
    )
    ours, theirs = one(plain, params), one(mtp, params)
    for a, b in zip(theirs.prompt_logprobs[1:], ours.prompt_logprobs[1:], strict=True):
        assert sorted(a) == sorted(b)
        np.testing.assert_allclose([a[t] for t in sorted(a)], [b[t] for t in sorted(b)], 1e-4, 1e-4)
    for want, got in zip(ours.outputs, theirs.outputs, strict=True):
        assert got.token_ids == want.token_ids and got.text == want.text
        assert len(got.token_ids) == 37
        np.testing.assert_allclose(got.token_logprobs, want.token_logprobs, rtol=1e-4, atol=1e-4)
        for a, b in zip(got.logprobs, want.logprobs):
            assert sorted(a) == sorted(b)
            np.testing.assert_allclose(
                [a[t] for t in sorted(a)], [b[t] for t in sorted(b)], 1e-4, 1e-4
            )


def test_a_stop_string_inside_a_round_drops_what_follows(plain, mtp):
    greedy = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    free = one(plain, greedy).outputs[0]
    stop = free.text[20:24]
    at = free.text.find(stop)
    result = one(mtp, SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True, stop=stop))
    (out,) = result.outputs
    assert out.finish_reason == "stop" and out.stop_reason == stop and out.text == free.text[:at]
    m = len(out.token_ids)
    assert out.token_ids == free.token_ids[:m] and m < len(free.token_ids)
    engine = mtp.engine
    req = engine.requests[max(engine.requests)]
    assert req.output == out.token_ids  # the round's tokens after the stop are gone
    prompt = result.prompt_token_ids
    assert req.kv_len == len(prompt) + m - 1
    # Nothing after the stop reached the prefix cache.
    assert engine.cache.match(prompt + free.token_ids).full_length <= len(prompt) + m
    check_clean(engine)


def test_best_of_returns_the_n_likeliest_of_its_samples(mtp):
    base = dict(max_tokens=8, temperature=1.0, seed=11, ignore_eos=True)
    every = one(mtp, SamplingParams(n=5, **base)).outputs
    best = one(mtp, SamplingParams(n=2, best_of=5, **base)).outputs
    ranked = sorted(every, key=lambda o: -o.cumulative_logprob)[:2]
    assert [o.token_ids for o in best] == [o.token_ids for o in ranked]
    assert [o.index for o in best] == [0, 1]


def test_bad_words_min_tokens_and_logit_bias(plain, mtp):
    """Each rule through the LLM (the engine tests prove a draft changes nothing)."""
    greedy = dict(temperature=0.0, max_tokens=30, ignore_eos=True)
    free = one(plain, SamplingParams(**greedy)).outputs[0]
    word = max(re.findall(r"[a-z]+", free.text), key=len)  # "string"
    banned = one(mtp, SamplingParams(bad_words=[word], **greedy)).outputs[0]
    assert word not in banned.text
    # A stop string the output completes early counts only once min_tokens are out.
    stop = free.text[2:4]
    early = one(plain, SamplingParams(stop=stop, **greedy)).outputs[0]
    late = one(mtp, SamplingParams(stop=stop, min_tokens=10, **greedy)).outputs[0]
    assert len(early.token_ids) < 10 <= len(late.token_ids) or late.finish_reason == "length"
    assert late.token_ids == free.token_ids[: len(late.token_ids)]
    # A large bias makes greedy decoding repeat the token (no penalty to push back).
    forced = ord("x")
    params = SamplingParams(logit_bias={forced: 100.0}, repetition_penalty=1.0, **greedy)
    assert set(one(mtp, params).outputs[0].token_ids) == {forced}


def test_fields_a_request_cannot_have_are_named(plain):
    with pytest.raises(swajax.RequestError, match="outside the vocabulary"):
        one(plain, SamplingParams(logit_bias={10**6: 1.0}))
    with pytest.raises(swajax.RequestError, match="allowed_token_ids is empty"):
        SamplingParams(allowed_token_ids=[])
    with pytest.raises(swajax.RequestError, match=r"best_of \(1\) must be >= n \(2\)"):
        SamplingParams(n=2, best_of=1)
    with pytest.raises(swajax.RequestError, match=r"min_tokens \(9\) must be <= max_tokens"):
        SamplingParams(min_tokens=9, max_tokens=4)
