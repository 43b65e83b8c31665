"""Exact SWA-tail rebuild: a prefix hit whose SWA tail was evicted resumes n W tokens before the
full match's end instead of at the fallback point, and computes exactly what a cold run does.

The oracle is the same model run with no prefix cache at all (every position computed from
scratch); the rebuild must match it to 1e-5 (float32) with identical greedy tokens, in every
family of the transformers fixtures (layer orders S/F, F/S, chunked, KV-shared, K=V).
"""

import jax
import numpy as np
import pytest
from helpers import FIXTURES
from helpers.engine_checks import check_clean
from hypothesis import given, settings, strategies as st

from swajax import sizing
from swajax.api import EngineSpec, engine_for, make_engine
from swajax.models import load_decoder
from swajax.prefix_cache import check_invariants
from swajax.presets import load_preset
from swajax.serving.null_model import NullModel
from swajax.serving.options import EngineOptions
from swajax.serving.request import Status
from swajax.serving.sampling_params import SamplingParams

SETUP = EngineSpec.of(
    kv_budget_gib=0.001, page_size=4, chunk_size=8, eviction_interval=1, max_context=256
)
FIRST = [(7 * i + 3) % 120 + 1 for i in range(96)]
SECOND = FIRST[:80] + [11, 45, 90, 2, 67, 31, 8, 100]
PARAMS = SamplingParams(temperature=0.0, max_tokens=6)


def _second(engine):
    rid = engine.add_request(SECOND, PARAMS, keep_logits=True)
    engine.run()
    req = engine.requests[rid]
    return req.output, np.stack(req.logits)


def tombstone_path(cache, tokens):
    """SWA-evict every node on the cached path of `tokens` (what SWA eviction does to internal
    nodes): the full KV stays, the window rule then cuts a match of the path to nothing."""
    for node in cache.walk(cache.aligned(tokens)):
        if node.swa_live and not node.is_leaf and node.swa_lock == 0:
            cache.evictor.tombstone(node)


def with_tombstoned_prefix(decoder, **changes):
    """SECOND after FIRST, whose first 80 tokens' SWA KV was evicted in between."""
    engine = make_engine(decoder, SETUP.replace(**changes))
    engine.add_request(FIRST, PARAMS)
    engine.run()
    tombstone_path(engine.cache, FIRST[:80])
    return engine, _second(engine)


# Default run: sinks + MoE, S first (gpt_oss); every other hybrid fixture (F first, chunked,
# K=V full layers and KV-shared layers in gemma4, ...) with -m slow.
DEFAULT = ("gpt_oss",)
HYBRID = (
    "cohere2",
    "exaone4",
    "gemma3",
    "gemma3_legacy",
    "gemma4",
    "gemma4_e",
    "gpt_oss_legacy",
    "gpt_oss_mxfp4",
    "llama4",
    "mimo_v2_flash",
    "mimo_v2_flash_fp8",
    "olmo3",
    "qwen2",
    "qwen3",
    "step3p7",
)
FAMILIES = [*DEFAULT, *(pytest.param(f, marks=pytest.mark.slow) for f in HYBRID)]


@pytest.mark.parametrize("family", FAMILIES)
def test_rebuild_equals_a_cold_run(family):
    jax.clear_caches()  # each family compiles its own programs; hundreds abort XLA's CPU compiler
    decoder = load_decoder(FIXTURES / family)
    engine, (tokens, logits) = with_tombstoned_prefix(decoder)
    sched = engine.scheduler
    assert sched.rebuilt_tokens > 0 and sched.rebuild_saved_tokens > 0  # it did rebuild
    cold_tokens, cold_logits = _second(make_engine(decoder, SETUP))  # an empty cache
    assert tokens == cold_tokens
    n = len(logits)  # the rebuild computed positions [s0, end) only
    err = np.max(np.abs(logits - cold_logits[-n:])) / np.max(np.abs(cold_logits))
    assert err <= 1e-5, f"{family}: relative logit difference {err:.2e}"
    check_invariants(engine.cache)


# ---------------------------------------------------------------------------------------------
# The memory side, on the null model (no attention math): locks, revival, interruptions, leaks.

CFG = load_preset("tiny-hybrid")  # S F S F, W = 7: reach 7, s0 = L - 16 for L = 80, ps = 4
A = list(range(1, 97))
B = A[:80] + list(range(500, 540))


def null_engine(**changes):
    options = dict(chunk_size=8, max_context=512, eviction_interval=1) | changes
    sizes = sizing.solve_pool_sizes(CFG, 2048, ratio=0.5, page_size=4)
    return engine_for(CFG, NullModel(), sizes, EngineOptions(**options))


