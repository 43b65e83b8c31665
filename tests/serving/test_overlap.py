"""Overlap scheduling: planning step n + 1 while step n runs changes no token and no logprob,
and never frees a slot a launched step still reads.

The oracle is the same engine with overlap off. The mix: chunked prefill, prefix hits, a stop
token (a request ends while the next step, planned ahead, already includes it), an abort
between steps, and pools tight enough to retract.
"""

import json

import numpy as np
import pytest
from helpers import FIXTURES
from helpers.engine_checks import check_clean, check_replays

from swajax import sizing
from swajax.api import engine_for
from swajax.models import load_decoder
from swajax.models.decoder import HybridLM
from swajax.serving.options import EngineOptions
from swajax.serving.sampling_params import SamplingParams
from swajax.trace.recorder import Tracer

PROMPTS = [[(5 * i + 7 * j) % 120 + 1 for i in range(12 + 11 * j)] for j in range(5)]
PROMPTS.append(PROMPTS[3][:30] + [4, 5, 6])  # a prefix hit


def overlap_engine(decoder, overlap, *, gib=0.002, steps=1):
    """Plain steps unless `steps` (multi-step decode's N: rounds planned ahead of rounds)."""
    cfg = decoder.spec.hybrid
    sizes = sizing.size_hybrid(cfg, sizing.gib_to_bytes(gib), ratio=0.5, page_size=4, dtype="fp32")
    options = EngineOptions(
        chunk_size=16, eviction_interval=1, max_context=256, overlap=overlap, decode_steps=steps
    )
    return engine_for(cfg, HybridLM(decoder, dtype="fp32"), sizes, options)


def run(decoder, overlap, stop, *, gib=0.002, abort_at=6, check=None, trace=None, steps=1):
    """`trace`: a path to record the run's allocator and cache calls to (then replayed)."""
    engine = overlap_engine(decoder, overlap, gib=gib, steps=steps)
    if check is not None:
        engine.instrument = check(engine)
    tracer = Tracer(engine) if trace is not None else None
    rids = [
        engine.add_request(
            p, SamplingParams(temperature=0.0, max_tokens=10 + 2 * i, stop_token_ids=stop)
        )
        for i, p in enumerate(PROMPTS)
    ]
    steps = 0
    while not engine.idle:
        engine.step()
        steps += 1
        if steps == abort_at:
            engine.abort(rids[4])  # between steps: with overlap, a launched step holds it
    engine.flush()
    if tracer is not None:
        check_replays(tracer, trace)
    check_clean(engine)
    outs = [(engine.requests[r].output, engine.requests[r].logprobs) for r in rids]
    return outs, engine


def header(path) -> dict:
    with open(path) as f:
        return json.loads(f.readline())


@pytest.fixture(scope="module")
def decoder():
    return load_decoder(FIXTURES / "gpt_oss")  # MoE: tokens routed together, sinks


@pytest.fixture(scope="module")
def stop(decoder):
    """A token some request samples mid-way, so it ends while a step planned ahead holds it."""
    outs, _ = run(decoder, False, ())
    return (outs[2][0][4],)


def test_overlap_changes_no_token_and_no_logprob(decoder, stop, tmp_path):
    plain, plain_engine = run(decoder, False, stop)
    overlapped, engine = run(decoder, True, stop, trace=tmp_path / "overlap.jsonl")
    assert engine.launched_ahead > 0 and engine.scheduler.dropped_tokens > 0
    # Recorded with steps launched ahead, the allocations sit where the device made them.
    assert header(tmp_path / "overlap.jsonl")["ran"]["launched_ahead"] == engine.launched_ahead
    assert plain_engine.launched_ahead == 0
    for (tokens_a, logprobs_a), (tokens_b, logprobs_b) in zip(plain, overlapped):
        assert tokens_a == tokens_b
        assert np.array_equal(logprobs_a, logprobs_b)  # bit for bit: the same programs


def test_rounds_planned_ahead_change_no_token(decoder, stop, tmp_path):
    """Multi-step rounds (N = 4) launched while the round before runs: the tokens of plain
    steps, a stop inside a round drops the round already launched after it, the recorded
    trace replays, and no launched round reads a slot released before it."""
    plain, _ = run(decoder, False, stop)
    rounds, engine = run(decoder, True, stop, steps=4, trace=tmp_path / "rounds.jsonl")
    assert engine.launched_ahead > 0 and engine.scheduler.dropped_tokens > 0
    assert any(m.new_tokens > m.batch_size for m in engine.metrics if m.kind == "decode")
    for (tokens_a, logprobs_a), (tokens_b, logprobs_b) in zip(plain, rounds):
        assert tokens_a == tokens_b
        assert np.allclose(logprobs_a, logprobs_b, atol=1e-5)
    _, checked = run(decoder, True, stop, steps=4, check=ReadAfterFree)
    assert checked.launched_ahead > 0 and checked.instrument.violations == []
    assert not checked.errors


def test_overlap_with_retraction(decoder):
    """Pools too small for four long generations: one is retracted and recomputed."""
    results = []
    for overlap in (False, True):
        engine = overlap_engine(decoder, overlap, gib=0.00015)
        rids = [
            engine.add_request(
                [(3 * i + j) % 100 + 1 for i in range(8)],
                SamplingParams(temperature=0.0, max_tokens=60),
            )
            for j in range(4)
        ]
        engine.run()
        assert engine.scheduler.retractions > 0
        results.append([(engine.requests[r].output, engine.requests[r].logprobs) for r in rids])
        check_clean(engine)
    assert engine.launched_ahead > 0
    assert results[0] == results[1]


