"""Multi-step decode: N decode steps in one program give the tokens (and the logprobs, to
float rounding) of N = 1, stop where N = 1 stops, give back the pages of positions past a stop,
and only run when every request can take them.

The oracle is the same engine with `decode_steps=1`. A real model (the gpt-oss fixture: MoE,
sinks, W = 5 over pages of 4, a prefix hit, greedy and seeded sampling, a stop token, length
limits that are not multiples of N) and the null model (a production preset's shapes).
"""

import numpy as np
import pytest
from helpers import FIXTURES
from helpers.engine_checks import check_clean, check_replays

from swajax import sizing
from swajax.api import engine_for
from swajax.demo import DEMO_DIR
from swajax.errors import RequestError
from swajax.models import load_decoder
from swajax.models.decoder import HybridLM
from swajax.presets import load_preset
from swajax.serving.null_model import NullModel
from swajax.serving.options import EngineOptions
from swajax.serving.sampling_params import SamplingParams
from swajax.trace.recorder import Tracer

PROMPTS = [[(5 * i + 7 * j) % 120 + 1 for i in range(12 + 11 * j)] for j in range(4)]
PROMPTS.append(PROMPTS[3][:30] + [4, 5, 6])  # a prefix hit


def params(stop=()):
    return [
        SamplingParams(
            max_tokens=9 + 5 * i, temperature=0.9 * (i % 2), seed=11 + i, stop_token_ids=stop
        )
        for i in range(len(PROMPTS))
    ]


@pytest.fixture(scope="module")
def lm():
    return HybridLM(load_decoder(FIXTURES / "gpt_oss"), dtype="fp32")


def run(lm, steps, stop=(), trace=None):
    cfg = lm.spec.hybrid
    sizes = sizing.size_hybrid(
        cfg, sizing.gib_to_bytes(0.002), ratio=0.5, page_size=4, dtype="fp32"
    )
    options = EngineOptions(chunk_size=16, eviction_interval=1, max_context=256, decode_steps=steps)
    engine = engine_for(cfg, lm, sizes, options)
    tracer = Tracer(engine) if trace is not None else None
    rids = [engine.add_request(p, q) for p, q in zip(PROMPTS, params(stop))]
    engine.run()
    if tracer is not None:
        check_replays(tracer, trace)  # the round's N positions as one extend, as they ran
    check_clean(engine)  # the pages of positions past a stop came back
    return [(engine.requests[r].output, engine.requests[r].logprobs) for r in rids], engine


def _cut(tokens, stop):
    """Plain decoding's tokens as a stop token would have ended them."""
    return tokens[: tokens.index(stop) + 1] if stop in tokens else tokens


@pytest.mark.slow  # ~70 s of compiling on 2 cores; the quick case below runs by default
def test_n_steps_in_one_program_change_no_token_and_no_logprob(lm, tmp_path):
    plain, plain_engine = run(lm, 1)
    stop = plain[2][0][6]  # request 2 samples it at its seventh token: inside a round
    got, engine = run(lm, 2, (stop,), trace=tmp_path / "t.jsonl")  # N = 2: few programs
    for (tokens_a, logprobs_a), (tokens_b, logprobs_b) in zip(plain, got):
        assert _cut(tokens_a, stop) == tokens_b
        assert np.allclose(logprobs_a[: len(tokens_b)], logprobs_b, atol=1e-5)
    assert got[2][0][-1] == stop and len(got[2][0]) <= 7
    decode_steps = [m for m in engine.metrics if m.kind == "decode"]
    assert len(decode_steps) < len([m for m in plain_engine.metrics if m.kind == "decode"]) / 2
    assert engine.scheduler.accepted_tokens == 0  # not a speculative round


def test_one_request_through_a_model():
    """One greedy request on the demo model: a round's tokens and logprobs are N = 1's."""
    from swajax.api import EngineSpec, generate, make_engine

    decoder = load_decoder(DEMO_DIR, dtype="float32")
    outputs = []
    for steps in (1, 4):
        setup = EngineSpec.of(
            kv_budget_gib=0.01, page_size=16, max_running=1, max_context=96, decode_steps=steps
        )
        engine = make_engine(decoder, setup)
        (req,), _ = generate(engine, [PROMPTS[1]], SamplingParams(temperature=0.0, max_tokens=10))
        outputs.append((req.output, req.logprobs, len(engine.metrics)))
        check_clean(engine)
    (tokens_a, logprobs_a, steps_a), (tokens_b, logprobs_b, steps_b) = outputs
    assert tokens_a == tokens_b and np.allclose(logprobs_a, logprobs_b, atol=1e-5)
    assert steps_b < steps_a / 2