def tombstoned(engine):
    """A cached, then the SWA KV of its first 80 tokens evicted (the path becomes tombstones)."""
    engine.add_request(A, SamplingParams(temperature=0.0, max_tokens=4))
    engine.run()
    tombstone_path(engine.cache, A[:80])
    return engine


def test_rebuild_resumes_at_s0_and_revives_the_window():
    engine = tombstoned(null_engine())
    rid = engine.add_request(B, SamplingParams(temperature=0.0, max_tokens=4))
    engine.step()
    req, sched = engine.requests[rid], engine.scheduler
    assert req.rebuild is not None and (req.rebuild.start, req.rebuild.end) == (64, 80)
    assert req.cache_protected_len == 64 and req.kv_len == 72  # one chunk of 8 from s0
    assert (sched.rebuilt_tokens, sched.rebuild_saved_tokens) == (16, 64)
    assert engine.cache.full_protected >= 80  # the node at L is locked: its full KV stays
    engine.step()  # the chunk that reaches L: the request frees its SWA below exact_from
    assert req.rebuild is None and req.swa_evicted_seqlen >= 72
    engine.run()
    check_invariants(engine.cache)
    # B's insert revived the tombstones before 80: a third request hits all of B's prefix.
    match = engine.cache.match(B + [7])
    assert len(match) >= 80 and match.tail_miss == 0
    check_clean(engine)


def test_no_tail_rebuild_falls_back():
    for options in (dict(tail_rebuild=False), dict(cache_policy="sglang-0.5.23")):
        engine = tombstoned(null_engine(**options))
        engine.add_request(B, SamplingParams(temperature=0.0, max_tokens=4))
        engine.run()
        assert engine.scheduler.rebuilt_tokens == 0 and engine.scheduler.tail_miss_tokens > 0
        check_clean(engine)


def test_outputs_do_not_depend_on_rebuild():
    outputs = []
    for on in (True, False):
        engine = tombstoned(null_engine(tail_rebuild=on))
        rid = engine.add_request(B, SamplingParams(temperature=0.0, max_tokens=8))
        engine.run()
        outputs.append(engine.requests[rid].output)
    assert outputs[0] == outputs[1]


@pytest.mark.parametrize("how", ["abort", "retract"])
def test_an_interrupted_rebuild_leaks_nothing(how):
    engine = tombstoned(null_engine())
    rid = engine.add_request(B, SamplingParams(temperature=0.0, max_tokens=4))
    engine.step()
    req = engine.requests[rid]
    assert req.rebuild is not None and req.kv_len < req.rebuild.end  # in the middle of it
    if how == "abort":
        engine.abort(rid)
    else:
        engine.scheduler.retract(req)
        assert req.rebuild is None
    engine.run()
    check_invariants(engine.cache)
    assert req.status is (Status.ABORTED if how == "abort" else Status.FINISHED)
    check_clean(engine)


@settings(max_examples=3, deadline=None)
@given(
    ps=st.sampled_from([1, 4, 8]),
    chunk=st.sampled_from([None, 8, 32]),
    ratio=st.sampled_from([0.25, 0.5]),
    seed=st.integers(0, 2**16),
)
def test_random_workloads_with_tombstoned_prefixes_stay_clean(ps, chunk, ratio, seed):
    """Shared long prefixes, SWA eviction and aborts at random moments: the tree invariants hold
    after every step and nothing leaks."""
    rng = np.random.default_rng(seed)
    sizes = sizing.solve_pool_sizes(CFG, 2048, ratio=ratio, page_size=ps)
    options = EngineOptions(chunk_size=max(chunk, ps) if chunk else None, max_context=512)
    engine = engine_for(CFG, NullModel(), sizes, options)
    systems = [rng.integers(0, 1000, 72).tolist() for _ in range(2)]
    for _ in range(10):
        prompt = (
            systems[rng.integers(2)][: rng.integers(24, 73)]
            + rng.integers(0, 1000, rng.integers(1, 40)).tolist()
        )
        engine.add_request(
            prompt, SamplingParams(temperature=0.0, max_tokens=int(rng.integers(1, 12)))
        )
    for _ in range(5000):
        if rng.random() < 0.3:
            engine.cache.evict(0, int(rng.integers(1, 64)))
        running = engine.scheduler.running
        if running and rng.random() < 0.05:
            engine.abort(running[int(rng.integers(len(running)))].rid)
        if engine.step() is None:
            break
        check_invariants(engine.cache)
    check_clean(engine)
