"""The run every multi-process test compares: two waves of requests through an engine with
tensor parallelism, eviction every step and a prefix hit, then every pool checked free. The same
function runs in one process (the references) and in each joined process (`worker.py`)."""

from __future__ import annotations

from swajax.api import LLM
from swajax.serving.sampling_params import SamplingParams

A = [5, 17, 99, 3, 42, 64, 8, 120, 33, 71, 2, 90, 15, 56, 101, 27, 88, 11, 60, 45]
B = [9, 4, 77, 31, 100, 6, 58, 23, 14, 87, 40, 2, 66, 19, 120, 35, 8, 51, 72]


def run(
    path: str, tensor_parallel: int | None, attention: str = "xla", hybrid_memory: bool = True
) -> dict:
    from helpers.engine_checks import check_clean

    llm = LLM(
        path,
        tensor_parallel_size=tensor_parallel,
        attention=attention,
        max_running_requests=4,
        max_model_len=64,
        chunked_prefill_size=8,
        eviction_interval=1,
        disable_hybrid_swa_memory=not hybrid_memory,
    )
    greedy = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    sampled = SamplingParams(max_tokens=6, temperature=1.0, seed=3, ignore_eos=True)
    first = llm.generate([A, B], greedy) + llm.generate([B], sampled)
    # A again, longer: its cached prefix is hit (with its window live) and extended.
    second = llm.generate([A + [7, 93, 44, 12, 5]], greedy)
    # More than the pools hold at once (two 64-token contexts): requests are retracted and
    # resumed. One more request is aborted after a few steps.
    engine = llm.engine
    doomed = engine.add_request(
        B[::-1], SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True)
    )
    for _ in range(3):
        engine.step()
    engine.abort(doomed)
    third = llm.generate(
        [A, B, A[::-1], B[3:]], SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    )
    check_clean(engine)  # every request ended; both pools free once the cache is flushed
    outs = first + second + third
    return dict(
        tokens=[o.outputs[0].token_ids for o in outs],
        logprobs=[o.outputs[0].token_logprobs for o in outs],
        cached=[o.num_cached_tokens for o in outs],
        aborted=engine.requests[doomed].finish_reason,
        retractions=llm.summary()["retractions"],
    )


def resume(path: str, tensor_parallel: int | None, folder: str, phase: str) -> dict:
    """A snapshot across processes: `phase` "save" runs requests part way, saves the engine to
    `folder` (every process its own shards), then finishes them; "restore" restores `folder`
    into a fresh engine (any number of processes and devices) and finishes them. Both return
    every request's tokens and logprobs."""
    from helpers.engine_checks import check_clean

    from swajax.api.state import restore_state, save_state

    llm = LLM(
        path,
        tensor_parallel_size=tensor_parallel,
        max_running_requests=4,
        max_model_len=64,
        chunked_prefill_size=8,
        eviction_interval=1,
    )
    engine = llm.engine
    if phase == "save":
        for prompt, seed in ((A, None), (B, 5), (A[::-1], None)):
            params = SamplingParams(temperature=0.8, seed=seed, max_tokens=12, ignore_eos=True)
            engine.add_request(prompt, params)
        for _ in range(9):
            engine.step()
        assert any(not r.done for r in engine.requests.values())
        save_state(engine, folder)
    else:
        restore_state(engine, folder)
    engine.run()
    out = dict(
        tokens=[r.output for r in engine.requests.values()],
        logprobs=[r.logprobs for r in engine.requests.values()],
    )
    check_clean(engine)
    return out
