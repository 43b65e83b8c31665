"""A server's fixed step shapes (runner/step_shapes.py): the warm-up compiles every program a
mixed load reaches, nothing compiles after it, and the answers are the adaptive shapes' own."""

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from swajax.attention.metadata import metadata_shape
from swajax.demo import demo_decoder
from swajax.memory.compilations import compilation_count
from swajax.models import HybridLM
from swajax.runner import device_runner
from swajax.runner.step_shapes import FixedShapes
from swajax.serving.sampling_params import SamplingParams
from tests.helpers.engine_checks import check_clean

SHAPES = dict(min_reqs=4, max_running=16, max_context=512, max_logprobs=20)


def test_the_program_set_is_enumerated_and_bounded():
    fixed = FixedShapes(window=7, page_size=4, chunk_tokens=256, decode_steps=8, **SHAPES)
    assert fixed.row_sizes() == [4, 8, 16]
    assert fixed.token_sizes() == [64, 128, 256]
    assert fixed.page_sizes() == [64, 128]  # 256 tokens' worth at least, up to the context
    keys = list(fixed.keys())
    assert len(keys) == 3 * 2 * 2 + 3 * 2 * 2 + 3 * 2 == len(set(keys))  # (extends: most rows)
    # The set grows with the logarithm of each limit, not with anything a request chooses.
    longer = FixedShapes(
        window=7, page_size=4, chunk_tokens=256, decode_steps=8, **{**SHAPES, "max_context": 4096}
    )
    assert len(list(longer.keys())) == len(keys) // 2 * 5


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 500), st.integers(1, 64)), min_size=1, max_size=16),
    st.sampled_from([0, 7, 64, 100]),
    st.sampled_from([1, 4, 16]),
)
def test_a_fixed_shape_holds_every_batch_of_its_sizes(reqs, window, ps):
    """Any batch over at most r requests fits the fixed shape of its sizes (an extend of at
    most t tokens, a round of at most N positions each, a decode step): as many token rows,
    query blocks and SWA pages as its own shape needs, at least, and the same full pages."""
    pre = np.asarray([p for p, _ in reqs])
    ext = np.asarray([n for _, n in reqs])
    fixed = FixedShapes(window=window, chunk_tokens=1024, decode_steps=8, **SHAPES, page_size=ps)
    r = fixed.request_rows(len(reqs))
    for kind, seq in (
        ("extend", pre + ext),
        ("round", pre + np.minimum(ext, 8)),
        ("decode", pre + 1),
    ):
        f = metadata_shape(pre, seq, page_size=ps, window=window).full_pages
        if kind == "extend":
            got = fixed.extend(r, fixed.extend_tokens(int(np.sum(seq - pre))), f)
        else:
            got = fixed.round(r, f) if kind == "round" else fixed.decode(r, f)
        need = metadata_shape(pre, seq, page_size=ps, window=window, block_q=got.block_q)
        assert got.num_tokens >= need.num_tokens, kind
        assert got.num_blocks >= need.num_blocks, kind
        assert got.swa_pages >= need.swa_pages, kind
        assert got.full_pages == need.full_pages, kind


def _workload(engine, wave: int):
    """Requests of every sampling feature; the second wave hits the first's long prompt (more
    re-pointed entries than a step carries) and penalizes a long prompt (its counts load in
    several calls)."""
    rng = np.random.default_rng(wave)
    long = [int(x) for x in np.random.default_rng(7).integers(3, 200, 300)]
    plain = SamplingParams(temperature=0.0, max_tokens=12)
    requests = [
        (long + [5, 6], plain, False),
        (long[:40], SamplingParams(temperature=0.8, seed=3, top_p=0.9, max_tokens=20), False),
        (
            long[:200],
            SamplingParams(presence_penalty=0.7, repetition_penalty=1.3, max_tokens=9),
            False,
        ),
        (long[:30], SamplingParams(temperature=0.0, logprobs=5, max_tokens=7), False),
        (
            long[:25],
            SamplingParams(
                temperature=0.0, logit_bias={7: 5.0}, bad_words_token_ids=[[9]], max_tokens=6
            ),
            False,
        ),
        (long[:20], SamplingParams(temperature=0.0, max_tokens=3), True),  # kept logits (echo)
        (
            [int(x) for x in rng.integers(3, 200, 70)],
            SamplingParams(min_p=0.1, temperature=1.0, seed=5, max_tokens=30),
            False,
        ),
    ]
    ids = [engine.add_request(p, s, keep_logits=k, cache_hits=not k) for p, s, k in requests]
    engine.run()
    return [engine.requests[i] for i in ids]


@pytest.fixture(scope="module")
def model():
    return HybridLM(demo_decoder("float32"))


def test_a_warmed_up_engine_compiles_nothing_and_answers_as_the_adaptive_one(
    tiny_engine, model, monkeypatch
):
    monkeypatch.setattr(device_runner, "SEED_CHUNK", 64)
    calls = {"repoint": 0, "seed_only": 0}  # the programs a step's overflow goes through

    def counted(name):
        program = getattr(device_runner, name)

        def call(*args):
            calls[name] += 1
            return program(*args)

        monkeypatch.setattr(device_runner, name, call)

    for name in calls:
        counted(name)
    make = lambda warm: tiny_engine(  # noqa: E731
        full=4096, ps=4, chunk=64, model=model, max_context=512, max_running=4, warmup=warm
    )
    warm = make(True)
    ready, compiled = warm.warm_up()
    assert 0 < ready <= len(list(warm.runner.fixed.keys()))
    before = compilation_count()
    warm_out = [_workload(warm, wave) for wave in (0, 1)]
    assert compilation_count() == before  # every program the load reached was ready
    # The warm-up's one call each, then the overflows: a 300-token hit (more re-pointed entries
    # than a step's 256), a 200-token penalized prompt (counts in chunks of 64).
    assert calls["repoint"] >= 2 and calls["seed_only"] >= 1 + 4, calls
    adaptive = make(False)
    assert adaptive.warm_up() == (0, 0)
    for got, want in zip(warm_out, [_workload(adaptive, wave) for wave in (0, 1)]):
        for a, b in zip(got, want):
            assert a.output == b.output
            np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-4)
            assert [sorted(t or {}) for t in a.top_logprobs] == [
                sorted(t or {}) for t in b.top_logprobs
            ]
            assert len(a.logits) == len(b.logits)
            np.testing.assert_allclose(np.asarray(a.logits), np.asarray(b.logits), atol=1e-4)
    check_clean(warm)
    check_clean(adaptive)
    # A second engine of the same shapes finds every program made: nothing compiles.
    assert make(True).warm_up() == (ready, 0)
