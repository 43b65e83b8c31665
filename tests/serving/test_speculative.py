"""Speculative decoding: greedy verification yields exactly plain greedy decoding's tokens
whatever the draft proposes, and the k + 1 positions a round takes in both pools come back.

The oracle is the same engine without a draft. Drafts: the target itself (every proposal is
accepted), the target with its output head rotated by one token (no proposal is ever accepted),
and another family's fixture with the same vocabulary (some are).
"""

import jax.numpy as jnp
import numpy as np
import pytest
from helpers import FIXTURES
from helpers.engine_checks import check_clean, check_replays
from hypothesis import given, settings, strategies as st

from swajax import sizing
from swajax.api import engine_for
from swajax.errors import RequestError
from swajax.models import load_decoder
from swajax.models.decoder import HybridLM
from swajax.presets import load_preset
from swajax.serving.null_model import NullModel
from swajax.serving.options import EngineOptions
from swajax.serving.request import Status
from swajax.serving.sampling_params import SamplingParams
from swajax.trace.recorder import Tracer

PROMPTS = [[(5 * i + 3 * j) % 120 + 1 for i in range(18 + 9 * j)] for j in range(3)]
PARAMS = SamplingParams(temperature=0.0, max_tokens=14)


@pytest.fixture(scope="module")
def target():
    return load_decoder(FIXTURES / "gpt_oss")  # S F S F, W = 5: smaller than k + page size


def run(decoder, k=0, draft=None, *, page_size=4, prefix_cache=True, trace=None):
    """`trace`: a path to record the run's allocator and cache calls to (then replayed)."""
    cfg = decoder.spec.hybrid
    sizes = sizing.size_hybrid(
        cfg,
        sizing.gib_to_bytes(0.002),
        ratio=0.5,
        page_size=page_size,
        dtype="fp32",
        draft=draft.spec.hybrid if draft is not None else None,
    )
    options = EngineOptions(
        chunk_size=16,
        eviction_interval=1,
        max_context=256,
        num_speculative_tokens=k,
        prefix_cache=prefix_cache,
    )
    draft_lm = HybridLM(draft, dtype="fp32") if draft is not None else None
    engine = engine_for(cfg, HybridLM(decoder, dtype="fp32"), sizes, options, draft=draft_lm)
    tracer = Tracer(engine) if trace is not None else None
    rids = [engine.add_request(p, PARAMS) for p in PROMPTS]
    engine.add_request(PROMPTS[2][:25] + [9, 9], PARAMS)  # a prefix hit, drafted too
    rids.append(max(engine.requests))
    engine.run()
    outputs = [engine.requests[r].output for r in rids]
    if tracer is not None:  # a round's k + 1 positions and its rejected pages, as they went
        check_replays(tracer, trace)
    check_clean(engine)  # no page of a rejected token is left behind
    return outputs, engine


@pytest.fixture(scope="module")
def plain(target):
    return run(target)[0]


def rotated(decoder):
    """The decoder with its output head shifted by one token: its argmax is never the
    target's, so a draft built from it is always wrong."""
    decoder = load_decoder(FIXTURES / "gpt_oss")
    head = decoder.lm_head.weight  # [V, H]
    head[...] = jnp.roll(head[...], 1, axis=0)
    return decoder


@pytest.mark.parametrize(
    "k", [pytest.param(1, marks=pytest.mark.slow), 3, pytest.param(5, marks=pytest.mark.slow)]
)
def test_the_target_as_its_own_draft_accepts_everything(target, plain, k, tmp_path):
    outputs, engine = run(target, k, target, trace=tmp_path / "t.jsonl")
    assert outputs == plain
    rounds = sum(1 for m in engine.metrics if m.kind == "decode")
    assert engine.scheduler.accepted_tokens >= (rounds - 2 * len(PROMPTS)) * k  # all but the ends


@pytest.mark.slow  # the MTP engine tests' random drafts are rejected too, traces replayed
def test_an_always_wrong_draft_changes_nothing(target, plain, tmp_path):
    outputs, engine = run(
        target, 3, rotated(target), trace=tmp_path / "t.jsonl"
    )  # W = 5 < k + page size = 7
    assert outputs == plain and engine.scheduler.accepted_tokens == 0


@pytest.mark.slow
def test_another_family_as_draft(target, plain):
    outputs, _ = run(target, 3, load_decoder(FIXTURES / "qwen3"))
    assert outputs == plain


