"""Never stuck, never silent: every accepted request finishes or fails with a reason, whatever
the pools, and a step that raises loses nothing and stops no other request."""

import jax
import numpy as np
import pytest
from helpers.engine_checks import check_clean
from hypothesis import given, settings, strategies as st

from swajax import sizing
from swajax.api import engine_for, teacher_forced_logits
from swajax.errors import RequestError, RequestFailed
from swajax.prefix_cache.policy import PROFILES
from swajax.presets import load_preset
from swajax.serving.null_model import NullModel
from swajax.serving.options import EngineOptions
from swajax.serving.request import Status
from swajax.serving.sampling_params import SamplingParams

CFG = load_preset("tiny-hybrid")  # W = 7


PROPERTY = dict(
    full=st.sampled_from([64, 128, 256, 1024, 4096]),
    ratio=st.sampled_from([0.1, 0.25, 0.5, 1.0]),
    ps=st.sampled_from([1, 4, 16]),
    chunk=st.sampled_from([None, 16, 64]),
    interval=st.sampled_from([1, 16, 128]),
    prefix_cache=st.booleans(),
    seed=st.integers(0, 2**16),
)


@pytest.mark.parametrize("policy", sorted(PROFILES))  # every cache-policy profile
@settings(max_examples=2)
@given(**PROPERTY)
def test_every_request_finishes_or_fails_with_a_reason(policy, **kw):
    run_random_workload(policy=policy, **kw)


@pytest.mark.slow
@settings(max_examples=400)
@given(**PROPERTY, policy=st.sampled_from(sorted(PROFILES)))
def test_every_request_finishes_or_fails_with_a_reason_long(**kw):
    run_random_workload(**kw)


_RUNS = [0]


def run_random_workload(full, ratio, ps, chunk, interval, prefix_cache, seed, policy="swajax"):
    _RUNS[0] += 1
    if _RUNS[0] % 25 == 0:  # thousands of small programs in one process abort XLA's CPU compiler
        jax.clear_caches()
    try:
        sizes = sizing.solve_pool_sizes(CFG, full, ratio=ratio, page_size=ps)
    except sizing.SizingError:
        return  # an SWA pool below the admission floor is refused at sizing, with the numbers
    if chunk is not None and chunk < ps:
        chunk = ps
    options = EngineOptions(
        max_running=8,
        max_context=512,
        chunk_size=chunk,
        prefix_cache=prefix_cache,
        eviction_interval=interval,
        cache_policy=policy,
    )
    engine = engine_for(CFG, NullModel(), sizes, options)
    rng = np.random.default_rng(seed)
    system = rng.integers(0, 1000, 20).tolist()
    for _ in range(12):
        prompt = (system if rng.random() < 0.5 else []) + rng.integers(
            0, 1000, int(rng.integers(1, 120))
        ).tolist()
        try:
            engine.add_request(
                prompt, SamplingParams(temperature=0.0, max_tokens=int(rng.integers(1, 60)))
            )
        except RequestError as e:
            assert "cannot fit" in str(e) or "exceeds" in str(e)
    for _ in range(20_000):
        if engine.step() is None:
            break
    else:
        pytest.fail("the engine did not finish in 20,000 steps")
    check_clean(engine)
    for req in engine.requests.values():
        if req.status is Status.ABORTED:  # only memory, and the reason names the numbers
            assert req.finish_reason.startswith("out of memory") and any(
                c.isdigit() for c in req.finish_reason
            ), req.finish_reason
    # An SWA pool that holds a window lock, a window of decode and a chunk serves everything.
    w = CFG.sliding_window
    if sizes.swa_tokens >= 2 * (w + ps) + (chunk or 120) + ps:
        assert all(r.status is Status.FINISHED for r in engine.requests.values())


def test_issue_stall_cases_finish():
    """A tiny SWA pool with chunked prefill once parked every chunk and the run stopped with
    requests in flight and no reason given."""
    sizes = sizing.solve_pool_sizes(CFG, 2048, ratio=0.02, page_size=4)  # 40 SWA tokens
    engine = engine_for(CFG, NullModel(), sizes, EngineOptions(chunk_size=16))
    rids = [
        engine.add_request([7] * 100, SamplingParams(temperature=0.0, max_tokens=40))
        for _ in range(2)
    ]
    engine.run()
    assert [engine.requests[r].status for r in rids] == [Status.FINISHED] * 2
    assert all(len(engine.requests[r].output) == 40 for r in rids)
    check_clean(engine)