def null_engine(steps, *, logprobs=0):
    cfg = load_preset("tiny-hybrid")
    sizes = sizing.solve_pool_sizes(cfg, 4000, ratio=0.5, page_size=16)
    options = EngineOptions(chunk_size=64, max_context=1000, decode_steps=steps)
    engine = engine_for(cfg, NullModel(), sizes, options)
    dispatch, engine.rounds = engine.runner.dispatch, []

    def seen(plan, *args, **kwargs):  # each round's N and its requests' steps
        if plan.round.lookahead:
            engine.rounds.append(
                (plan.round.lookahead + 1, (plan.seq_lens - plan.prefix_lens).tolist())
            )
        return dispatch(plan, *args, **kwargs)

    engine.runner.dispatch = seen
    rids = [
        engine.add_request(
            p * 3, SamplingParams(temperature=0.0, max_tokens=20 + 3 * i, logprobs=logprobs)
        )
        for i, p in enumerate(PROMPTS)
    ]
    engine.run()
    check_clean(engine)
    return [engine.requests[r].output for r in rids], engine


def test_the_null_model_runs_rounds_of_one_size():
    want, plain = null_engine(1)
    got, engine = null_engine(16)
    assert got == want and len(engine.metrics) < len(plain.metrics) / 2
    # One N for every round (one program per batch size), even as the longest request ends:
    # each request takes what it has left, up to N, and shorter ones sit out the round's end.
    assert {n for n, _ in engine.rounds} == {16}
    assert any(max(steps) < 16 for _, steps in engine.rounds)
    assert any(len(set(steps)) > 1 for _, steps in engine.rounds)
    assert all(max(steps) <= n for n, steps in engine.rounds)


def test_no_round_where_a_request_asks_what_a_round_does_not_return():
    _, engine = null_engine(8, logprobs=2)  # top-N logprobs: plain steps only
    assert engine.rounds == []


def test_bad_decode_steps_is_refused():
    with pytest.raises(RequestError, match="decode_steps must be an integer >= 1"):
        EngineOptions(decode_steps=0)


def test_a_round_that_does_not_fit_runs_as_one_step_not_a_retraction():
    """Pools a round of 16 would overflow where single steps fit: the step shrinks to one
    position per request, and nothing is retracted that N = 1 keeps running."""
    cfg = load_preset("tiny-hybrid")
    sizes = sizing.solve_pool_sizes(cfg, 2400, ratio=0.5, page_size=16)
    prompts = [[1 + (7 * i + j) % 90 for i in range(100)] for j in range(8)]
    runs = []
    for steps in (1, 16):  # (without the shrink, N = 16 retracts one request here)
        options = EngineOptions(max_context=480, decode_steps=steps, prefix_cache=False)
        engine = engine_for(cfg, NullModel(), sizes, options)
        rids = [
            engine.add_request(p, SamplingParams(temperature=0.0, max_tokens=200)) for p in prompts
        ]
        engine.run()
        check_clean(engine)
        runs.append(([engine.requests[r].output for r in rids], engine.scheduler.retractions))
    (plain, plain_retractions), (got, retractions) = runs
    assert got == plain and retractions == plain_retractions == 0


def test_rounds_resume_after_overlapped_plain_steps():
    """A request that asks for logprobs holds the batch to plain (overlapped) steps; once it
    ends, the next step is a round again, not another step planned ahead."""
    cfg = load_preset("tiny-hybrid")
    sizes = sizing.solve_pool_sizes(cfg, 4000, ratio=0.5, page_size=16)
    outputs = []
    for steps in (1, 8):
        options = EngineOptions(max_context=1000, decode_steps=steps)
        engine = engine_for(cfg, NullModel(overlap=True), sizes, options)
        rids = [
            engine.add_request(
                list(range(1, 30)), SamplingParams(temperature=0.0, max_tokens=10, logprobs=1)
            ),
            engine.add_request(list(range(1, 20)), SamplingParams(temperature=0.0, max_tokens=100)),
        ]
        engine.run()
        check_clean(engine)
        outputs.append([engine.requests[r].output for r in rids])
        assert engine.launched_ahead > 0  # the logprobs request's steps overlapped
    assert outputs[0] == outputs[1]
    late = [m.new_tokens for m in engine.metrics][-5:]  # the second request alone, at the end
    assert all(n > 1 for n in late[:-1])


def test_an_arrival_waits_at_most_the_round_in_flight():
    """A request added while rounds run (one launched ahead, overlapped) is admitted by the
    step after the round in flight: it waits at most N steps, as the README says."""
    cfg = load_preset("tiny-hybrid")
    sizes = sizing.solve_pool_sizes(cfg, 4000, ratio=0.5, page_size=16)
    options = EngineOptions(max_context=1000, decode_steps=8)
    engine = engine_for(cfg, NullModel(overlap=True), sizes, options)
    engine.add_request(list(range(1, 30)), SamplingParams(temperature=0.0, max_tokens=200))
    while engine.launched_ahead == 0:
        engine.step()
    assert engine._launched is not None and engine._launched.plan.round.lookahead == 7
    late = engine.requests[
        engine.add_request(list(range(1, 20)), SamplingParams(temperature=0.0, max_tokens=5))
    ]
    engine.step()  # reads the round in flight; plans nothing ahead while a request waits
    engine.step()
    assert late.output  # admitted and prefilled
