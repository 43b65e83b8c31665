"""Deterministic mode: a request's logits are the same bits (KL = 0) whichever path its prefix
took — a cold prefill, a device prefix hit, an exact tail rebuild, a host-tier load, a resume
after retraction — at any chunk size, page size and multi-step setting, alone or batched with
others. Three families: gpt-oss (sinks, MoE, S/F layers), Gemma 3 (F after five S, q/k norms)
and Llama 4 (chunked attention, NoPE layers, top-1 MoE); bfloat16 weights and pools (the demo
model); tensor parallel over two devices. The negative control: one value of a reused page
changed is seen."""

import dataclasses

import numpy as np
import pytest
from helpers import FIXTURES, turns
from helpers.engine_checks import check_clean
from helpers.turns import FIRST, OTHER, PARAMS, SECOND, SHARED

from swajax.api import make_engine
from swajax.errors import InputError
from swajax.models import load_decoder
from swajax.serving.sampling_params import SamplingParams

SETUP = turns.SETUP.replace(deterministic=True)
COMPANIONS = [[(5 * i + j) % 110 + 2 for i in range(n)] for j, n in ((1, 3), (2, 40), (3, 95))]
FAMILIES = ["gpt_oss", pytest.param("gemma3", marks=pytest.mark.slow)]
FAMILIES += [pytest.param("llama4", marks=pytest.mark.slow)]


def _add(engine, prompt):
    return engine.add_request(prompt, PARAMS, keep_logits=True)


def _result(engine, rid):
    """(tokens, logits of the last prompt position and of every decode step, cached tokens)."""
    req = engine.requests[rid]
    return req.output, np.stack(req.logits)[-PARAMS.max_tokens :], req.cached_tokens


def _run(engine, prompt):
    rid = _add(engine, prompt)
    engine.run()
    return _result(engine, rid)


def kl(p_logits, q_logits) -> float:
    """KL(p || q) of the two rows' softmaxes, summed over rows (float64)."""

    def log_softmax(x):
        x = np.asarray(x, np.float64)
        x = x - x.max(axis=-1, keepdims=True)
        return x - np.log(np.sum(np.exp(x), axis=-1, keepdims=True))

    lp, lq = log_softmax(p_logits), log_softmax(q_logits)
    return float(np.sum(np.exp(lp) * (lp - lq)))


def same_bits(got, cold):
    tokens, logits, _ = got
    assert tokens == cold[0]
    assert kl(cold[1], logits) == 0.0
    assert np.array_equal(logits, cold[1])  # bit for bit, not only KL = 0


@pytest.fixture(scope="module", params=FAMILIES)
def family(request):
    decoder = load_decoder(FIXTURES / request.param)
    return decoder, _run(make_engine(decoder, SETUP), SECOND)


def test_the_same_model_as_the_default_mode(family):
    """Only the order of additions changed: within float32 rounding of the default mode."""
    decoder, cold = family
    tokens, logits, _ = _run(make_engine(decoder, SETUP.replace(deterministic=False)), SECOND)
    assert tokens == cold[0]
    np.testing.assert_allclose(cold[1], logits, atol=1e-5 * np.abs(logits).max(), rtol=0)


def test_refused_where_it_cannot_hold(family):
    decoder, _ = family
    with pytest.raises(InputError, match="attention 'pallas' cannot run deterministic"):
        make_engine(decoder, SETUP.replace(attention="pallas"))


def test_refused_for_deepseek_v4():
    with pytest.raises(InputError, match="not built for deepseek_v4"):
        make_engine(load_decoder(FIXTURES / "deepseek_v4"), SETUP)


@pytest.mark.slow  # page size 1 and chunks of 64 run by default (test_batch_companions)
def test_other_page_and_chunk_sizes_and_multi_step(family):
    decoder, cold = family
    for changes in (dict(page_size=16, chunk_size=32), dict(page_size=1, chunk_size=64)):
        same_bits(_run(make_engine(decoder, SETUP.replace(**changes)), SECOND), cold)
    same_bits(_run(make_engine(decoder, SETUP.replace(decode_steps=4)), SECOND), cold)


def test_batch_companions(family):
    """Prefilled and decoded beside three requests of other lengths (one prefilling while it
    decodes), with overlap scheduling on, page size 1 and chunks of 64."""
    decoder, cold = family
    engine = make_engine(decoder, SETUP.replace(page_size=1, chunk_size=64, overlap=True))
    rid = _add(engine, SECOND)
    for prompt in COMPANIONS:
        engine.add_request(prompt, SamplingParams(temperature=0.0, max_tokens=9))
    engine.run()
    same_bits(_result(engine, rid), cold)
    check_clean(engine)


def test_a_device_prefix_hit(family):
    decoder, cold = family
    engine = make_engine(decoder, SETUP)
    _run(engine, FIRST)
    _run(engine, OTHER)  # SHARED now ends at a branch point: a hit ends there
    got = _run(engine, SECOND)
    assert got[2] == len(SHARED)
    same_bits(got, cold)


