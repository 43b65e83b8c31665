"""Sampling and stopping through the public API (`import swajax` only, plus the engine for
retraction): stop strings, n samples sharing one prefill, penalties counted on the device
across retraction and overlap, top-N logprobs."""

import json
import pathlib

import numpy as np
import pytest

import swajax

FIXTURE = pathlib.Path(__file__).resolve().parent / "fixtures" / "gpt_oss"
PROMPT = json.loads((FIXTURE / "greedy.json").read_text())["prompt"]


@pytest.fixture(scope="module")
def tiny():
    return swajax.LLM("tiny", max_model_len=512)


def test_a_stop_string_cuts_text_and_tokens(tiny):
    prompt = "def fibonacci(n):"
    (free,) = tiny.generate(
        prompt, swajax.SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    )[0].outputs
    stop = free.text[12:15]
    at = free.text.find(stop)
    (out,) = tiny.generate(
        prompt,
        swajax.SamplingParams(temperature=0.0, max_tokens=40, stop=[stop, "@@@"], ignore_eos=True),
    )[0].outputs
    assert out.finish_reason == "stop" and out.text == free.text[:at]
    # The tokens end with the one that completed the stop string.
    m = len(out.token_ids)
    assert out.token_ids == free.token_ids[:m]
    assert stop in tiny.tokenizer.decode(free.token_ids[:m])
    assert stop not in tiny.tokenizer.decode(free.token_ids[: m - 1])
    events = list(
        tiny.stream(
            prompt,
            swajax.SamplingParams(temperature=0.0, max_tokens=40, stop=stop, ignore_eos=True),
        )
    )
    assert "".join(e.text for e in events) == out.text  # the stop string never streamed
    assert events[-1].finish_reason == "stop"


def test_n_samples_share_one_prefill(tiny):
    prompt = "the quick brown fox jumps over the lazy dog " * 3  # 132 tokens
    n = 4
    before = len(tiny.engine.metrics)
    (result,) = tiny.generate(
        prompt, swajax.SamplingParams(max_tokens=6, temperature=1.0, seed=3, n=n, ignore_eos=True)
    )
    outs = result.outputs
    assert [o.index for o in outs] == list(range(n))
    assert len({tuple(o.token_ids) for o in outs}) > 1  # distinct samples
    prefill = sum(m.new_tokens for m in tiny.engine.metrics[before:] if m.kind == "extend")
    page = tiny.engine.sizes.page_size
    cached = [r.cached_tokens for r in list(tiny.engine.requests.values())[-n:]]
    assert prefill <= len(result.prompt_token_ids) + (n - 1) * (page + 1)
    assert all(c >= len(result.prompt_token_ids) - page - 1 for c in cached[1:])
    (alone,) = tiny.generate(
        prompt, swajax.SamplingParams(max_tokens=6, temperature=1.0, seed=3, ignore_eos=True)
    )[0].outputs
    assert alone.token_ids == outs[0].token_ids  # sample 0 is the request's own seed


def penalized(logits: np.ndarray, prompt, output, rep, presence, frequency) -> np.ndarray:
    """transformers' repetition penalty, then OpenAI's presence / frequency penalties."""
    x = logits.astype(np.float64).copy()
    seen = sorted(set(prompt) | set(output))
    x[seen] = np.where(x[seen] < 0, x[seen] * rep, x[seen] / rep)
    counts = np.bincount(np.asarray(output, int), minlength=len(x)) if output else 0 * x
    return x - frequency * counts - presence * (counts > 0)


@pytest.fixture(scope="module")
def model():
    return swajax.LLM(
        str(FIXTURE),
        max_model_len=256,
        page_size=4,
    )


PENALTIES = dict(repetition_penalty=1.6, presence_penalty=0.4, frequency_penalty=0.9)


def test_penalties_match_the_reference_after_a_retraction(model):
    engine = model.engine
    params = swajax.SamplingParams(temperature=0.0, max_tokens=14, **PENALTIES)
    rid = engine.add_request(PROMPT, params, keep_logits=True)
    plain = engine.add_request(
        PROMPT[:11], swajax.SamplingParams(temperature=0.0, max_tokens=14, ignore_eos=True)
    )
    for _ in range(6):
        engine.step()
    req = engine.requests[rid]
    assert 0 < len(req.output) < 14
    engine.scheduler.retract(req)  # its counts are reloaded from the host at re-admission
    engine.run()
    out = req.output
    assert len(out) == 14
    for i, token in enumerate(out):
        row = np.asarray(req.logits[len(PROMPT) - 1 + i])
        expected = penalized(row, PROMPT, out[:i], 1.6, 0.4, 0.9)
        assert token == int(np.argmax(expected)), i
    (ref,) = model.generate(
        [PROMPT[:11]], swajax.SamplingParams(temperature=0.0, max_tokens=14, ignore_eos=True)
    )[0].outputs
    assert engine.requests[plain].output == ref.token_ids  # a neighbour is not penalized
    # Without kept logits the decode steps overlap: the device's counts give the same tokens.
    (fast,) = model.generate([PROMPT], params)[0].outputs
    assert fast.token_ids == out


def test_top_logprobs_rank_the_raw_distribution(model):
    (out,) = model.generate(
        [PROMPT], swajax.SamplingParams(temperature=0.0, max_tokens=5, logprobs=3, ignore_eos=True)
    )[0].outputs
    assert len(out.logprobs) == 5
    for token, lp, top in zip(out.token_ids, out.token_logprobs, out.logprobs):
        ranked = list(top.items())
        assert len(ranked) == 3 and ranked[0][0] == token  # greedy: the top-ranked token
        assert ranked[0][1] == pytest.approx(lp, abs=1e-6)
        assert [v for _, v in ranked] == sorted((v for _, v in ranked), reverse=True)
    with pytest.raises(swajax.InputError, match="logprobs 21 exceeds max_logprobs 20"):
        model.generate(
            [PROMPT], swajax.SamplingParams(temperature=0.0, logprobs=21, ignore_eos=True)
        )


def test_greedy_steps_compile_no_draw_and_a_sampled_request_joins_them(tiny, monkeypatch):
    """An all-greedy step's program leaves the vocabulary sort and the draw out (its
    `SampleMode.draw` is False); a sampled request joining greedy ones runs in the program that
    has them, and every request gets the tokens it gets alone."""
    engine = tiny.engine
    greedy = swajax.SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    sampled = swajax.SamplingParams(max_tokens=8, temperature=3.0, seed=11, ignore_eos=True)
    a, b = (tiny.tokenizer.encode(p) for p in ("the quick brown fox", "def fibonacci(n):"))
    programs = engine.runner.programs
    modes = []  # the sampling mode of every step program run
    call = programs.call
    monkeypatch.setattr(
        programs,
        "call",
        lambda fn, args, statics: (modes.append(statics.get("mode")), call(fn, args, statics))[1],
    )

    def run(pairs):
        modes.clear()
        rids = [engine.add_request(list(p), s) for p, s in pairs]
        engine.run()
        return [list(engine.requests[r].output) for r in rids], {m.draw for m in modes if m}

    (alone_a,), draws = run([(a, greedy)])
    assert draws == {False}
    (alone_b,), draws = run([(b, sampled)])
    assert draws == {True}
    both, draws = run([(a, greedy), (b, sampled)])
    assert both == [alone_a, alone_b] and True in draws
    assert alone_b != run([(b, greedy)])[0][0]  # it did sample