class Flaky(NullModel):
    """The null model, raising on given calls (transient) or on a poisoned token (persistent)."""

    def __init__(self, fail_calls=(), poison=None):
        super().__init__()
        self.calls, self.fail_calls, self.poison = 0, set(fail_calls), poison

    def forward_and_sample(self, pools, batch, meta, *, return_logits=False, **sampling):
        self.calls += 1
        if self.calls in self.fail_calls:
            raise RuntimeError(f"injected fault at call {self.calls}")
        if self.poison is not None and self.poison in batch.tokens.tolist():
            raise ValueError("poisoned batch")
        return super().forward_and_sample(pools, batch, meta, return_logits=return_logits)


def flaky_engine(model, **kw):
    sizes = sizing.solve_pool_sizes(CFG, 1024, ratio=0.5, page_size=4)
    return engine_for(CFG, model, sizes, EngineOptions(chunk_size=32, **kw))


@pytest.mark.parametrize("fail_at", [1, 3, 8, 12])
def test_a_transient_fault_loses_nothing(fail_at):
    clean = flaky_engine(Flaky())
    faulty = flaky_engine(Flaky(fail_calls=[fail_at]))
    outputs = []
    for engine in (clean, faulty):
        rng = np.random.default_rng(0)
        for _ in range(5):
            engine.add_request(
                rng.integers(1, 900, 40).tolist(), SamplingParams(temperature=0.0, max_tokens=12)
            )
        engine.run()
        check_clean(engine)
        outputs.append([r.output for r in engine.requests.values()])
    assert len(faulty.errors) == 1 and "injected fault" in str(faulty.errors[0])
    assert outputs[0] == outputs[1]  # retried requests draw the same tokens


def test_a_persistent_fault_fails_only_its_request():
    engine = flaky_engine(Flaky(poison=999))
    good = [
        engine.add_request([1, 2, 3, 4 + i] * 5, SamplingParams(temperature=0.0, max_tokens=10))
        for i in range(4)
    ]
    bad = engine.add_request([5, 999, 6] * 5, SamplingParams(temperature=0.0, max_tokens=10))
    engine.run()
    check_clean(engine)
    assert all(engine.requests[r].status is Status.FINISHED for r in good)
    assert engine.requests[bad].status is Status.ABORTED
    assert "poisoned batch" in engine.requests[bad].finish_reason


def test_bad_sampling_params_are_refused_with_the_limit():
    for kwargs, needle in [
        (dict(seed=-1), "seed"),
        (dict(seed=2**32), "seed"),
        (dict(seed=1.5), "seed"),
        (dict(max_tokens=0), "max_tokens"),
        (dict(top_p=0.0), "top_p"),
        (dict(temperature=float("nan")), "temperature"),
        (dict(stop_token_ids=("a",)), "stop_token_ids"),
    ]:
        with pytest.raises(RequestError, match=needle):
            SamplingParams(**kwargs)


class NanLogits(NullModel):
    """The null model, whose logits turn NaN for rows of one poisoned token."""

    def __init__(self, poison):
        super().__init__()
        self.poison = poison

    def forward_and_sample(self, pools, batch, meta, *, return_logits=False, **sampling):
        pools, pen, (tokens, logprobs, *rest) = super().forward_and_sample(pools, batch, meta)
        rows = batch.logit_index[batch.sample_index]
        bad = np.asarray(batch.tokens)[rows] == self.poison
        return pools, pen, (tokens, np.where(bad, np.nan, logprobs).astype(np.float32), *rest)


def test_nan_logits_fail_only_their_request_with_the_reason():
    engine = flaky_engine(NanLogits(poison=77))
    ok = engine.add_request([1, 2, 3], SamplingParams(temperature=0.0, max_tokens=5))
    bad = engine.add_request([4, 5, 77], SamplingParams(temperature=0.0, max_tokens=5))
    engine.run()
    assert engine.requests[ok].finish_reason == "length"
    assert engine.requests[bad].output == []
    assert "logits are NaN at position 3" in engine.requests[bad].finish_reason
    check_clean(engine)


def test_teacher_forced_logits_raise_the_requests_own_reason():
    """A request that fails inside its step ends without logits; the caller gets its reason
    (the step's error), not a symptom of the logits missing."""
    engine = flaky_engine(Flaky(poison=999))
    with pytest.raises(RequestFailed, match="poisoned batch") as info:
        teacher_forced_logits(engine, [5, 999, 6] * 5)
    assert "15-token prompt" in str(info.value) and "error: ValueError" in str(info.value)
    check_clean(engine)