def test_an_exact_tail_rebuild(family):
    """SHARED's window tombstoned: the hit rebuilds the tail from n W tokens back."""
    decoder, cold = family
    engine = make_engine(decoder, SETUP)
    _run(engine, FIRST)
    for node in engine.cache.walk(engine.cache.aligned(SHARED)):
        if node.swa_live and not node.is_leaf and node.swa_lock == 0:
            engine.cache.evictor.tombstone(node)
    got = _run(engine, SECOND)
    if decoder.spec.family != "llama4":  # a chunk needs its whole chunk: no rebuild pays
        assert engine.scheduler.rebuilt_tokens > 0
    same_bits(got, cold)


def test_a_host_tier_load(family):
    decoder, cold = family
    engine = make_engine(decoder, SETUP.replace(host_cache_gib=0.001))
    _run(engine, FIRST)
    _run(engine, OTHER)
    engine.cache.evict(10**9, 10**9)  # the full KV and the windows to the host
    got = _run(engine, SECOND)
    assert engine.cache.tier.loaded[0] > 0 and got[2] == len(SHARED)
    same_bits(got, cold)


def test_a_resume_after_retraction(family):
    decoder, cold = family
    engine = make_engine(decoder, SETUP)
    rid = _add(engine, SECOND)
    req = engine.requests[rid]
    while len(req.output) < 3:
        engine.step()
    engine.scheduler.retract(req)
    engine.run()
    assert req.retractions == 1
    same_bits(_result(engine, rid), cold)
    check_clean(engine)


def test_a_changed_reused_value_is_seen(family):
    """The negative control: the device hit with one number of the shared prefix's KV (a
    value of the first full layer at position 40) nudged by one part in 10,000 differs from
    the cold run."""
    decoder, cold = family
    engine = make_engine(decoder, SETUP)
    _run(engine, FIRST)
    _run(engine, OTHER)
    engine.flush()
    slot = next(
        int(node.value[40 - start])
        for node, start in _spans(engine.cache, SHARED)
        if start <= 40 < start + len(node.key)
    )
    pools = engine.runner.pools
    nudged = pools.full_v.at[0, slot, 0].multiply(1 + 1e-4)  # head 0's first dim
    engine.runner.pools = dataclasses.replace(pools, full_v=nudged)
    got = _run(engine, SECOND)
    assert got[2] == len(SHARED)
    assert not np.array_equal(got[1], cold[1]) and kl(cold[1], got[1]) != 0


def _spans(cache, tokens):
    """(node, its first position) along the cached path of `tokens`."""
    start = 0
    for node in cache.walk(cache.aligned(tokens)):
        yield node, start
        start += len(node.key)


def test_the_llm_takes_it_by_its_name_and_sglangs():
    import swajax
    from swajax.api.llm import engine_settings

    assert engine_settings({"deterministic": True}) == {"deterministic": True}
    llm = swajax.LLM(
        str(FIXTURES / "gpt_oss"), max_model_len=256, enable_deterministic_inference=True
    )
    assert llm.engine.model.forward.mode.deterministic


@pytest.mark.slow
def test_tensor_parallel_over_two_devices():
    """Split over KV heads (attention per device inside shard_map, the products' sums across
    devices): a hit and a batch with companions give the cold run's bits there too."""
    decoder = load_decoder(FIXTURES / "gpt_oss")
    spec = SETUP.replace(tensor_parallel=2)
    cold = _run(make_engine(decoder, spec), SECOND)
    engine = make_engine(decoder, spec.replace(page_size=1, chunk_size=64))
    _run(engine, FIRST)
    _run(engine, OTHER)
    rid = _add(engine, SECOND)
    engine.add_request(COMPANIONS[1], SamplingParams(temperature=0.0, max_tokens=9))
    engine.run()
    got = _result(engine, rid)
    assert got[2] == len(SHARED)
    same_bits(got, cold)


@pytest.mark.slow
def test_bfloat16_weights_and_pools():
    """The demo model as shipped (bfloat16): a hit beside a companion, page size 1, chunks of
    64, gives the cold run's bits."""
    from swajax.demo import demo_decoder

    decoder = demo_decoder()
    assert decoder.spec.dtype == "bfloat16"
    prompt = [(3 * i + 1) % 250 + 3 for i in range(90)]
    cold = _run(make_engine(decoder, SETUP), prompt)
    engine = make_engine(decoder, SETUP.replace(page_size=1, chunk_size=64))
    _run(engine, prompt[:70] + [9, 9, 9, 9])
    rid = _add(engine, prompt)
    engine.add_request(prompt[:20], SamplingParams(temperature=0.0, max_tokens=9))
    engine.run()
    got = _result(engine, rid)
    assert got[2] >= 64
    same_bits(got, cold)