def test_bad_speculative_setups_are_refused(target):
    cfg = target.spec.hybrid
    sizes = sizing.size_hybrid(
        cfg, sizing.gib_to_bytes(0.002), ratio=0.5, page_size=4, dtype="fp32"
    )
    model = HybridLM(target, dtype="fp32")
    with pytest.raises(ValueError, match="needs a draft model"):
        engine_for(cfg, model, sizes, EngineOptions(num_speculative_tokens=2))
    with pytest.raises(ValueError, match="num_speculative_tokens must be an integer >= 0"):
        EngineOptions(num_speculative_tokens=-1)
    engine = engine_for(cfg, model, sizes, EngineOptions(num_speculative_tokens=2), draft=model)
    with pytest.raises(RequestError, match=r"\+ 2 speculative positions = 4097 exceeds"):
        engine.add_request([1, 2, 3], SamplingParams(temperature=0.0, max_tokens=4092))
    assert not engine.requests  # refused: nothing queued, the engine serves the others


# ---------------------------------------------------------------------------------------------
# The memory side on the null model: its emulated draft accepts each token with a set chance.

CFG = load_preset("tiny-hybrid")


def null_engine(k, acceptance, *, ps=4, full=2048, ratio=0.5, chunk=16, prefix_cache=True):
    sizes = sizing.solve_pool_sizes(CFG, full, ratio=ratio, page_size=ps)
    options = EngineOptions(
        chunk_size=chunk,
        max_context=512,
        num_speculative_tokens=k,
        prefix_cache=prefix_cache,
        eviction_interval=1,
    )
    return engine_for(CFG, NullModel(acceptance=acceptance), sizes, options)


def test_rejected_positions_go_back_after_every_round():
    """Page size 1, no prefix cache, nothing accepted: after each round every running request
    holds exactly its kept positions in the full pool (the k rejected ones went back)."""
    engine = null_engine(4, 0.0, ps=1, prefix_cache=False)
    for p in PROMPTS:
        engine.add_request(p, SamplingParams(temperature=0.0, max_tokens=20))
    while engine.step() is not None:
        full, _ = engine.ledger.available()
        held = sum(r.kv_len for r in engine.scheduler.running)
        assert engine.ledger.primary_pages - full == held
    check_clean(engine)


@settings(max_examples=5, deadline=None)
@given(
    k=st.sampled_from([1, 3, 5]),
    acceptance=st.sampled_from([0.0, 0.5, 1.0]),
    ps=st.sampled_from([1, 4, 16]),
    full=st.sampled_from([256, 1024]),
    seed=st.integers(0, 2**16),
)
def test_speculation_never_changes_outputs_or_leaks(k, acceptance, ps, full, seed):
    """Random workloads (tight pools: retraction in the mix): the outputs equal plain
    decoding's, every request ends, both pools come back whole."""
    rng = np.random.default_rng(seed)
    prompts = [rng.integers(0, 1000, int(rng.integers(1, 90))).tolist() for _ in range(8)]
    lengths = [int(rng.integers(1, 40)) for _ in prompts]
    results = []
    for spec in (0, k):
        try:
            engine = null_engine(spec, acceptance, ps=ps, full=full)
        except sizing.SizingError:
            return
        rids = []
        for p, n in zip(prompts, lengths):
            try:
                rids.append(engine.add_request(p, SamplingParams(temperature=0.0, max_tokens=n)))
            except RequestError:
                rids.append(None)
        engine.run()
        results.append([engine.requests[r].output if r is not None else None for r in rids])
        finished = [engine.requests[r] for r in rids if r is not None]
        assert all(r.status is Status.FINISHED for r in finished)
        check_clean(engine)
    assert results[0] == results[1]


def test_a_round_stops_at_the_length_limit_and_stop_tokens():
    engine = null_engine(5, 1.0)
    rid = engine.add_request(list(range(1, 30)), SamplingParams(temperature=0.0, max_tokens=7))
    engine.run()
    plain = null_engine(0, 1.0)
    ref = plain.add_request(list(range(1, 30)), SamplingParams(temperature=0.0, max_tokens=40))
    plain.run()
    assert engine.requests[rid].output == plain.requests[ref].output[:7]
    stop = plain.requests[ref].output[9]
    engine = null_engine(5, 1.0)
    rid = engine.add_request(
        list(range(1, 30)), SamplingParams(temperature=0.0, max_tokens=40, stop_token_ids=(stop,))
    )
    engine.run()
    out = engine.requests[rid].output
    assert out == plain.requests[ref].output[: out.index(stop) + 1]
    check_clean(engine)