class ReadAfterFree:
    """Instruments an engine: records, per launched program, the slots it reads (every
    position of its requests for full layers, their windows for SWA layers) and, per host
    release, the program that applies it (the next one launched). A program that reads a slot
    whose last event is a release applied at or before it is a violation (recorded, since the
    engine turns anything a launch raises into a failed step)."""

    def __init__(self, engine):
        self.engine, self.launched, self.violations = engine, 0, []
        self.full_event, self.swa_event = {}, {}  # slot -> ("alloc" | "free", program)
        runner, ledger = engine.runner, engine.ledger
        dispatch, free, free_swa = runner.dispatch, ledger.free, ledger.free_swa
        allocated = ledger.allocated
        window = engine.window

        def on_dispatch(plan, after=None):
            i = self.launched
            for req, pre in zip(plan.requests, plan.prefix_lens):
                known = req.slots  # what the host knows; newer slots were never released
                self._check(known, self.full_event, i, "full")
                self._check(known[max(0, int(pre) - window) :], self.swa_event, i, "SWA")
            self.launched += 1
            return dispatch(plan, after)

        def on_free(slots):
            self._mark(slots, "free", self.full_event, self.swa_event)
            return free(slots)

        def on_free_swa(slots):
            self._mark(slots, "free", self.swa_event)
            return free_swa(slots)

        def on_allocated(slots):
            self._mark(slots, "alloc", self.full_event, self.swa_event)
            return allocated(slots)

        runner.dispatch, ledger.free, ledger.free_swa = on_dispatch, on_free, on_free_swa
        ledger.allocated = on_allocated

    def _mark(self, slots, kind, *events):
        for s in np.asarray(slots).reshape(-1).tolist():
            for ev in events:  # a release applies with the next program launched
                ev[s] = (kind, self.launched)

    def _check(self, slots, events, program, pool):
        for s in np.asarray(slots).tolist():
            kind, at = events.get(s, ("alloc", -1))
            if kind == "free" and at <= program:
                self.violations.append(f"program {program} reads {pool} slot {s}, released by {at}")


def test_no_launched_step_reads_a_released_slot(decoder, stop):
    _, engine = run(decoder, True, stop, check=ReadAfterFree)
    assert engine.launched_ahead > 0 and engine.instrument.launched > 20
    assert engine.instrument.violations == []
    assert not engine.errors


def test_the_instrument_catches_a_premature_release(decoder):
    engine = overlap_engine(decoder, True)
    instrument = ReadAfterFree(engine)
    engine.add_request(PROMPTS[1], SamplingParams(temperature=0.0, max_tokens=8))
    engine.step()
    req = engine.scheduler.running[0]
    engine.ledger.free_swa(req.slots[-1:])  # a bug: the next step still reads this slot
    engine.step()
    assert instrument.violations and "released by 1" in instrument.violations[0]


def _run_with_faulty_collect(decoder, should_fail, trace=None):
    """The overlapped engine, where reading a launched step's result raises when
    `should_fail(engine, plan)` says so (the step itself ran on the device). `trace`: a path
    to record to; the rolled-back steps' allocations are not in it, and it replays."""
    engine = overlap_engine(decoder, True)
    tracer = Tracer(engine) if trace is not None else None
    collect, seen = engine.runner.collect, []

    def faulty(step):
        if should_fail(engine, step.plan):
            seen.append(engine._launched is not None)  # a later step already launched
            raise RuntimeError("injected read failure")
        return collect(step)

    engine.runner.collect = faulty
    rids = [
        engine.add_request(p, SamplingParams(temperature=0.0, max_tokens=10 + 2 * i))
        for i, p in enumerate(PROMPTS)
    ]
    engine.run()
    if tracer is not None:
        check_replays(tracer, trace)
    check_clean(engine)  # nothing leaked on the host or the device
    return engine, rids, seen


def test_a_transient_read_failure_loses_nothing(decoder, tmp_path):
    clean, _ = run(decoder, True, (), abort_at=-1)
    for ahead in (True, False):  # with a step launched after it, and on the plain path
        fired = []

        def once(engine, plan, ahead=ahead, fired=fired):
            ready = engine._launched is not None if ahead else len(engine.metrics) == 1
            if fired or not ready:
                return False
            fired.append(True)
            return True

        trace = tmp_path / f"{ahead}.jsonl"
        engine, rids, seen = _run_with_faulty_collect(decoder, once, trace)
        assert seen == [ahead] and len(engine.errors) == 1
        got = [(engine.requests[r].output, engine.requests[r].logprobs) for r in rids]
        for (tokens_a, logprobs_a), (tokens_b, logprobs_b) in zip(clean, got):
            assert tokens_a == tokens_b
            assert np.allclose(logprobs_a, logprobs_b, atol=1e-5)


def test_a_persistent_read_failure_fails_only_its_request(decoder):
    clean, _ = run(decoder, True, (), abort_at=-1)
    poisoned = []

    def decoding_request_2(engine, plan):
        if not poisoned:
            poisoned.append(min(engine.requests))  # the first request's id (ids start there)
        mine = any(r.rid == poisoned[0] + 2 for r in plan.requests)
        return mine and plan.kind.value == "decode"

    engine, rids, seen = _run_with_faulty_collect(decoder, decoding_request_2)
    assert seen[0], "the first failure should hit a decode step with another launched after it"
    for i, rid in enumerate(rids):
        req = engine.requests[rid]
        if i == 2:
            assert req.status.value == "aborted"
            assert "injected read failure" in req.finish_reason
        else:
            assert req.finish_reason == "length" and req.output == clean[i][0]
